"""Test-wide settings: keep the engine's per-request log lines out of test output."""

import logging

import structlog

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
