"""The ``hetero-infer`` command."""

from hetero_core.cli.main import main

__all__ = ["main"]
