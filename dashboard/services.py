"""Writes: accounts, jobs, and the checks of the services Kiln runs on."""
import json
import secrets
import time

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from dashboard import jobs
from dashboard.models import Account, Job
from dashboard.roles import set_role
from dashboard.sessions import user_sessions
from dashboard.tasks import run_worker_check
from inference.gateway.keys import forget_user_keys

MONITOR_HEARTBEAT_KEY = "kiln:monitor:{host}"


def one_time_password():
    # 16 url-safe characters: easy to paste, about 96 bits.
    return secrets.token_urlsafe(12)


@transaction.atomic
def account_create(*, username, role, email=""):
    """Create a user with a one-time password; returns (user, password)."""
    User = get_user_model()
    password = one_time_password()
    user = User.objects.create_user(username=username, email=email, password=password)
    set_role(user, role)
    Account.objects.create(user=user, must_change_password=True)
    return user, password


@transaction.atomic
def account_reset_password(*, user):
    password = one_time_password()
    user.set_password(password)
    user.save(update_fields=["password"])
    Account.objects.update_or_create(user=user, defaults={"must_change_password": True})
    # The old password's sessions are dead anyway (Django checks a hash of the
    # password on each request); their rows go now.
    account_end_sessions(user=user)
    return password


def account_end_sessions(*, user, keep=None):
    """Sign a user out of every browser but the session `keep`; returns how many ended.
    Their next request goes to the sign-in page; a role change needs none of
    this, as roles are read on every request."""
    ended = [session.pk for session in user_sessions(user) if session.pk != keep]
    Session.objects.filter(pk__in=ended).delete()
    return len(ended)


def account_set_active(*, user, active):
    """Disable (or enable again) a user's account. A disabled user cannot sign in,
    their open sessions end now, and their API keys stop working at the gateway
    (it refuses keys of inactive users). Nothing of theirs is deleted."""
    user.is_active = active
    user.save(update_fields=["is_active"])
    ended = 0 if active else account_end_sessions(user=user)
    forget_user_keys(user)  # the gateway's copies (or refusals) of their keys are read again
    return ended


def account_delete(*, user):
    """Delete an account: its sessions end and its API keys go (the gateway's
    copies are dropped first). The audit trail keeps its rows (they hold the
    name, not a link), and usage and jobs keep theirs without the user."""
    account_end_sessions(user=user)
    forget_user_keys(user)
    user.delete()


def account_set_language(*, user, language):
    """Keep the language a user chose ("" = follow the browser) on their account."""
    Account.objects.update_or_create(user=user, defaults={"language": language})


def account_password_changed(*, user):
    Account.objects.update_or_create(user=user, defaults={"must_change_password": False})


def ensure_first_operator(username="admin"):
    """On a database with no users, create the first operator and return its
    one-time password; otherwise return None (passwords are never shown twice)."""
    User = get_user_model()
    if User.objects.exists():
        return None
    user, password = account_create(username=username, role="operator")
    user.is_superuser = True
    user.is_staff = True
    user.save(update_fields=["is_superuser", "is_staff"])
    return password


def redis_client():
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)


def redis_check(url=None):
    """None when Redis answers PING, else a sentence saying what failed."""
    url = url or settings.REDIS_URL
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2).ping()
    except redis.RedisError as exc:
        return _("Redis at %(url)s is not reachable (%(error)s). Start Redis, or unset REDIS_URL to use the embedded "
                 "one.") % {"url": url, "error": exc}
    return None


def monitor_heartbeats():
    """The latest heartbeat of each host's monitor process (they expire after a few seconds)."""
    client = redis_client()
    beats = []
    for key in client.scan_iter(match=MONITOR_HEARTBEAT_KEY.format(host="*")):
        raw = client.get(key)
        if raw:
            beat = json.loads(raw)
            beat["age_s"] = round(time.time() - beat["time"], 1)
            beats.append(beat)
    return sorted(beats, key=lambda b: b["host"])


def job_enqueue_worker_check(*, user):
    """Ask a worker to prove it runs tasks. The row records the outcome either way."""
    job = Job.objects.create(kind=Job.Kind.WORKER_CHECK, created_by=user)
    jobs.enqueue(run_worker_check, job.pk, queue=settings.CELERY_TASK_DEFAULT_QUEUE, on_refused=job_fail)
    job.refresh_from_db()  # failed already when the broker did not answer (outside a transaction)
    return job


def job_claim(job_id, worker):
    """Claim before work: False means another worker has it."""
    return jobs.claim(Job.objects.filter(pk=job_id, status=Job.Status.PENDING),
                      status=Job.Status.RUNNING, started=timezone.now(), worker=worker)


def job_succeed(job_id, result):
    Job.objects.filter(pk=job_id).update(status=Job.Status.SUCCEEDED, finished=timezone.now(), result=result)


def job_fail(job_id, error):
    Job.objects.filter(pk=job_id).update(status=Job.Status.FAILED, finished=timezone.now(), error=error)
