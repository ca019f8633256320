"""The reference policy and allocator pass the contract kit, and serve requests in an engine."""

from __future__ import annotations

import pytest

from hetero_core.engine import InferenceEngine
from hetero_core.params import GenerationParams
from hetero_core.plugins import ComponentRegistry, create_plugin_manager
from hetero_core.testing import CacheAllocatorContract, SchedulerPolicyContract
from hetero_core.testing.reference import ArrivalOrderPolicy, ReferenceAllocator

from ..conftest import mock_config


class TestArrivalOrderPolicy(SchedulerPolicyContract):
    @pytest.fixture
    def policy(self):
        return ArrivalOrderPolicy()


class TestReferenceAllocator(CacheAllocatorContract):
    def make_allocator(self, num_blocks: int, block_size: int) -> ReferenceAllocator:
        return ReferenceAllocator(num_blocks, block_size)


def test_an_engine_of_reference_components_survives_preemption_with_sibling_samples(make_engine) -> None:
    engine = make_engine(max_num_blocks=12)
    assert isinstance(engine.policy, ArrivalOrderPolicy) and isinstance(engine.allocator, ReferenceAllocator)
    records = engine.generate(["a prompt of some length"] * 3, GenerationParams(max_tokens=16, n=2, seed=1))
    assert all(len(o.token_ids) == 16 for r in records for o in r.outputs)
    assert engine.metrics.num_preemptions > 0
    assert engine.get_memory_stats().used_blocks == 0


def test_core_tests_see_no_installed_plugin() -> None:
    registry = ComponentRegistry(create_plugin_manager())
    assert registry.names("scheduler") == [] and registry.names("cache_allocator") == []
    assert registry.names("executor") == ["mock"] and registry.names("tokenizer") == ["simple"]


@pytest.fixture(scope="module")
def module_engine():
    engine = InferenceEngine(mock_config())
    yield engine
    engine.close()


def test_module_scoped_engines_are_built_without_them_too(module_engine) -> None:
    assert module_engine.plugin_names == dict.fromkeys(["tokenizer", "executor"], "builtin") | dict.fromkeys(
        ["cache_allocator", "scheduler"], "hetero_core.testing.reference"
    )
