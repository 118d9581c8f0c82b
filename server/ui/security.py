"""Headers on every response, and the Origin check on every form post of the pages."""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# No inline script anywhere (scripts are files under /static); SVG charts use presentation
# attributes, never style attributes, so styles too come only from files.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def is_page_path(path: str) -> bool:
    """Pages are everything the browser UI serves; the JSON API, static files and the API
    documentation keep their own error shapes."""
    return not path.startswith(("/api/", "/static/", "/docs", "/openapi.json", "/redoc"))


class SecurityMiddleware:
    """A pure ASGI middleware (no response buffering, so server-sent events still stream)."""

    def __init__(self, app: ASGIApp, public_url: str) -> None:
        self.app = app
        self.public_origin = _origin(public_url)

    def _origin_allowed(self, scope: Scope, headers: Headers) -> bool:
        origin = headers.get("origin")
        if origin is None:
            return True  # not a browser form post (browsers send Origin on every POST)
        own = f"{scope.get('scheme', 'http')}://{headers.get('host', '')}".lower()
        return origin.lower() in (own, self.public_origin)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if (
            scope["method"] == "POST"
            and is_page_path(scope["path"])
            and not self._origin_allowed(scope, headers)
        ):
            response = PlainTextResponse(
                "cross-origin form post refused", status_code=403, headers=SECURITY_HEADERS
            )
            await response(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                response_headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in response_headers:
                        response_headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
