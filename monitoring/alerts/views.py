"""Alerts pages: everyone signed in reads; operators edit channels and rules and send tests."""
from __future__ import annotations

from django.contrib import messages
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dashboard.roles import OPERATOR_ONLY, is_operator, operator_required
from monitoring.alerts import selectors, services
from monitoring.alerts.events import KINDS
from monitoring.alerts.forms import ChannelForm, RuleForm
from monitoring.alerts.models import AlertChannel, AlertRule

MAX_ID = 2**63 - 1


def _get(model, pk):
    if pk > MAX_ID:
        raise Http404
    return get_object_or_404(model, pk=pk)


@require_GET
def alerts_page(request):
    return render(request, "alerts/alerts.html", {
        "channels": selectors.channels(),
        "rules": selectors.rules(),
        "history": selectors.history(),
        "open_incidents": selectors.open_incidents(),
        "kind_labels": {k: v.label for k, v in KINDS.items()},
    })


def _edit(request, form_class, instance, template, noun):
    operator = is_operator(request.user)
    if request.method == "POST":
        if not operator:
            return render(request, "403.html", {"message": OPERATOR_ONLY}, status=403)
        form = form_class(request.POST, instance=instance)
        if form.is_valid():
            saved = form.save()
            messages.success(request, _("%(noun)s “%(name)s” saved.") % {"noun": noun, "name": saved.name})
            return redirect("alerts")
        status = 400
    else:
        form = form_class(instance=instance)
        status = 200
    if not operator:
        for field in form.fields.values():
            field.disabled = True
    return render(request, template, {"form": form, "object": instance if instance.pk else None,
                                      "read_only": not operator}, status=status)


@require_http_methods(["GET", "POST"])
def channel_edit(request, channel_id=None):
    channel = _get(AlertChannel, channel_id) if channel_id is not None else AlertChannel()
    return _edit(request, ChannelForm, channel, "alerts/channel_form.html", _("Channel"))


@require_http_methods(["GET", "POST"])
def rule_edit(request, rule_id=None):
    rule = _get(AlertRule, rule_id) if rule_id is not None else AlertRule()
    return _edit(request, RuleForm, rule, "alerts/rule_form.html", _("Rule"))


@require_POST
@operator_required
def channel_test(request, channel_id):
    channel = _get(AlertChannel, channel_id)
    row = services.channel_send_test(channel=channel, user=request.user)
    if row.status == row.Status.SENT:
        messages.success(request, _("Test message sent to “%(name)s” (answer %(code)s).") % {
            "name": channel.name, "code": row.response_code})
    else:
        messages.error(request, _("The test message to “%(name)s” failed: %(error)s") % {
            "name": channel.name, "error": row.error or row.get_status_display()})
    return redirect("alerts")


@require_POST
@operator_required
def channel_delete(request, channel_id):
    channel = _get(AlertChannel, channel_id)
    channel.delete()
    messages.success(request, _("Channel “%(name)s” deleted with its delivery history.") % {"name": channel.name})
    return redirect("alerts")


@require_POST
@operator_required
def rule_delete(request, rule_id):
    rule = _get(AlertRule, rule_id)
    rule.delete()
    messages.success(request, _("Rule “%(name)s” deleted.") % {"name": rule.name})
    return redirect("alerts")
