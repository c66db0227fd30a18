"""Channel and rule forms. A secret field left blank keeps the stored value; it is never shown back."""
from __future__ import annotations

from urllib.parse import urlsplit

import httpx
from django import forms
from django.utils.translation import gettext_lazy as _

from monitoring.alerts.events import kind_choices
from monitoring.alerts.models import AlertChannel, AlertRule, Severity

SECURITY = (("starttls", _("STARTTLS (usually port 587)")), ("tls", _("TLS from the start (usually port 465)")),
            ("none", _("none (a relay on this host only)")))


class ChannelForm(forms.ModelForm):
    url = forms.CharField(label=_("Webhook URL"), required=False, max_length=2000,
                          widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
                          help_text=_("It carries the bot's token, so it is stored encrypted and never shown "
                                      "again. Leave blank to keep the stored one."))
    secret = forms.CharField(label=_("Signing secret / SMTP password"), required=False, max_length=500,
                             widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
                             help_text=_("Leave blank to keep the stored one."))
    clear_secret = forms.BooleanField(label=_("Remove the stored secret"), required=False)
    smtp_host = forms.CharField(label=_("SMTP server"), required=False, max_length=200)
    smtp_port = forms.IntegerField(label=_("Port"), required=False, min_value=1, max_value=65535)
    security = forms.ChoiceField(label=_("Encryption"), choices=SECURITY, required=False, initial="starttls")
    username = forms.CharField(label=_("User name"), required=False, max_length=200)
    sender = forms.EmailField(label=_("From"), required=False)
    recipients = forms.CharField(label=_("To (comma-separated)"), required=False, max_length=2000)
    verify = forms.BooleanField(label=_("Verify the server's certificate"), required=False, initial=True)
    ca_file = forms.CharField(label=_("CA file (PEM) on the hosts that send"), required=False, max_length=500)

    class Meta:
        model = AlertChannel
        fields = ["name", "kind", "enabled"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        o = self.instance.options or {}
        if self.instance.pk:
            self.fields["url"].widget.attrs["placeholder"] = self.instance.url_shown or ""
            self.fields["secret"].widget.attrs["placeholder"] = self.instance.secret_shown or ""
        for name, key in (("smtp_host", "host"), ("smtp_port", "port"), ("security", "security"),
                          ("username", "username"), ("sender", "sender"), ("ca_file", "ca_file")):
            if key in o:
                self.fields[name].initial = o[key]
        if "recipients" in o:
            self.fields["recipients"].initial = ", ".join(o["recipients"])
        if "verify" in o:
            self.fields["verify"].initial = o["verify"]

    def clean(self):
        data = super().clean()
        kind = data.get("kind")
        url = (data.get("url") or "").strip()
        if kind == AlertChannel.Kind.EMAIL:
            if not data.get("smtp_host"):
                self.add_error("smtp_host", _("Name the SMTP server, e.g. smtp.example.com."))
            recipients = [r.strip() for r in (data.get("recipients") or "").split(",") if r.strip()]
            bad = []
            for r in recipients:
                try:
                    forms.EmailField().clean(r)
                except forms.ValidationError:
                    bad.append(r)
            if not recipients:
                self.add_error("recipients", _("Give at least one address to send to."))
            elif bad:
                self.add_error("recipients", _("Not an email address: %(bad)s") % {"bad": ", ".join(bad)})
            data["recipient_list"] = recipients
            if data.get("username") and not data.get("secret") and not self.instance.secret_encrypted:
                self.add_error("secret", _("A user name needs its password."))
        elif kind:
            if url:
                parts = urlsplit(url)
                if parts.scheme not in ("http", "https") or not parts.netloc:
                    self.add_error("url", _("Give the full webhook address, starting with https://."))
                else:
                    try:  # the client that sends it must be able to parse it (a port like ":abc" is not)
                        port = httpx.URL(url).port
                    except (httpx.InvalidURL, ValueError, TypeError):
                        port = -1
                    if port is not None and not 0 < port < 65536:
                        self.add_error("url", _("This address cannot be used (check its host and port number)."))
            elif not self.instance.url_encrypted:
                self.add_error("url", _("Paste the webhook address the platform gave you."))
        return data

    def save(self, commit=True):
        channel = super().save(commit=False)
        data = self.cleaned_data
        if data.get("url"):
            channel.url = data["url"].strip()
        if data.get("clear_secret"):
            channel.secret = ""
        elif data.get("secret"):
            channel.secret = data["secret"]
        if channel.kind == AlertChannel.Kind.EMAIL:
            channel.url = ""
            channel.options = {"host": data.get("smtp_host", ""), "port": data.get("smtp_port"),
                               "security": data.get("security") or "starttls", "username": data.get("username", ""),
                               "sender": data.get("sender", ""), "recipients": data.get("recipient_list", []),
                               "verify": bool(data.get("verify")), "ca_file": data.get("ca_file", "")}
        else:
            channel.options = {}
        if commit:
            channel.save()
        return channel


class RuleForm(forms.ModelForm):
    kinds = forms.MultipleChoiceField(label=_("Events (none ticked: every event)"), required=False,
                                      choices=kind_choices, widget=forms.CheckboxSelectMultiple)
    min_severity = forms.TypedChoiceField(label=_("Minimum severity"), choices=Severity.choices, coerce=int,
                                          initial=Severity.WARNING)
    quiet_start = forms.TimeField(label=_("Quiet from (HH:MM)"), required=False,
                                  widget=forms.TimeInput(attrs={"type": "time"}))
    quiet_end = forms.TimeField(label=_("Quiet until (HH:MM)"), required=False,
                                widget=forms.TimeInput(attrs={"type": "time"}))

    class Meta:
        model = AlertRule
        fields = ["name", "enabled", "kinds", "min_severity", "channels", "host", "deployment_id", "cooldown_s",
                  "send_resolved", "quiet_start", "quiet_end"]
        widgets = {"channels": forms.CheckboxSelectMultiple}

    def clean_cooldown_s(self):
        value = self.cleaned_data["cooldown_s"]
        if value is not None and value > 7 * 86400:
            raise forms.ValidationError(_("Use at most a week (604800 seconds)."))
        return value

    def clean_deployment_id(self):
        value = self.cleaned_data.get("deployment_id")
        if value is not None and not 0 < value < 2**63:
            raise forms.ValidationError(_("Give a deployment's number, or leave it empty."))
        return value

    def clean(self):
        data = super().clean()
        if bool(data.get("quiet_start")) != bool(data.get("quiet_end")):
            self.add_error("quiet_end", _("Give both ends of the quiet window, or neither."))
        return data
