"""Registers the ``paged`` cache allocator."""

from __future__ import annotations

import attrs

from hetero_cache_paged.allocator import PagedAllocator
from hetero_core.errors import ConfigError
from hetero_core.hookspecs import Register, hookimpl
from hetero_core.validators import boolean


@attrs.frozen
class PagedOptions:
    """The ``paged`` allocator's options."""

    enable_prefix_caching: bool = attrs.field(default=True, validator=boolean(error=ConfigError))


@hookimpl
def register_cache_allocators(register: Register) -> None:
    register("paged", PagedAllocator, options=PagedOptions)
