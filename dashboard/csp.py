"""The Content-Security-Policy header: django-csp's middleware with the policy in
settings.CONTENT_SECURITY_POLICY, plus the page's own websocket origin.

CSP Level 3 lets 'self' match ws:/wss: on the page's own host (Chromium and
Firefox do), but older Safari releases did not; naming the origin the live pages
connect to (kiln.js: ws[s]://<this host>/ws/live/) costs nothing.
"""
from csp.middleware import CSPMiddleware
from django.core.exceptions import DisallowedHost


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    def get_policy_parts(self, request, response, report_only=False):
        parts = super().get_policy_parts(request, response, report_only)
        try:
            host = request.get_host()  # checked against ALLOWED_HOSTS: safe in a header
        except DisallowedHost:
            return parts  # the 400 for a foreign Host: 'self' is enough
        update = dict(parts.update or {})
        update["connect-src"] = [*update.get("connect-src", ()), f"{'wss' if request.is_secure() else 'ws'}://{host}"]
        parts.update = update
        return parts
