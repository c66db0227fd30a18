"""A batch pause was raised as "batch_failed" before it got its own kind, "batch_paused".

A rule that lists "batch_failed" got pauses until then; without this it silently stops
getting them after the upgrade. (A rule with no list gets every event and needs nothing.)
"""
from django.db import migrations

OLD, NEW = "batch_failed", "batch_paused"


def add_paused(apps, schema_editor):
    AlertRule = apps.get_model("monitoring", "AlertRule")
    for rule in AlertRule.objects.all():
        kinds = rule.kinds
        if isinstance(kinds, list) and OLD in kinds and NEW not in kinds:
            kinds.insert(kinds.index(OLD) + 1, NEW)
            AlertRule.objects.filter(pk=rule.pk).update(kinds=kinds)


def remove_paused(apps, schema_editor):
    # From every rule, not only those that list "batch_failed": the release before this one has
    # no such kind, so it would stay in a rule there unseen (its form has no box for it).
    AlertRule = apps.get_model("monitoring", "AlertRule")
    for rule in AlertRule.objects.all():
        kinds = rule.kinds
        if isinstance(kinds, list) and NEW in kinds:
            AlertRule.objects.filter(pk=rule.pk).update(kinds=[k for k in kinds if k != NEW])


class Migration(migrations.Migration):

    dependencies = [
        ("monitoring", "0003_alertdelivery_attempt_log"),
    ]

    operations = [
        migrations.RunPython(add_paused, remove_paused),
    ]
