"""The ``paged`` KV-cache allocator for hetero-infer."""

from hetero_cache_paged.allocator import PagedAllocator

__all__ = ["PagedAllocator"]
