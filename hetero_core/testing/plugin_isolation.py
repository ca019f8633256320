"""Test the core or one plugin with only the plugins it names loaded, and put logging back after each test.

:func:`isolate_plugins` makes the two autouse fixtures a ``conftest.py`` needs
to hide the other installed plugins' entry points from
:func:`hetero_core.plugins.create_plugin_manager` (the built-ins still load)::

    from hetero_core.testing.plugin_isolation import isolate_plugins

    only_my_plugin, integration_sees_every_plugin = isolate_plugins("my-plugin")

A module marked ``integration`` (``pytestmark``), or a test marked so in
another module, sees every installed plugin. The fixtures are named
``isolated_plugins`` (module-scoped) and ``every_plugin_for_integration_tests``;
a folder's ``conftest.py`` that defines its own ``isolated_plugins`` overrides
the isolation for its modules. The root ``conftest.py`` registers this module
as a pytest plugin, so :func:`restore_logging` runs around every test.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
from typing import Any, Iterator

import pytest
import structlog

from hetero_core import plugins
from hetero_core.logs import LIBRARY_LOGGER

# What ``hetero_core.plugins`` finds when nothing hides the installed plugins (taken before any test patches it).
installed_entry_points = plugins._entry_points


@contextlib.contextmanager
def installed_plugins() -> Iterator[None]:
    """Every installed plugin, for a fixture of integration tests that an isolated module may set up first."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plugins, "_entry_points", installed_entry_points)
        yield


def isolate_plugins(*names: str) -> tuple[Any, Any]:
    """Two autouse fixtures: a module sees only the installed plugins ``names`` (module-scoped, so that its
    engines and servers are built that way too), and a test marked ``integration`` sees every one."""

    def named_only() -> dict[str, importlib.metadata.EntryPoint]:
        return {name: ep for name, ep in installed_entry_points().items() if name in names}

    @pytest.fixture(autouse=True, scope="module", name="isolated_plugins")
    def isolated(request: pytest.FixtureRequest) -> Iterator[None]:
        if request.node.get_closest_marker("integration") is not None:  # a module of integration tests
            yield
            return
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(plugins, "_entry_points", named_only)
            yield

    @pytest.fixture(autouse=True, name="every_plugin_for_integration_tests")
    def every_plugin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
        if request.node.get_closest_marker("integration") is not None:
            monkeypatch.setattr(plugins, "_entry_points", installed_entry_points)

    return isolated, every_plugin


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """The CLI configures logging for its process (a test may run it in-process): put the settings back."""
    saved = structlog.get_config()
    library = logging.getLogger(LIBRARY_LOGGER)
    handlers, level, propagate = list(library.handlers), library.level, library.propagate
    yield
    structlog.configure(**saved)
    library.handlers[:], library.level, library.propagate = handlers, level, propagate
