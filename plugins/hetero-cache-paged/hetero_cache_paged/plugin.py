"""Registers the ``paged`` cache allocator."""

from __future__ import annotations

from hetero_cache_paged.allocator import PagedAllocator
from hetero_core.hookspecs import Register, hookimpl


@hookimpl
def register_cache_allocators(register: Register) -> None:
    register("paged", PagedAllocator)
