from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm
from django.utils.translation import gettext_lazy as _

from dashboard import signin
from dashboard.roles import ROLES


class AccountCreateForm(forms.Form):
    username = forms.RegexField(
        regex=r"^[A-Za-z0-9_.@+-]{1,150}$",
        label=_("Username"),
        error_messages={"invalid": _("Use letters, digits and . @ + - _ only (at most 150).")},
    )
    email = forms.EmailField(required=False, label=_("Email (optional)"))
    role = forms.ChoiceField(choices=ROLES, initial="viewer", label=_("Role"))

    def clean_username(self):
        username = self.cleaned_data["username"]
        if get_user_model().objects.filter(username__iexact=username).exists():
            raise forms.ValidationError(_("A user named “%(name)s” already exists.") % {"name": username})
        return username


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=ROLES)


class SignInForm(AuthenticationForm):
    """Django's sign-in form behind the throttle of dashboard.signin: while an
    account or an address is cooling off, no password is checked at all."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "throttled_account": _("Too many failed sign-ins for this account. Try again in %(seconds)s s."),
        "throttled_address": _("Too many failed sign-ins from your address. Try again in %(seconds)s s."),
    }

    retry_after = None  # seconds, when the throttle refused this sign-in

    def clean(self):
        username = self.cleaned_data.get("username")
        if username is not None:
            throttle = signin.throttled(username, signin.client_address(self.request))
            if throttle:
                # No password was checked, and nothing is recorded: the failures that
                # reached the limit are in the audit trail, and a flood of refused
                # attempts must not become a flood of rows.
                raise self.throttled_error(throttle)
        cleaned = super().clean()
        if self.user_cache is not None:
            signin.record_success(username, signin.client_address(self.request))
        return cleaned

    def get_invalid_login_error(self):
        # authenticate() refused the password: count it; the failure that reaches
        # a limit already says how long to wait.
        username = self.cleaned_data.get("username")
        address = signin.client_address(self.request)
        signin.record_failure(username, address)
        throttle = signin.throttled(username, address)
        if throttle:
            return self.throttled_error(throttle)
        return super().get_invalid_login_error()

    def throttled_error(self, throttle):
        self.retry_after = throttle.retry_after
        return forms.ValidationError(
            self.error_messages[f"throttled_{throttle.scope}"],
            code="throttled",
            params={"seconds": throttle.retry_after},
        )
