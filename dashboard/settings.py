"""Kiln settings. Everything a deployment changes comes from the environment.

SQLite under DATA_DIR and a Redis on localhost are the defaults "so one can just
check out the code and run it"; PostgreSQL and a shared Redis are one variable
each. Bad values stop the start with a message naming the variable (dashboard.env).
"""
import os
import socket
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF, UNSAFE_INLINE

from dashboard.env import (
    ConfigError,
    envaddress,
    envbool,
    envchoice,
    envfloat,
    envint,
    envlist,
    envpath,
    envurl,
    secret_key,
)

BASE_DIR = Path(__file__).resolve().parent.parent

DATA_DIR = envpath("DATA_DIR", BASE_DIR / "data")
LOG_DIR = DATA_DIR / "logs"
LOG_DIR.mkdir(exist_ok=True)
MODELS_DIR = envpath("MODELS_DIR", DATA_DIR / "models")
# Folders a local import may read (IMPORT_ROOTS: absolute paths separated by commas
# or os.pathsep). Unset: anywhere but /proc, /sys and /dev, which are refused always.
IMPORT_ROOTS = []
if (_import_roots := os.environ.get("IMPORT_ROOTS")) is not None:
    IMPORT_ROOTS = [p.strip() for p in _import_roots.replace(os.pathsep, ",").split(",") if p.strip()]
    if not IMPORT_ROOTS or not all(os.path.isabs(os.path.expanduser(p)) for p in IMPORT_ROOTS):
        raise ConfigError(f"IMPORT_ROOTS={_import_roots!r}: give absolute folders separated by commas, or unset it.")
    IMPORT_ROOTS = [os.path.realpath(os.path.expanduser(p)) for p in IMPORT_ROOTS]

# Model hubs. HF_ENDPOINT takes a mirror such as https://hf-mirror.com (the same
# variable huggingface_hub reads). The tokens are sent only to their own endpoint.
HF_ENDPOINT = envurl("HF_ENDPOINT", "https://huggingface.co", schemes=("http", "https")).rstrip("/")
# The hub presets and the Models page offer first: huggingface, hf-mirror (Hugging Face
# through HF_MIRROR_ENDPOINT, what users in China use) or modelscope. An operator's
# choice on the Overview page (kept in DATA_DIR) wins over this default.
PREFERRED_HUB = envchoice("PREFERRED_HUB", "", ("huggingface", "hf-mirror", "modelscope"))
HF_MIRROR_ENDPOINT = envurl("HF_MIRROR_ENDPOINT", "https://hf-mirror.com", schemes=("http", "https")).rstrip("/")
HF_TOKEN = os.environ.get("HF_TOKEN", "").strip()
MODELSCOPE_ENDPOINT = envurl("MODELSCOPE_ENDPOINT", "https://www.modelscope.cn", schemes=("http", "https")).rstrip("/")
MODELSCOPE_TOKEN = os.environ.get("MODELSCOPE_TOKEN", "").strip()
# Space a download must leave free on the models disk (the database and logs live there too).
MODELS_DISK_RESERVE_MB = envint("MODELS_DISK_RESERVE_MB", 1024, minimum=0)

SECRET_KEY = secret_key(DATA_DIR)
DEBUG = envbool("DEBUG", False)
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [], allow_empty=True)

# The name of this GPU host: its Celery queue is host.<name> and its monitor
# reports under it. One host by default; more hosts share Redis and the database.
HOST_NAME = envlist("KILN_HOST_NAME", [socket.gethostname().split(".")[0] or "local"])[0]
# The address the other Kiln hosts reach this host at. Loopback (the default) is
# the single-host panel: engines listen on 127.0.0.1 as their profiles say. Any
# other address makes this a GPU host of a larger panel: its engines listen on
# this address, each with its own API key, so the head's gateway can reach them
# (inference/deployments/services.py engine_endpoint).
HOST_ADDRESS = envaddress("KILN_HOST_ADDRESS", "127.0.0.1")

INSTALLED_APPS = [
    "daphne",  # runserver serves ASGI (websockets) in development
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "ninja",  # the API docs page's static files
    "dashboard",
    "inference",
    "monitoring",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "dashboard.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The language: the user's saved choice, else the language cookie, else
    # Accept-Language (after sessions, before common: Django's documented place).
    "django.middleware.locale.LocaleMiddleware",
    # %00 in the address: 400 before anything reads the database with it (PostgreSQL refuses NUL).
    "dashboard.middleware.NulCharacterMiddleware",
    "django.middleware.common.CommonMiddleware",
    "dashboard.middleware.JsonMethodNotAllowedMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "dashboard.middleware.UserLanguageMiddleware",
    "dashboard.middleware.AuditMiddleware",
    "dashboard.middleware.LoginRequiredMiddleware",
    "dashboard.middleware.OneTimePasswordMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "dashboard.urls"
WSGI_APPLICATION = "dashboard.wsgi.application"
ASGI_APPLICATION = "dashboard.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.roles.context_processor",
            ],
        },
    },
]

try:
    DATABASES = {
        "default": dj_database_url.parse(
            envurl(
                "DATABASE_URL",
                f"sqlite:///{DATA_DIR / 'kiln.sqlite3'}",
                schemes=("sqlite", "postgres", "postgresql", "pgsql"),
            ),
            conn_max_age=envint("DATABASE_CONN_MAX_AGE", 60, minimum=0),
        )
    }
except ValueError as exc:
    raise ConfigError(f"DATABASE_URL is not a database address Kiln understands: {exc}") from None
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web server, the worker and the monitor write to one file at once:
    # WAL lets readers go on during a write, IMMEDIATE transactions queue writers
    # instead of failing with "database is locked".
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test-kiln.sqlite3")}

else:
    # A GPU host reaches PostgreSQL across the network: when the link drops, a query must
    # fail in seconds (and be retried on the next tick), not hang for the kernel's TCP
    # retransmission timeout (~15 min), and a connect must not wait two minutes of SYNs.
    # Parameters given in DATABASE_URL's query string win.
    for _name, _value in (("connect_timeout", 10), ("keepalives", 1), ("keepalives_idle", 10),
                          ("keepalives_interval", 5), ("keepalives_count", 3), ("tcp_user_timeout", 10000)):
        DATABASES["default"].setdefault("OPTIONS", {}).setdefault(_name, _value)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
# A session ends SESSION_IDLE_TIMEOUT seconds after its last request: it is saved
# on every request (dashboard/sessions.py writes its row at most once a minute).
SESSION_IDLE_TIMEOUT = envint("SESSION_IDLE_TIMEOUT", 12 * 3600, minimum=60)
SESSION_COOKIE_AGE = SESSION_IDLE_TIMEOUT
SESSION_SAVE_EVERY_REQUEST = True
SESSION_ENGINE = "dashboard.sessions"
# Failed sign-ins (dashboard/signin.py): after this many failures in a row an
# account, or a client address, waits LOGIN_COOLOFF_S seconds. The address is
# REMOTE_ADDR -- a reverse proxy's own address, unless it is in TRUSTED_PROXIES.
LOGIN_FAILURES_PER_ACCOUNT = envint("LOGIN_FAILURES_PER_ACCOUNT", 5, minimum=1)
LOGIN_FAILURES_PER_ADDRESS = envint("LOGIN_FAILURES_PER_ADDRESS", 20, minimum=1)
LOGIN_COOLOFF_S = envint("LOGIN_COOLOFF_S", 300, minimum=1, maximum=7 * 24 * 3600)
TRUSTED_PROXIES = envlist("TRUSTED_PROXIES", [])

# How browsers reach the panel (README "Production"). KILN_TLS=off: plain http, as
# the standalone runner serves it on 127.0.0.1, so cookies must work over http.
# KILN_TLS=on: https, through a TLS proxy that sets X-Forwarded-Proto. Django learns
# the scheme from the server rather than from a header anyone could send (so no
# SECURE_PROXY_SSL_HEADER): gunicorn's uvicorn worker believes X-Forwarded-Proto
# only from FORWARDED_ALLOW_IPS (default: this host's loopback), and that also
# gives websockets their wss scheme.
SERVED_OVER_HTTPS = envchoice("KILN_TLS", "off", ("off", "on")) == "on"
SECURE_SSL_REDIRECT = SERVED_OVER_HTTPS
# The container's healthcheck asks http://127.0.0.1:<port>/healthz, past the proxy.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", SERVED_OVER_HTTPS)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
# Sent on https responses only. Browsers then refuse plain http to this host for
# that long: a year by default, try a few minutes first.
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 365 * 24 * 3600 if SERVED_OVER_HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", False)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SILENCED_SYSTEM_CHECKS = []
if not SERVED_OVER_HTTPS:
    # `check --deploy` asks for these only because it assumes https. Over plain
    # http there is nothing to redirect to, browsers ignore HSTS, and a secure
    # cookie never comes back, so nobody could sign in.
    SILENCED_SYSTEM_CHECKS += ["security.W004", "security.W008"]
    if not SESSION_COOKIE_SECURE:
        SILENCED_SYSTEM_CHECKS += ["security.W012", "security.W016"]
if SECURE_HSTS_SECONDS and not SECURE_HSTS_PRELOAD:
    # Preloading is a commitment the owner of the parent domain makes at
    # hstspreload.org (it takes apex domains only); on the panel's name the token does nothing.
    SILENCED_SYSTEM_CHECKS += ["security.W021"]

# Content-Security-Policy on every response (django-csp: Django 5.2 has none built
# in). Scripts come only from our own files, never inline or eval'd
# (tests/dashboard/test_no_inline_scripts.py). Styles may be inline: templates keep
# small <style> blocks, plotly.js and Swagger UI write style attributes.
# dashboard/csp.py adds the page's own websocket origin to connect-src.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],  # plotly's and Swagger UI's icons
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

# English and Simplified Chinese (locale/, glossary in locale/GLOSSARY.md). A user's
# choice is kept on their account (dashboard.middleware.UserLanguageMiddleware);
# before sign-in the language cookie, then the browser's Accept-Language decide.
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
# Dates and number grouping per language (dashboard/formats/<locale>/formats.py).
FORMAT_MODULE_PATH = ["dashboard.formats"]
LANGUAGE_COOKIE_AGE = 365 * 24 * 3600
LANGUAGE_COOKIE_SAMESITE = "Lax"
LANGUAGE_COOKIE_SECURE = SESSION_COOKIE_SECURE
TIME_ZONE = envlist("TIME_ZONE", ["UTC"])[0]
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT") or DATA_DIR / "staticfiles")
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve straight from the finders when collectstatic has not been run (the
# standalone runner and tests); production images run collectstatic.
WHITENOISE_USE_FINDERS = True

# Redis carries the Celery queue and the Channels layer.
REDIS_URL = envurl("REDIS_URL", "redis://127.0.0.1:6379/0", schemes=("redis", "rediss", "unix"))

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # redis-py 8 reads with a 5 s socket timeout by default, the same as
        # channels_redis' 5 s BZPOPMIN: after 5 quiet seconds a websocket
        # consumer died with "Timeout reading from". Read longer than it blocks.
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}], "capacity": 500, "expiry": 30},
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True  # the database row is the record, not a result backend
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Enqueueing must fail fast when Redis is down so the user sees an error, not a hung page.
CELERY_BROKER_CONNECTION_TIMEOUT = envfloat("CELERY_BROKER_CONNECTION_TIMEOUT", 3.0, minimum=0.5)
CELERY_BROKER_TRANSPORT_OPTIONS = {"max_retries": 1, "interval_start": 0, "interval_step": 0.5}
# A worker on a GPU host that loses Redis (a cut link) keeps trying to reconnect, however
# long it takes, instead of exiting after Celery's default 100 attempts.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# The monitor's sampling period; issue-specific code reads it.
MONITOR_INTERVAL = envfloat("MONITOR_INTERVAL", 1.0, minimum=0.25, maximum=60)
# Monitoring history (monitoring/history.py): every sample is kept for
# MONITOR_RAW_RETENTION seconds, 10 s averages for MONITOR_10S_RETENTION, 1 min
# averages for MONITOR_1M_RETENTION. 8 GPUs at 1 Hz: ~29k raw rows per hour,
# ~69k 10 s rows per day, ~345k 1 min rows per 30 days -- fine for SQLite.
MONITOR_RAW_RETENTION = envint("MONITOR_RAW_RETENTION", 3600, minimum=60)
MONITOR_10S_RETENTION = envint("MONITOR_10S_RETENTION", 24 * 3600, minimum=600)

# Batch jobs (/v1/files, /v1/batches): the largest input file, the longest line,
# tries per line on 429/5xx/timeouts (with doubling backoff from BATCH_BACKOFF_S).
BATCH_FILE_MAX_BYTES = envint("BATCH_FILE_MAX_BYTES", 2 * 1024**3, minimum=1024)
BATCH_LINE_MAX_BYTES = envint("BATCH_LINE_MAX_BYTES", 8 * 1024**2, minimum=1024)
BATCH_MAX_ATTEMPTS = envint("BATCH_MAX_ATTEMPTS", 5, minimum=1, maximum=50)
BATCH_BACKOFF_S = float(os.environ.get("BATCH_BACKOFF_S") or 1.0)
BATCH_REQUEST_TIMEOUT_S = envint("BATCH_REQUEST_TIMEOUT_S", 600, minimum=1)
MONITOR_1M_RETENTION = envint("MONITOR_1M_RETENTION", 30 * 24 * 3600, minimum=3600)
# How often the monitor writes its buffered history rows (one batch insert).
MONITOR_FLUSH_INTERVAL = envfloat("MONITOR_FLUSH_INTERVAL", 5.0, minimum=0.5, maximum=300)

# The audit trail (dashboard/audit.py) keeps entries this many days; older ones are
# deleted on a write at most once an hour.
AUDIT_RETENTION_DAYS = envint("AUDIT_RETENTION_DAYS", 365, minimum=1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": envlist("LOG_LEVEL", ["INFO"])[0].upper()},
    "loggers": {"django.channels.server": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}

STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "dashboard.staticfinders.PlotlyFinder",
]
