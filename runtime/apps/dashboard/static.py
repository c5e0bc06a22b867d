"""Serving the dashboard's page: three files shipped in the package, answered without a token.

The page holds no secret: it asks for the bearer token itself and sends it with every request it makes,
so only the files below are public; every other path goes on to the API and its authentication.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

__all__ = ["PAGES", "DashboardFiles", "read_asset"]

PAGES: dict[str, tuple[str, str]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/dashboard/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/dashboard/style.css": ("style.css", "text/css; charset=utf-8"),
    "/dashboard/favicon.svg": ("favicon.svg", "image/svg+xml"),
    "/favicon.ico": ("favicon.svg", "image/svg+xml"),
}
"""Public path → (file in ``runtime/apps/dashboard/static/``, content type)."""

# Everything the page loads comes from this server; no inline script, nothing framed, no referrer.
_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]


def read_asset(name: str) -> bytes:
    """The bytes of a file of the page, from the installed package."""
    return resources.files("runtime.apps.dashboard").joinpath("static", name).read_bytes()


class DashboardFiles:
    """ASGI middleware: ``GET``/``HEAD`` of the page's paths (:data:`PAGES`) answered from the package;
    everything else goes to ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._cache: dict[str, bytes] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in PAGES or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        name, content_type = PAGES[scope["path"]]
        body = self._cache.get(name)
        if body is None:
            body = self._cache[name] = read_asset(name)
        headers = [
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
            *_SECURITY_HEADERS,
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
