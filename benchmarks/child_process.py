"""Each peer of a benchmark runs in a fresh process of the same script, so its memory and start are its own.

The child prints its figures as one JSON line after :data:`MARK`; the parent
reads the last such line, or reports the child's failure and goes on.
"""

from __future__ import annotations

import json
import subprocess
import sys

MARK = "RESULT "


def spawn(script: str, child: str, what: str, argv: list[str]) -> dict | None:
    """Run ``script`` with ``argv`` and ``--child child``; its figures, or None (told on stderr) when it failed."""
    done = subprocess.run([sys.executable, script, *argv, "--child", child], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode or not lines:
        print(f"  {what} failed (exit {done.returncode}):\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1][len(MARK) :])


def report(figures: dict) -> None:
    """The child's side: print ``figures`` for :func:`spawn`."""
    print(MARK + json.dumps(figures), flush=True)
