"""Core tests: the core alone, on reference components.

Every test under ``tests/`` runs without the installed plugins, except
the ``integration`` ones: the autouse fixture below hides the ``hetero_infer``
entry points from :func:`hetero_core.plugins.create_plugin_manager`, so each
engine, server or CLI built in-process gets a fresh plugin manager holding
the built-in plugin (the ``simple`` tokenizer and the ``mock`` executor) and
:mod:`hetero_core.testing.reference` (the ``reference`` scheduler policy
and cache allocator), which :func:`mock_config` names in ``plugins.load``.
No plugin package is imported. A test that needs another plugin (the
schedulers, the paged allocator, the Hugging Face tokenizer, the torch
executor, the grammar engine, the server, Ray) lives in ``tests/integration/``
(each test there is marked ``integration`` by the root ``conftest.py``) or in
that plugin's own ``tests/``, or, when it shares a module's helpers with core
tests, carries the ``integration`` marker itself. Integration tests see every
installed plugin.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
from typing import Any, Callable, Iterator

import pytest
import structlog

from hetero_core import plugins
from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.logs import LIBRARY_LOGGER

REFERENCE_PLUGIN = "hetero_core.testing.reference"


def installed_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """What ``hetero_core.plugins`` finds when nothing hides the installed plugins."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=plugins.ENTRY_POINT_GROUP)}


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """The CLI configures logging for the process (a test may run it in-process): put the test-wide settings back."""
    saved = structlog.get_config()
    library = logging.getLogger(LIBRARY_LOGGER)
    handlers, level, propagate = list(library.handlers), library.level, library.propagate
    yield
    structlog.configure(**saved)
    library.handlers[:], library.level, library.propagate = handlers, level, propagate


@pytest.fixture(autouse=True, scope="module")
def without_installed_plugins(request: pytest.FixtureRequest) -> Iterator[None]:
    """No entry point is loaded: only the built-ins and the plugins a test names itself.

    Module-scoped, so that the module's servers and engines are built without them too.
    """
    if request.node.get_closest_marker("integration") is not None:  # a module of integration tests
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plugins, "_entry_points", dict)
        yield


@pytest.fixture(autouse=True)
def installed_plugins_for_integration_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``integration`` test in a module of core tests sees the installed plugins again."""
    if request.node.get_closest_marker("integration") is not None:
        monkeypatch.setattr(plugins, "_entry_points", installed_entry_points)


@contextlib.contextmanager
def installed_plugins() -> Iterator[None]:
    """The installed plugins, for a fixture of integration tests that a core module may set up first."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plugins, "_entry_points", installed_entry_points)
        yield


def core_plugin_manager(*inline: tuple[Any, str]) -> plugins.PluginManager:
    """A fresh plugin manager: the built-ins, the reference components and ``inline`` (object, name) plugins."""
    pm = plugins.create_plugin_manager(entry_points=False, load=[REFERENCE_PLUGIN])
    for plugin, name in inline:
        pm.register(plugin, name=name)
    return pm


def mock_config(**overrides: Any) -> EngineConfig:
    """An engine config for the byte-level tokenizer, the deterministic mock executor and the reference components."""
    values: dict[str, Any] = dict(
        tokenizer="simple",
        executor="mock",
        scheduler="reference",
        cache_allocator="reference",
        block_size=4,
        max_num_blocks=64,
        plugins={"load": [REFERENCE_PLUGIN]},
    )
    values.update(overrides)
    return EngineConfig.from_mapping(values)


def engine_maker(config_for: Callable[..., EngineConfig]) -> Iterator[Callable[..., InferenceEngine]]:
    """A fixture's body: ``make(**overrides)`` builds an engine on ``config_for(**overrides)``; each is closed after
    the test."""
    engines: list[InferenceEngine] = []

    def make(**overrides: Any) -> InferenceEngine:
        engine = InferenceEngine(config_for(**overrides))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


@pytest.fixture
def make_engine():
    yield from engine_maker(mock_config)
