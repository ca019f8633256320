"""A small local Ray cluster per test module, on the loopback interface only."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray then binds and advertises 127.0.0.1 only
sys.path.insert(0, str(Path(__file__).parent))  # the tests import serve_ray_harness

import ray  # noqa: E402
from serve_ray_harness import OBJECT_STORE_BYTES  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A one-node cluster with two CPUs' worth of slots and a small object store; yields its address."""
    ray.init(
        address="local",
        num_cpus=2,
        object_store_memory=OBJECT_STORE_BYTES,
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
