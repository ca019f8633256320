"""The API key: checked on the raw request, before its body is read or parsed.

The key comes from ``server.api_key`` or else ``HETERO_API_KEY`` (an empty
value means none). It must be printable ASCII without spaces, as an HTTP
header can carry it; another key is refused at start-up. ``/healthz`` and
``/readyz`` are always open; ``/metrics`` and the OpenAPI docs are open
unless ``server.protect_metrics_and_docs`` is set.
"""

from __future__ import annotations

import hmac
import json
import os
from typing import Any

from hetero_core.errors import ConfigError
from hetero_serve_openai.config import ServerConfig
from hetero_serve_openai.errors import error_body

API_KEY_ENV = "HETERO_API_KEY"  # the API key when the config names none
ALWAYS_OPEN = frozenset({"/healthz", "/readyz"})
METRICS_AND_DOCS = frozenset({"/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def api_key(server: ServerConfig) -> str | None:
    """The configured key, or None for an open server; ConfigError for a key no client could send."""
    key = server.api_key or os.environ.get(API_KEY_ENV) or None
    if key is not None and not (isinstance(key, str) and key.isascii() and key.isprintable() and " " not in key):
        source = "server.api_key" if server.api_key else API_KEY_ENV
        raise ConfigError(
            f"{source} must be a string of printable ASCII without spaces (an HTTP header carries it)", param="api_key"
        )
    return key


class APIKeyCheck:
    """Pure ASGI middleware: 401 unless ``Authorization: Bearer <key>``, for every path but the open ones.

    The scheme is matched whatever its case (``bearer``, ``BEARER``), as HTTP has it; the key exactly.
    """

    def __init__(self, app: Any, key: str, *, protect_metrics_and_docs: bool) -> None:
        self.app = app
        self.expected = key.encode()
        self.open_paths = ALWAYS_OPEN if protect_metrics_and_docs else ALWAYS_OPEN | METRICS_AND_DOCS

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
        scheme, _, credentials = given.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.lstrip(b" "), self.expected):
            await self.app(scope, receive, send)
            return
        body = json.dumps(
            error_body(401, "missing or invalid API key (send 'Authorization: Bearer <key>')", code="invalid_api_key")
        )
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body.encode()})
