"""Read each request body whole before the app sees it: 413 past ``server.max_body_bytes``,
408 past ``server.read_timeout``.

A declared Content-Length over the limit is refused at once; a chunked body
is counted as it arrives. A request that declares both a Content-Length and
a Transfer-Encoding is a 400: its body could be read two ways (the way
requests are smuggled past a proxy). Every endpoint parses its body whole anyway, so
reading it here costs nothing and keeps a slow or endless upload from
holding a handler.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hetero_serve_openai.errors import error_body


class BodyLimits:
    """Pure ASGI middleware; the app then receives the whole body as one message."""

    def __init__(self, app: Any, *, max_bytes: int, read_timeout: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout = read_timeout

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if b"content-length" in headers and b"transfer-encoding" in headers:
            await _refuse(send, 400, "a request may not declare both Content-Length and Transfer-Encoding")
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _refuse(send, 413, f"request body larger than {self.max_bytes} bytes")
            return
        try:
            async with asyncio.timeout(self.read_timeout):
                body = await self._read(receive)
        except TimeoutError:
            await _refuse(send, 408, f"the request body did not arrive within {self.read_timeout} s")
            return
        except _TooLarge:
            await _refuse(send, 413, f"request body larger than {self.max_bytes} bytes")
            return
        if body is None:  # the client left
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()  # only a disconnect can follow
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, receive: Any) -> bytes | None:
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                raise _TooLarge
            if not message.get("more_body", False):
                return bytes(body)


class _TooLarge(Exception):
    pass


async def _refuse(send: Any, status: int, message: str) -> None:
    body = json.dumps(error_body(status, message)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
