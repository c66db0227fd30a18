"""raise_event: routing by rules, one message per incident, resolved messages, cooldown, quiet window."""
import datetime as dt

import pytest
from django.utils import timezone

from monitoring.alerts import events
from monitoring.alerts.events import raise_event
from monitoring.alerts.models import AlertChannel, AlertDelivery, AlertEvent, AlertRule, Severity

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_queue(monkeypatch):
    """Record what would be queued instead of needing Redis here."""
    sent = []
    monkeypatch.setattr("monitoring.alerts.delivery.queue", lambda ids, countdown=None: sent.extend(ids))
    return sent


def make_channel(name="ops", kind="webhook"):
    c = AlertChannel(name=name, kind=kind)
    c.url = "http://127.0.0.1:9/x"
    c.save()
    return c


def make_rule(*channels, **kw):
    rule = AlertRule.objects.create(name=kw.pop("name", "all"), **kw)
    rule.channels.set(channels)
    return rule


def crash(**kw):
    return raise_event("engine_crashed", subject="qwen crashed", host="gpu1", deployment=3,
                       link="/deployments/3/", **kw)


def test_event_goes_to_the_rules_channels_and_is_queued(no_queue):
    ops, chat = make_channel("ops"), make_channel("chat", "slack")
    make_channel("unused")
    make_rule(ops, chat)
    e = crash()
    assert e.severity == Severity.CRITICAL and e.is_open and e.key == "deployment:3"
    ds = AlertDelivery.objects.filter(event=e)
    assert {d.channel.name for d in ds} == {"ops", "chat"}
    assert sorted(no_queue) == sorted(d.pk for d in ds)


def test_one_incident_one_message_then_resolved_where_it_went(no_queue):
    ops = make_channel()
    make_rule(ops)
    first = crash()
    assert crash() is None and crash() is None  # repeats while open
    first.refresh_from_db()
    assert first.repeats == 2 and AlertDelivery.objects.count() == 1
    cleared = raise_event("engine_crashed", resolved=True, deployment=3)
    assert cleared.resolved and cleared.opening_id == first.pk
    first.refresh_from_db()
    assert not first.is_open and first.resolved_at
    assert AlertDelivery.objects.filter(event=cleared, channel=ops).count() == 1
    assert raise_event("engine_crashed", resolved=True, deployment=3) is None  # nothing open


def test_rule_filters_kind_severity_host_and_deployment():
    ops = make_channel()
    make_rule(ops, kinds=["gpu_xid"], min_severity=Severity.CRITICAL, host="gpu2")
    assert not AlertDelivery.objects.filter(event=crash()).exists()  # wrong kind
    x = raise_event("gpu_xid", subject="Xid 79", host="gpu1", details={"uuid": "GPU-a"})
    assert not AlertDelivery.objects.filter(event=x).exists()  # wrong host
    x = raise_event("gpu_xid", subject="Xid 79", host="gpu2", details={"uuid": "GPU-b"})
    assert AlertDelivery.objects.filter(event=x).count() == 1
    low = raise_event("gpu_xid", subject="Xid 13", severity="warning", host="gpu2", details={"uuid": "GPU-c"})
    assert not AlertDelivery.objects.filter(event=low).exists()  # below minimum severity
    AlertRule.objects.all().delete()
    make_rule(ops, deployment_id=4)
    assert not AlertDelivery.objects.filter(event=raise_event("engine_failed", deployment=3, host="h")).exists()
    assert AlertDelivery.objects.filter(event=raise_event("engine_failed", deployment=4, host="h")).exists()


def test_a_burst_of_one_shot_events_is_one_row_and_cooldown_keeps_it_to_one_message():
    ops = make_channel()
    make_rule(ops, cooldown_s=600)
    first = raise_event("gpu_xid", subject="Xid 79", host="gpu1", key="xid:GPU-a:79")
    for _ in range(50):  # an Xid every tick
        assert raise_event("gpu_xid", subject="Xid 79", host="gpu1", key="xid:GPU-a:79") is None
    first.refresh_from_db()
    assert first.repeats == 50 and AlertEvent.objects.count() == 1 and AlertDelivery.objects.count() == 1
    # Another GPU is another incident.
    raise_event("gpu_xid", subject="Xid 79", host="gpu1", key="xid:GPU-b:79")
    assert AlertDelivery.objects.filter(status="pending").count() == 2
    # Two minutes later: a new row, but within the rule's cooldown, so not sent.
    AlertEvent.objects.update(created=timezone.now() - dt.timedelta(seconds=120))
    AlertDelivery.objects.update(created=timezone.now() - dt.timedelta(seconds=120))
    again = raise_event("gpu_xid", subject="Xid 79", host="gpu1", key="xid:GPU-a:79")
    d = AlertDelivery.objects.get(event=again)
    assert d.status == "suppressed" and "cooldown" in d.error
    # After the cooldown it is sent again.
    AlertEvent.objects.update(created=timezone.now() - dt.timedelta(seconds=601))
    AlertDelivery.objects.update(created=timezone.now() - dt.timedelta(seconds=601))
    later = raise_event("gpu_xid", subject="Xid 79", host="gpu1", key="xid:GPU-a:79")
    assert AlertDelivery.objects.get(event=later).status == "pending"


def test_quiet_window_holds_back_all_but_critical(monkeypatch):
    ops = make_channel()
    now = timezone.localtime()
    start = (now - dt.timedelta(hours=1)).time()
    end = (now + dt.timedelta(hours=1)).time()
    make_rule(ops, min_severity=Severity.INFO, quiet_start=start, quiet_end=end)
    warn = raise_event("gpu_memory_full", subject="95%", host="h", details={"uuid": "GPU-a"})
    assert AlertDelivery.objects.get(event=warn).status == "suppressed"
    crit = crash()
    assert AlertDelivery.objects.get(event=crit).status == "pending"


def test_quiet_window_over_midnight():
    rule = AlertRule(quiet_start=dt.time(22, 0), quiet_end=dt.time(7, 0))
    tz = timezone.get_current_timezone()
    at = lambda h: timezone.make_aware(dt.datetime(2026, 1, 1, h, 30), tz)  # noqa: E731
    assert events.in_quiet_window(rule, at(23)) and events.in_quiet_window(rule, at(3))
    assert not events.in_quiet_window(rule, at(12))


def test_raise_event_never_raises_and_refuses_unknown_kinds(caplog):
    assert raise_event("no_such_kind", subject="x") is None
    assert "not recorded" in caplog.text
    assert AlertEvent.objects.count() == 0


def test_disabled_channel_and_rule_get_nothing():
    ops = make_channel()
    ops.enabled = False
    ops.save()
    make_rule(ops)
    make_rule(make_channel("other"), enabled=False, name="off")
    crash()
    assert AlertDelivery.objects.count() == 0


def test_nowait_returns_at_once_and_writes_on_its_thread():
    make_rule(make_channel())
    future = events.raise_event_nowait("engine_crashed", subject="x", deployment=9, host="h")
    event = future.result(timeout=10)
    assert event is not None and AlertDelivery.objects.filter(event_id=event.pk).count() == 1


def test_old_closed_events_are_pruned_open_ones_kept():
    from monitoring.alerts.services import prune_history

    make_rule(make_channel())
    old_closed = raise_event("gpu_xid", subject="old", host="h", key="xid:a:1")
    old_open = crash()
    AlertEvent.objects.update(created=timezone.now() - dt.timedelta(days=100))
    fresh = raise_event("gpu_xid", subject="new", host="h", key="xid:b:1")
    assert prune_history(90) == 1
    assert set(AlertEvent.objects.values_list("pk", flat=True)) == {old_open.pk, fresh.pk}
    assert not AlertDelivery.objects.filter(event_id=old_closed.pk).exists()
