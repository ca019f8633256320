"""Every failure answered in OpenAI's error shape, with the right status code."""

from __future__ import annotations

import uuid

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from hetero_core.errors import EngineError, ErrorKind

log = structlog.get_logger()

STATUS = {
    ErrorKind.VALIDATION: 400,
    ErrorKind.CONFIG: 400,
    ErrorKind.MEMORY: 400,  # a request that could never fit the KV cache
    ErrorKind.SCHEDULER: 503,  # the waiting queue is full: retry later
    ErrorKind.EXECUTION: 500,
}
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    502: "upstream_error",
    503: "server_overloaded",
}


class APIError(Exception):
    """An error the server answers directly."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "internal_error"), "param": param, "code": code}}


def respond(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def engine_error_response(exc: EngineError) -> JSONResponse:
    status = STATUS[exc.kind]
    if status == 500:  # the engine's fault: its text stays in the log
        return JSONResponse(internal_error_body(exc), status_code=500)
    headers = {"Retry-After": "1"} if status == 503 else None
    return respond(status, exc.message, param=exc.param, code=exc.kind.value, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_request: Request, exc: APIError) -> JSONResponse:
        return respond(exc.status, exc.message, param=exc.param, code=exc.code, headers=exc.headers)

    @app.exception_handler(EngineError)
    async def engine_error(_request: Request, exc: EngineError) -> JSONResponse:
        return engine_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = _most_specific(exc.errors())
        if first.get("type") == "json_invalid":
            return respond(
                400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".rstrip(": ")
            )
        location = [str(p) for p in first.get("loc", ()) if p != "body" and not _is_type_tag(p)]
        message = first.get("msg", "invalid request body")
        if first.get("type") == "extra_forbidden":
            message = "this server does not support this field"
        return respond(
            400, f"{'.'.join(location) + ': ' if location else ''}{message}", param=location[0] if location else None
        )

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return respond(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(internal_error_body(exc), status_code=500)


def _most_specific(errors: list[dict]) -> dict:
    """Of the first field's errors (one per member of a union), the one that got deepest into the value."""
    if not errors:
        return {}
    field = errors[0].get("loc", ())[:2]
    return max((e for e in errors if e.get("loc", ())[:2] == field), key=lambda e: len(e.get("loc", ())))


def _is_type_tag(part: object) -> bool:
    """pydantic's union members in an error location (``str``, ``list[int]``, ``function-after[...]``), not fields."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part)


def internal_error_body(exc: Exception) -> dict:
    """Log an unexpected exception under a fresh id and describe it to the client by that id only."""
    error_id = uuid.uuid4().hex[:12]
    log.error("internal error", error_id=error_id, error=f"{type(exc).__name__}: {exc}", exc_info=exc)
    return error_body(500, f"internal error (id {error_id})", code="internal_error")
