"""The ``command_bridge`` backend: answer each request by running a configured program.

The program runs without a shell, with the prompt and parameters in the
environment (``HETERO_PROMPT``, ``HETERO_MAX_TOKENS``, ``HETERO_TEMPERATURE``,
``HETERO_TOP_P``); its stdout is the completion and its stderr is logged.
A non-zero exit, a timeout or a missing program fails the request with 502.
At most ``command_concurrency`` programs run at once; the rest wait.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Mapping, Sequence

import structlog

from hetero_core.config import ServerConfig
from hetero_core.outputs import StreamDelta
from hetero_core.params import GenerationParams
from hetero_core.sequence import FinishReason

log = structlog.get_logger()


class CommandBridge:
    """The ``command_bridge`` serving backend (a :class:`~hetero_core.server.backend.ServingBackend`)."""

    error_status = 502  # the program failed, not the server
    tokenizer = None
    max_model_len = None
    error: str | None = None
    is_ready = True

    def __init__(self, server: ServerConfig) -> None:
        self.command = list(server.command)
        self.timeout = server.command_timeout
        self._limit = asyncio.Semaphore(server.command_concurrency)
        self._tasks: dict[str, asyncio.Task] = {}

    def engine_metrics(self) -> dict:
        return {}

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def stop(self, drain_timeout: float) -> None:
        for task in list(self._tasks.values()):
            self._loop.call_soon_threadsafe(task.cancel)

    def submit(
        self,
        prompt: str | Sequence[int] | None,
        messages: Sequence[Mapping[str, Any]] | None,
        params: GenerationParams,
        request_id: str,
        queue: asyncio.Queue,
        tag: int,
    ) -> None:
        if messages is not None:
            prompt = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        elif not isinstance(prompt, str):
            prompt = " ".join(str(t) for t in prompt)
        for index in range(params.n):
            task = asyncio.ensure_future(self._run(prompt, params, request_id, index, queue, tag))
            self._tasks[f"{request_id}/{index}"] = task
            task.add_done_callback(lambda _t, key=f"{request_id}/{index}": self._tasks.pop(key, None))

    def abort(self, request_id: str) -> None:
        for key, task in list(self._tasks.items()):
            if key.startswith(f"{request_id}/"):
                task.cancel()

    async def _run(self, prompt: str, params: GenerationParams, request_id: str, index: int, queue: asyncio.Queue, tag: int) -> None:
        env = {
            **os.environ,
            "HETERO_PROMPT": prompt,
            "HETERO_MAX_TOKENS": str(params.max_tokens),
            "HETERO_TEMPERATURE": str(params.temperature),
            "HETERO_TOP_P": str(params.top_p),
        }
        async with self._limit:
            text, error = await self._execute(env, request_id)
        reason = FinishReason.ERROR if error else FinishReason.STOP
        queue.put_nowait((tag, StreamDelta(request_id, index, text, [], None, reason, 0, error)))

    async def _execute(self, env: dict[str, str], request_id: str) -> tuple[str, str | None]:
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except OSError as exc:
            return "", f"cannot run {self.command[0]!r}: {exc.strerror}"
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), self.timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            process.kill()
            await process.wait()
            if isinstance(exc, asyncio.CancelledError):
                raise
            return "", f"the bridge program timed out after {self.timeout} s"
        if stderr:
            log.info("bridge stderr", request_id=request_id, stderr=stderr.decode(errors="replace")[-2000:])
        if process.returncode != 0:
            return "", f"the bridge program exited with status {process.returncode}"
        return stdout.decode(errors="replace"), None
