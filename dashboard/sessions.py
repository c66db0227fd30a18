"""Sessions that expire after SESSION_IDLE_TIMEOUT without a request.

SESSION_SAVE_EVERY_REQUEST makes Django's session middleware save the session
after every request, so that its expiry (SESSION_COOKIE_AGE) counts from the
last activity. Plainly that is a database write per request -- every poll of a
live page, every API call -- and on SQLite every write queues behind the
worker's and the monitor's. This store (SESSION_ENGINE) skips the write when
nothing in the session changed and its row was refreshed less than REFRESH_S
ago: at most one write a minute per signed-in browser, and the idle timeout
holds to within that minute.

It also answers which sessions belong to a user, so that an operator can end them.
"""
from django.contrib.sessions.backends.db import SessionStore as DatabaseSessionStore
from django.contrib.sessions.models import Session
from django.utils import timezone

REFRESH_S = 60


class SessionStore(DatabaseSessionStore):
    _stored_expiry = None

    def _validate_session_key(self, key):
        # A cookie can carry a NUL ("\000" in a quoted value); PostgreSQL refuses it in the
        # lookup (a 500 on every page). Such a key is no session: the caller is signed out.
        return super()._validate_session_key(key) and "\x00" not in key

    def _get_session_from_db(self):
        row = super()._get_session_from_db()
        self._stored_expiry = row.expire_date if row else None
        return row

    async def _aget_session_from_db(self):
        row = await super()._aget_session_from_db()
        self._stored_expiry = row.expire_date if row else None
        return row

    def _refreshed_lately(self, must_create):
        if must_create or self.modified or self._stored_expiry is None or self.get("_session_expiry"):
            return False
        age = self.get_session_cookie_age()
        written_ago = age - (self._stored_expiry - timezone.now()).total_seconds()
        return written_ago < min(REFRESH_S, age / 10)

    def save(self, must_create=False):
        if self._refreshed_lately(must_create):
            return
        super().save(must_create)
        self._stored_expiry = None if self.session_key is None else self.get_expiry_date()

    async def asave(self, must_create=False):
        if self._refreshed_lately(must_create):
            return
        await super().asave(must_create)
        self._stored_expiry = None if self.session_key is None else await self.aget_expiry_date()


def user_sessions(user):
    """The live sessions signed in as this user (every live session is decoded:
    fine for a team's panel, which holds tens of them)."""
    user_id = str(user.pk)
    return [
        session
        for session in Session.objects.filter(expire_date__gt=timezone.now())
        if session.get_decoded().get("_auth_user_id") == user_id
    ]


def session_counts():
    """{user id: number of live sessions}, for the Users page."""
    counts = {}
    for session in Session.objects.filter(expire_date__gt=timezone.now()):
        user_id = session.get_decoded().get("_auth_user_id")
        if user_id is not None:
            counts[int(user_id)] = counts.get(int(user_id), 0) + 1
    return counts
