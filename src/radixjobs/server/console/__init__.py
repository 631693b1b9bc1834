"""The web console served by the daemon at ``/`` of its HTTP port (docs/console.md).

Invariants:
- Everything but ``/healthz``, ``/metrics``, ``/status`` (anonymous, counts only), the login form and the
  shipped static files requires authentication (auth.py); every action also a CSRF token.
- Every response carries the security headers below: a CSP that allows only this origin's own script and
  style files (no inline script, no framing, forms post only here), no sniffing, no referrer to other sites.
- Pages, templates, style and script ship inside the package: no build step, nothing from elsewhere.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixjobs.server.console.auth import AuthMode, ConsoleAuth

__all__ = ["AuthMode", "ConsoleAuth", "SecurityHeaders"]

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make forms send "Origin: null"
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


class SecurityHeaders:
    """ASGI middleware: the headers above on every HTTP response."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in HEADERS}
                message["headers"] = [*(h for h in message.get("headers", []) if h[0] not in names), *HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)
