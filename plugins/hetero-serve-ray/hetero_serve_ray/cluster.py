"""The front end's Ray session: joining or starting the cluster, keeping the process's signal handlers, leaving it.

- **Signals.** ``ray.init`` installs Ray's C++ failure-signal handler for
  SIGTERM in the driver, which dumps a stack and aborts the process (exit
  134) instead of letting the server drain. :func:`restore_signal_handlers`
  puts back the handlers Python had, and must run on the main thread after
  :func:`connect`.
- **Authentication.** A cluster with Ray's token authentication refuses a
  driver that has none; Ray then raises a bare ``ConnectionError`` and leaves
  the cause in its warnings. :func:`connect` puts the cause in the error.
- **Logs.** Ray folds similar lines of different workers into one
  ("repeated 25x across cluster"); the package's ``__init__`` sets
  ``RAY_DEDUP_LOGS=0``, which Ray reads when it is imported, so every
  replica's "request finished" line reaches the log.
"""

from __future__ import annotations

import re
import signal
import threading

import ray
import ray.exceptions

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
AUTH_FAILURE = re.compile(r"AuthenticationError: ([^\n]*?)(?:\.\s|\.?$)", re.MULTILINE)


def connect(address: str | None) -> bool:
    """Join the cluster at ``address`` (``host:port``, or ``auto``),
    or start a private one-machine cluster when it is None. Blocks.

    Returns True when this call initialized Ray in this process (the caller then shuts it down);
    False when it already was.
    """
    if ray.is_initialized():
        return False
    if address is None:  # a private cluster, even where `ray start` made one
        # Ray runs its workers at nice 15 by default; replicas are the work itself, not background jobs
        ray.init(address="local", _system_config={"worker_niceness": 0})
        return True
    try:
        ray.init(address=address)
    except ConnectionError as exc:
        raise ConnectionError(connection_failure(address, exc)) from exc
    return True


def connection_failure(address: str, exc: BaseException) -> str:
    """Why ``ray.init(address)`` failed: Ray's message, or the authentication failure its exception chain holds."""
    link: BaseException | None = exc
    while link is not None:
        found = AUTH_FAILURE.search(f"{type(link).__name__}: {link}")
        if found or isinstance(link, ray.exceptions.AuthenticationError):
            detail = found.group(1) if found else getattr(link, "message", str(link))
            return (
                f"the Ray cluster at {address} uses token authentication and refused this process ({detail}):"
                " set RAY_AUTH_MODE=token for every `ray start` and for hetero-infer, with the cluster's token in"
                " ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN (docs/scale-out.md)"
            )
        link = link.__cause__ or link.__context__
    return str(exc)


def restore_signal_handlers() -> None:
    """Make Python's handlers for SIGINT and SIGTERM current again (Ray's replaced them below Python).
    Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in HANDLED_SIGNALS:
        handler = signal.getsignal(sig)
        if handler is not None:  # None: a handler Python did not install; leave it
            signal.signal(sig, handler)
