"""The OpenAI-compatible HTTP server."""

from hetero_core.server.app import create_app
from hetero_core.server.run import serve

__all__ = ["create_app", "serve"]
