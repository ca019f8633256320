"""``hetero-infer serve``: the server's flags over the engine's, then :func:`~hetero_serve_openai.run.serve`."""

from __future__ import annotations

import argparse
import os

from hetero_core.cli.options import add_engine_arguments, engine_config
from hetero_core.logs import configure_logging, get_logger
from hetero_serve_openai.auth import API_KEY_ENV
from hetero_serve_openai.config import server_config

log = get_logger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hetero-infer serve", description="The OpenAI-compatible HTTP server.")
    parser.add_argument("--host", help="server address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="server port (default 8000)")
    parser.add_argument("--api-key", help=f"require this bearer token (also {API_KEY_ENV})")
    parser.add_argument("--debug", action="store_true", help="debug logs and tracebacks")
    add_engine_arguments(parser)
    return parser


def serve_command(argv: list[str]) -> int:
    """Serve until SIGINT/SIGTERM (exit 0); a backend that fails raises (exit non-zero)."""
    from hetero_serve_openai.run import serve  # the web stack, only now

    args = build_parser().parse_args(argv)
    configure_logging(debug=args.debug)
    config = engine_config(args)
    flags = {
        key: value
        for key, value in (("host", args.host), ("port", args.port), ("api_key", args.api_key))
        if value is not None
    }
    if flags:
        config = config.evolve(server=flags)  # merged onto the file's section
    server = server_config(config)
    if os.environ.get(API_KEY_ENV) == "" and server.api_key is None:
        log.warning("the API key variable is set but empty: the server requires no API key", variable=API_KEY_ENV)
    serve(config)
    return 0
