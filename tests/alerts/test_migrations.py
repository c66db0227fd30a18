"""Upgrading keeps what each alert rule got: pauses were "batch_failed" before "batch_paused"."""
import importlib

import pytest
from django.apps import apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from monitoring.alerts.events import rule_matches
from monitoring.alerts.models import AlertEvent, AlertRule, Severity

BEFORE = [("monitoring", "0003_alertdelivery_attempt_log")]
AFTER = [("monitoring", "0004_alertrule_batch_paused")]
step = importlib.import_module("monitoring.migrations.0004_alertrule_batch_paused")


def migrate(target=None):
    """Migrate to target (default: every app's latest) and return the models as they are there."""
    executor = MigrationExecutor(connection)
    target = target or executor.loader.graph.leaf_nodes()
    executor.migrate(target)
    return MigrationExecutor(connection).loader.project_state(target).apps


@pytest.mark.django_db(transaction=True)  # SQLite's schema editor refuses to run inside a transaction
def test_rules_that_listed_batch_failed_also_get_batch_paused_and_lose_it_on_the_way_back():
    Rule = migrate(BEFORE).get_model("monitoring", "AlertRule")
    picked = Rule.objects.create(name="batches", kinds=["batch_finished", "batch_failed", "gpu_xid"])
    every = Rule.objects.create(name="everything", kinds=[])
    other = Rule.objects.create(name="engines", kinds=["engine_crashed"])
    try:
        Rule = migrate(AFTER).get_model("monitoring", "AlertRule")
        assert Rule.objects.get(pk=picked.pk).kinds == ["batch_finished", "batch_failed", "batch_paused", "gpu_xid"]
        assert Rule.objects.get(pk=every.pk).kinds == []  # every event already, pauses included
        assert Rule.objects.get(pk=other.pk).kinds == ["engine_crashed"]

        Rule = migrate(BEFORE).get_model("monitoring", "AlertRule")
        assert Rule.objects.get(pk=picked.pk).kinds == ["batch_finished", "batch_failed", "gpu_xid"]
        assert Rule.objects.get(pk=other.pk).kinds == ["engine_crashed"]
    finally:
        migrate()


@pytest.mark.django_db
def test_an_upgraded_rule_that_listed_batch_failed_is_sent_pauses():
    rule = AlertRule.objects.create(name="batches", kinds=["batch_failed"], min_severity=Severity.INFO)
    pause = AlertEvent(kind="batch_paused", key="batch:1", severity=Severity.WARNING, subject="batch 1 paused",
                       occurred=timezone.now())
    assert not rule_matches(rule, pause)
    step.add_paused(apps, None)
    step.add_paused(apps, None)  # run twice, listed once
    rule.refresh_from_db()
    assert rule.kinds == ["batch_failed", "batch_paused"] and rule_matches(rule, pause)
