"""The ``command_bridge`` backend: answer each request by running a configured program.

The program runs without a shell (a ``command`` given as one string is split
with :func:`shlex.split`). Its environment is minimal: the request's
``HETERO_PROMPT``, ``HETERO_MAX_TOKENS``, ``HETERO_TEMPERATURE`` and
``HETERO_TOP_P``, plus only ``PASSED_ENVIRONMENT`` from the server's own
environment (never its API key or other secrets). Its stdout is the
completion (at most ``command_max_output_bytes``; the program is killed once
it writes more) and the tail of its stderr is logged. Every failure (a prompt
an environment variable cannot carry, a missing program, a non-zero exit, a
timeout, too much output) fails the request with 502 and the reason. The
program is given only the prompt, ``max_tokens``, ``temperature`` and
``top_p``, and runs ``n`` times: a request that sets any other parameter
(``logprobs``, ``logit_bias``, a constraint, ``stop``, ...) or sends token
ids is refused with a 400 naming the field. At most ``command_concurrency``
programs run at once; the rest wait.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from typing import Any, Mapping, Sequence

import structlog

from hetero_core.outputs import StreamDelta
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason
from hetero_serve_openai.config import ServerConfig
from hetero_serve_openai.errors import APIError

log = structlog.get_logger()

PASSED_ENVIRONMENT = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
READ_CHUNK = 64 * 1024  # bytes read from the program's pipes at a time
STDERR_TAIL = 2000  # bytes of the program's stderr kept for the log


class CommandBridge:
    """The ``command_bridge`` serving backend (a :class:`~hetero_core.serving.ServingBackend`)."""

    error_status = 502  # the program failed, not the server
    capabilities = frozenset(
        {"n"}
    )  # and the baseline (max_tokens, temperature, top_p): the rest is refused, not dropped
    tokenizer = None
    max_model_len = None
    error: str | None = None
    is_ready = True

    def __init__(self, server: ServerConfig) -> None:
        self.command = list(server.command)
        self.timeout = server.command_timeout
        self.max_output_bytes = server.command_max_output_bytes
        self._limit = asyncio.Semaphore(server.command_concurrency)
        self._runs: dict[str, concurrent.futures.Future] = {}

    def engine_metrics(self) -> dict:
        return {}

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def stop(self, drain_timeout: float) -> None:
        for run in list(self._runs.values()):
            run.cancel()

    def submit(
        self,
        prompt: str | Sequence[int] | None,
        messages: Sequence[Mapping[str, Any]] | None,
        params: GenerationParams,
        request_id: str,
        queue: asyncio.Queue,
        tag: int,
    ) -> None:
        """Start ``params.n`` runs of the program; callable from any thread."""
        if messages is not None:
            prompt = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        elif not isinstance(prompt, str):
            raise APIError(
                400, "a prompt of token ids needs a backend with a tokenizer; this one takes text", param="prompt"
            )
        for index in range(params.n):
            key = f"{request_id}/{index}"
            run = asyncio.run_coroutine_threadsafe(self._run(prompt, params, request_id, index, queue, tag), self._loop)
            self._runs[key] = run
            run.add_done_callback(lambda _run, key=key: self._runs.pop(key, None))

    def abort(self, request_id: str) -> None:
        for key, run in list(self._runs.items()):
            if key.startswith(f"{request_id}/"):
                run.cancel()

    async def _run(
        self, prompt: str, params: GenerationParams, request_id: str, index: int, queue: asyncio.Queue, tag: int
    ) -> None:
        request_env = {
            "HETERO_PROMPT": prompt,
            "HETERO_MAX_TOKENS": str(params.max_tokens),
            "HETERO_TEMPERATURE": str(params.temperature),
            "HETERO_TOP_P": str(params.top_p),
        }
        try:
            async with self._limit:
                text, error = await self._execute(request_env, request_id)
        except Exception as exc:  # a fault of the server's own: still a 502 with a reason, never a hung request
            log.error("bridge run failed", request_id=request_id, error=f"{type(exc).__name__}: {exc}", exc_info=exc)
            text, error = "", f"the bridge program could not be run ({type(exc).__name__})"
        reason = FinishReason.ERROR if error else FinishReason.STOP
        queue.put_nowait((tag, StreamDelta(request_id, index, text, [], None, reason, 0, error)))

    async def _execute(self, request_env: dict[str, str], request_id: str) -> tuple[str, str | None]:
        for name, value in request_env.items():
            if "\0" in value:
                return "", f"{name} holds a NUL character, which an environment variable cannot carry"
        env = {name: os.environ[name] for name in PASSED_ENVIRONMENT if name in os.environ} | request_env
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            return "", f"cannot run {self.command[0]!r}: {exc.strerror or exc}"
        except (ValueError, UnicodeError) as exc:
            return "", f"cannot pass the request to {self.command[0]!r}: {exc}"
        try:
            stdout, stderr = await asyncio.wait_for(self._collect(process), self.timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            _kill(process)
            await process.wait()
            if isinstance(exc, asyncio.CancelledError):
                raise
            return "", f"the bridge program timed out after {self.timeout} s"
        if stderr:
            log.info("bridge stderr", request_id=request_id, stderr=stderr.decode(errors="replace")[-STDERR_TAIL:])
        if stdout is None:
            return (
                "",
                f"the bridge program wrote more than server.command_max_output_bytes ({self.max_output_bytes}) bytes",
            )
        if process.returncode != 0:
            return "", f"the bridge program exited with status {process.returncode}"
        return stdout.decode(errors="replace"), None

    async def _collect(self, process: asyncio.subprocess.Process) -> tuple[bytes | None, bytes]:
        """The program's stdout (None once it passes ``max_output_bytes``:
        the program is killed) and its stderr's tail."""

        async def stdout() -> bytes | None:
            data = bytearray()
            while chunk := await process.stdout.read(READ_CHUNK):
                data += chunk
                if len(data) > self.max_output_bytes:
                    _kill(process)
                    return None
            return bytes(data)

        async def stderr_tail() -> bytes:
            tail = b""
            while chunk := await process.stderr.read(READ_CHUNK):
                tail = (tail + chunk)[-STDERR_TAIL:]
            return tail

        out, err = await asyncio.gather(stdout(), stderr_tail())
        await process.wait()
        return out, err


def _kill(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        try:
            process.kill()
        except ProcessLookupError:  # it exited between the check and the signal
            pass
