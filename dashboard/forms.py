from django import forms
from django.contrib.auth import get_user_model

from dashboard.roles import ROLES


class AccountCreateForm(forms.Form):
    username = forms.RegexField(
        regex=r"^[A-Za-z0-9_.@+-]{1,150}$",
        error_messages={"invalid": "Use letters, digits and . @ + - _ only (at most 150)."},
    )
    email = forms.EmailField(required=False)
    role = forms.ChoiceField(choices=ROLES, initial="viewer")

    def clean_username(self):
        username = self.cleaned_data["username"]
        if get_user_model().objects.filter(username__iexact=username).exists():
            raise forms.ValidationError(f"A user named {username!r} already exists.")
        return username


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=ROLES)
