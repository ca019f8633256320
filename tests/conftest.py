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

from typing import Any, Callable, Iterator

import pytest

from hetero_core import plugins
from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.testing.plugin_isolation import isolate_plugins

REFERENCE_PLUGIN = "hetero_core.testing.reference"


without_installed_plugins, installed_plugins_for_integration_tests = isolate_plugins()


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
