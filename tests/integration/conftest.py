"""Integration tests: the core together with the installed plugins.

Every test under this folder is marked ``integration`` (by the root
``conftest.py``) and sees every installed ``hetero_infer`` entry point, as
an application would; where no plugin is installed, the folder is not
collected. :func:`plugin_config` is the fast configuration for
them: the ``simple`` tokenizer and the ``mock`` executor, with the
project's ``fcfs`` scheduler policy and ``paged`` cache allocator.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, Iterator

import pytest

from hetero_core.config import EngineConfig
from hetero_core.plugins import ENTRY_POINT_GROUP

from ..conftest import engine_maker

# The core installed alone (``make test-core``) has no plugin to integrate, and these modules import them: not
# collected.
collect_ignore_glob = [] if importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) else ["*"]


@pytest.fixture(autouse=True, scope="module")
def isolated_plugins() -> Iterator[None]:
    """Overrides the core tests' isolation fixture (``hetero_core.testing.plugin_isolation``): here the installed
    plugins load, for module-scoped fixtures too."""
    yield


def plugin_config(**overrides: Any) -> EngineConfig:
    values: dict[str, Any] = dict(
        tokenizer="simple", executor="mock", scheduler="fcfs", cache_allocator="paged", block_size=4, max_num_blocks=64
    )
    values.update(overrides)
    return EngineConfig.from_mapping(values)


@pytest.fixture
def make_engine():
    yield from engine_maker(plugin_config)
