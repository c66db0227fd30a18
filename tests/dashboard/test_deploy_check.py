"""Production settings: `manage.py check --deploy` with the environment that
docker-compose.yml and .env.example give the web process, what KILN_TLS=on
changes on the wire (behind a TLS proxy, under gunicorn as compose runs it), and
the Content-Security-Policy every page carries."""
import json
import os
import re
import subprocess
import sys

import httpx
import pytest
import yaml

from tests.helpers import REPO, child_env, free_port, stop_group, wait_until


def compose_value(text, dotenv):
    """docker compose's interpolation of one value: ${VAR:-default}, ${VAR:?error}, ${VAR}, $$."""
    def one(match):
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        value = dotenv.get(name, "")
        if op == ":?" and not value:
            raise AssertionError(f"compose refuses to start: {arg}")
        return value or (arg if op == ":-" else "")

    return re.sub(r"\$\$|\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, text)


def production_environment(data_dir, **dotenv_changes):
    """The web container's environment: .env.example as the .env (with the changes an
    operator would make), run through the x-kiln environment of docker-compose.yml.
    DATA_DIR is /data in the container; here it is a temporary folder."""
    dotenv = {}
    for line in (REPO / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            dotenv[name.strip()] = value.strip()
    dotenv.update(dotenv_changes)
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    env = {name: compose_value(str(value), dotenv) for name, value in compose["x-kiln"]["environment"].items()}
    env["DATA_DIR"] = str(data_dir)
    return env


def run_manage(*args, environment):
    """manage.py with only the given environment (plus what finds Python and a home)."""
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env={**base, **environment},
                          capture_output=True, text=True, timeout=120)


def deploy_check(environment):
    return run_manage("check", "--deploy", "--fail-level", "WARNING", environment=environment)


def test_the_example_environment_passes_the_deploy_check(tmp_path):
    environment = production_environment(tmp_path)
    assert environment["KILN_TLS"] == "off" and environment["SECRET_KEY"]
    result = deploy_check(environment)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout, result.stdout
    assert "WARNINGS" not in result.stdout + result.stderr


def settings_seen(environment, *names):
    code = "from django.conf import settings; import json; print(json.dumps({n: getattr(settings, n) for n in %r}))"
    result = run_manage("shell", "-c", code % (names,), environment=environment)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_over_https_the_deploy_check_passes_with_the_tls_checks_on(tmp_path):
    environment = production_environment(tmp_path, KILN_TLS="on")
    result = deploy_check(environment)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout, result.stdout
    seen = settings_seen(environment, "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE",
                         "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SILENCED_SYSTEM_CHECKS",
                         "SECURE_PROXY_SSL_HEADER")
    assert seen["SECURE_SSL_REDIRECT"] and seen["SESSION_COOKIE_SECURE"] and seen["CSRF_COOKIE_SECURE"]
    assert seen["SECURE_HSTS_SECONDS"] == 365 * 24 * 3600 and seen["SECURE_HSTS_INCLUDE_SUBDOMAINS"]
    # Only the preload advice is silenced: it is the parent domain's owner's decision.
    assert seen["SILENCED_SYSTEM_CHECKS"] == ["security.W021"]
    # The scheme comes from the server's trusted proxies, not from a header anyone can send.
    assert seen["SECURE_PROXY_SSL_HEADER"] is None


def test_over_https_a_missing_hsts_is_reported(tmp_path):
    """The TLS checks are silenced only when the environment says there is no TLS."""
    result = deploy_check(production_environment(tmp_path, KILN_TLS="on", SECURE_HSTS_SECONDS="0"))
    assert result.returncode != 0
    assert "security.W004" in result.stdout + result.stderr


def test_plain_http_with_secure_cookies_asked_for_is_reported(tmp_path):
    environment = {**production_environment(tmp_path), "SESSION_COOKIE_SECURE": "on"}
    result = deploy_check(environment)
    assert result.returncode == 0, result.stdout + result.stderr  # nothing left to warn about
    seen = settings_seen(environment, "SILENCED_SYSTEM_CHECKS", "CSRF_COOKIE_SECURE")
    assert seen == {"SILENCED_SYSTEM_CHECKS": ["security.W004", "security.W008"], "CSRF_COOKIE_SECURE": True}


def test_a_bad_tls_value_names_the_variable(tmp_path):
    result = run_manage("check", environment=production_environment(tmp_path, KILN_TLS="maybe"))
    assert result.returncode != 0
    assert "kiln: configuration error: KILN_TLS='maybe' is not one of: off, on." in result.stderr
    assert "Traceback" not in result.stderr


def test_over_plain_http_cookies_are_not_secure(client, operator):
    response = client.post("/login/", {"username": operator.username, "password": operator.plain_password})
    assert response.status_code == 302
    assert response.cookies["sessionid"]["secure"] == ""
    assert "Strict-Transport-Security" not in response.headers


@pytest.fixture
def gunicorn_over_https(transactional_db, redis_clean, tmp_path):
    """The web process as docker-compose.yml starts it (gunicorn, Kiln's uvicorn
    worker), with KILN_TLS=on; the test plays the TLS proxy on this host."""
    port = free_port()
    log = tmp_path / "gunicorn.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "dashboard.asgi:application", "-k", "dashboard.workers.UvicornWorker",
         "-b", f"127.0.0.1:{port}", "-w", "1"],
        cwd=REPO, env=child_env(KILN_TLS="on", FORWARDED_ALLOW_IPS="127.0.0.1,::1"), stdout=log.open("wb"),
        stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def up():
        assert process.poll() is None, log.read_text()
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 60, "gunicorn start")
    yield url
    stop_group(process)


def live_socket_stays_open(url, cookie, origin):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with connect(url.replace("http://", "ws://") + "/ws/live/", origin=origin, open_timeout=10,
                 additional_headers={"Cookie": cookie, "X-Forwarded-Proto": "https"}) as socket:
        try:
            socket.recv(timeout=1.5)
        except TimeoutError:
            pass  # open and quiet: no monitor runs here
        except ConnectionClosed as closed:
            raise AssertionError(f"the live websocket was closed: {closed}") from None


def test_over_https_behind_a_proxy(gunicorn_over_https, operator):
    url = gunicorn_over_https
    proxied = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
    with httpx.Client(base_url=url, headers=proxied) as browser:
        page = browser.get("/login/")
        assert page.status_code == 200
        assert page.headers["strict-transport-security"] == "max-age=31536000; includeSubDomains"
        assert "; secure" in page.headers["set-cookie"].lower()  # the csrftoken cookie
        assert "wss://127.0.0.1" in page.headers["content-security-policy"]
        # The proxy speaks http to Kiln, so httpx keeps the secure cookie to itself: send it as a browser would.
        token = page.cookies["csrftoken"]
        signed_in = browser.post("/login/", data={"username": operator.username, "password": operator.plain_password,
                                                  "csrfmiddlewaretoken": token},
                                 headers={"Origin": "https://127.0.0.1:" + url.rsplit(":", 1)[1],
                                          "Cookie": f"csrftoken={token}"})
        assert signed_in.status_code == 302, signed_in.text
        session_cookie = [c for c in signed_in.headers.get_list("set-cookie") if c.startswith("sessionid=")]
        assert session_cookie and "; secure" in session_cookie[0].lower()
    # The live websocket through the proxy: wss for the page at https://<host>.
    live_socket_stays_open(url, session_cookie[0].split(";")[0], origin="https://127.0.0.1:" + url.rsplit(":", 1)[1])
    # Straight to the web process in plain http: sent to https, except the health check.
    plain = httpx.get(f"{url}/login/")
    assert plain.status_code == 301 and plain.headers["location"].startswith("https://127.0.0.1:")
    assert "strict-transport-security" not in plain.headers
    assert httpx.get(f"{url}/healthz").status_code == 200
    # The proxy's plain-http side is sent to https too.
    assert httpx.get(f"{url}/login/", headers={"X-Forwarded-Proto": "http"}).status_code == 301


PAGES = ["/", "/models/", "/deployments/", "/benchmarks/", "/monitoring/", "/monitoring/history", "/playground/",
         "/keys/", "/users/", "/api/docs", "/api/status"]


def policy(response):
    header = response.headers["Content-Security-Policy"]
    directives = {}
    for part in header.split(";"):
        name, *sources = part.split()
        directives[name] = sources
    return directives


def assert_strict(directives):
    scripts = directives.get("script-src", directives["default-src"])
    assert scripts == ["'self'"], scripts
    assert directives["default-src"] == ["'self'"]
    assert directives["frame-ancestors"] == ["'none'"] and directives["object-src"] == ["'none'"]
    assert directives["base-uri"] == ["'self'"] and directives["form-action"] == ["'self'"]


def test_every_page_carries_a_policy_without_inline_scripts(client, operator, redis_server):
    directives = policy(client.get("/login/"))
    assert_strict(directives)
    assert directives["connect-src"] == ["'self'", "ws://testserver"]
    client.force_login(operator)
    for path in PAGES:
        response = client.get(path)
        assert response.status_code == 200, path
        assert_strict(policy(response))
    assert_strict(policy(client.get("/no-such-page/")))


def test_a_foreign_host_is_still_a_400(client):
    response = client.get("/login/", HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert_strict(policy(response))
    assert "evil.example" not in response.headers["Content-Security-Policy"]
