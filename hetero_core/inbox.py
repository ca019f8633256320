"""Where submitting threads hand requests and aborts to the stepping thread.

Submitting and aborting are thread-safe: they only touch the inbox, under
its lock. The stepping thread takes everything queued so far once per
step (:meth:`Inbox.take`) and owns the requests from then on.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from typing import Any, Callable

from hetero_core.errors import SchedulerError, ValidationError
from hetero_core.params import GenerationParams
from hetero_core.sequence import Request


class Inbox:
    """The engine's live requests by id, and the submissions and aborts not yet taken by a step."""

    def __init__(self, max_waiting_requests: int) -> None:
        self.max_waiting_requests = max_waiting_requests
        self._requests: dict[str, Request] = {}
        self._new: list[Request] = []
        self._aborts: list[str] = []
        self._lock = threading.Lock()
        self._arrivals = itertools.count()

    def put(
        self,
        prompt_text: str,
        token_ids: list[int],
        params: GenerationParams,
        request_id: str | None,
        on_output: Callable[[Any], None] | None,
        grammar: Any,
        num_waiting: int,
    ) -> str:
        """Queue a checked request; its id (made up when None). ``num_waiting``: how many the scheduler already
        holds."""
        with self._lock:
            request_id = request_id or uuid.uuid4().hex
            if request_id in self._requests:
                raise ValidationError(f"request id {request_id!r} is already in use", param="request_id")
            if num_waiting + len(self._new) >= self.max_waiting_requests:
                raise SchedulerError(f"the waiting queue is full ({self.max_waiting_requests} requests)")
            request = Request(
                request_id=request_id,
                prompt_text=prompt_text,
                prompt_token_ids=token_ids,
                params=params,
                arrival_index=next(self._arrivals),
                arrival_time=time.monotonic(),
                on_output=on_output,
                grammar=grammar,
            )
            self._requests[request_id] = request
            self._new.append(request)
        return request_id

    def abort(self, request_id: str) -> bool:
        """Ask for a request's end at the next step. False if it is unknown or finished."""
        with self._lock:
            request = self._requests.get(request_id)
            if request is None or request.is_finished:
                return False
            self._aborts.append(request_id)
            return True

    def take(self) -> tuple[list[Request], list[Request]]:
        """The requests submitted since the last call, and the live requests to abort."""
        with self._lock:
            new, self._new = self._new, []
            aborts, self._aborts = self._aborts, []
            aborted = [r for r in (self._requests.get(i) for i in aborts) if r is not None]
        return new, aborted

    def withdraw(self, request_ids: list[str]) -> None:
        """Forget requests not yet taken, as if never submitted."""
        withdrawn = set(request_ids)
        with self._lock:
            self._new = [r for r in self._new if r.request_id not in withdrawn]
            for request_id in withdrawn:
                self._requests.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        """A finished request leaves: its id may be used again."""
        with self._lock:
            self._requests.pop(request_id, None)

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._new or self._aborts)
