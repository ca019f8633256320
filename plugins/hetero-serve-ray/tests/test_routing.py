"""Routing policies: prefix affinity, its load fallback, forgetting a lost replica; pure Python, no Ray."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetero_core.config import EngineConfig
from hetero_core.errors import ConfigError
from hetero_serve_ray.routing import LeastLoaded, PrefixAffinity, RandomRouting, ReplicaLoad, block_hashes, make_policy

SYSTEM = list(range(100, 132))  # 8 blocks of 4 tokens


def idle(*indexes: int) -> list[ReplicaLoad]:
    return [ReplicaLoad(i, 0) for i in indexes]


def test_prompts_sharing_their_first_blocks_go_to_the_same_replica() -> None:
    policy = PrefixAffinity(block_size=4)
    first = policy.choose(SYSTEM + [1, 2, 3], [ReplicaLoad(0, 50), ReplicaLoad(1, 0)])
    assert first == 1  # nothing remembered: least loaded
    for suffix in ([7, 8], [9] * 12, []):
        assert policy.choose(SYSTEM + suffix, [ReplicaLoad(0, 0), ReplicaLoad(1, 40)]) == 1


def test_the_deepest_shared_block_decides() -> None:
    policy = PrefixAffinity(block_size=4)
    assert policy.choose(SYSTEM, [ReplicaLoad(0, 9), ReplicaLoad(1, 0)]) == 1  # replica 1 holds all 8 blocks
    assert (
        policy.choose(SYSTEM[:8], [ReplicaLoad(0, 0), ReplicaLoad(1, 5000)]) == 0
    )  # overloaded: the first 2 move to 0
    assert policy.choose(SYSTEM[:8] + [2] * 8, idle(0, 1)) == 0
    assert policy.choose(SYSTEM + [1], idle(0, 1)) == 1  # the 8th block is still replica 1's


def test_an_overloaded_replica_gives_way_to_the_least_loaded() -> None:
    policy = PrefixAffinity(block_size=4, imbalance_tokens=100, imbalance_ratio=2.0)
    assert policy.choose(SYSTEM, idle(0, 1)) == 0
    assert policy.choose(SYSTEM, [ReplicaLoad(0, 150), ReplicaLoad(1, 60)]) == 0  # 150 < 2 x 60: not overloaded
    assert policy.choose(SYSTEM, [ReplicaLoad(0, 99), ReplicaLoad(1, 0)]) == 0  # within 100 tokens of the least
    assert policy.choose(SYSTEM, [ReplicaLoad(0, 500), ReplicaLoad(1, 60)]) == 1
    assert policy.choose(SYSTEM, [ReplicaLoad(0, 0), ReplicaLoad(1, 0)]) == 1  # affinity moved with it


def test_a_lost_replica_is_forgotten() -> None:
    policy = PrefixAffinity(block_size=4)
    assert policy.choose(SYSTEM, idle(0, 1)) == 0
    policy.forget(0)
    assert policy.choose(SYSTEM, [ReplicaLoad(0, 5), ReplicaLoad(1, 0)]) == 1


def test_an_unavailable_owner_falls_back() -> None:
    policy = PrefixAffinity(block_size=4)
    assert policy.choose(SYSTEM, idle(0, 1)) == 0
    assert policy.choose(SYSTEM, [ReplicaLoad(1, 30), ReplicaLoad(2, 10)]) == 2


def test_capacity_bounds_the_memory() -> None:
    policy = PrefixAffinity(block_size=1, capacity=10)
    for start in range(0, 100, 5):
        policy.choose(list(range(start, start + 5)), idle(0))
    assert len(policy._owner) == 10


def test_block_hashes_chain_whole_blocks_only() -> None:
    assert len(list(block_hashes(list(range(10)), 4, 64))) == 2
    assert len(list(block_hashes(list(range(100)), 4, 3))) == 3
    a, b = list(block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, 64)), list(block_hashes([1, 2, 3, 4, 9, 9, 9, 9], 4, 64))
    assert a[0] == b[0] and a[1] != b[1]


loads = st.lists(st.integers(0, 10_000), min_size=1, max_size=8)


@given(loads=loads, prompts=st.lists(st.lists(st.integers(0, 50), max_size=40), min_size=1, max_size=20))
def test_every_policy_returns_one_of_the_candidates(loads: list[int], prompts: list[list[int]]) -> None:
    replicas = [ReplicaLoad(index * 3, load) for index, load in enumerate(loads)]
    allowed = {r.index for r in replicas}
    for policy in (PrefixAffinity(block_size=4), LeastLoaded(), RandomRouting(seed=1)):
        for prompt in prompts:
            assert policy.choose(prompt, replicas) in allowed


@given(loads=loads)
def test_least_loaded_picks_the_minimum(loads: list[int]) -> None:
    replicas = [ReplicaLoad(index, load) for index, load in enumerate(loads)]
    assert loads[LeastLoaded().choose([1, 2], replicas)] == min(loads)


def test_policies_by_name_and_by_path_with_options_checked() -> None:
    assert isinstance(make_policy("least_loaded", 16, {}), LeastLoaded)
    assert make_policy("prefix_affinity", 8, {"imbalance_tokens": 5}).imbalance_tokens == 5
    assert isinstance(make_policy("random", 16, {"seed": 3}), RandomRouting)
    with pytest.raises(ConfigError, match="unknown routing policy 'sticky'"):
        make_policy("sticky", 16, {})
    with pytest.raises(ConfigError, match="does not accept options \\['bogus'\\]"):
        make_policy("prefix_affinity", 16, {"bogus": 1})
    with pytest.raises(ConfigError, match="imbalance_ratio must be a number >= 1"):
        make_policy("prefix_affinity", 16, {"imbalance_ratio": 0.5})
    with pytest.raises(ConfigError, match="cannot load routing policy 'no.such.module:Policy'"):
        make_policy("no.such.module:Policy", 16, {})
    assert isinstance(make_policy("hetero_serve_ray.routing:PrefixAffinity", 4, {}), PrefixAffinity)


def test_idle_replicas_take_turns() -> None:
    policy = LeastLoaded()
    assert [policy.choose([1], idle(0, 1, 2)) for _ in range(4)] == [0, 1, 2, 0]
    assert policy.choose([1], [ReplicaLoad(0, 5), ReplicaLoad(1, 0), ReplicaLoad(2, 0)]) == 1


def test_backend_options_are_typed_and_refused_by_name_before_ray_starts() -> None:
    from hetero_serve_openai.backend import create_backend

    def build(options: dict) -> None:
        create_backend(EngineConfig.from_mapping({"data_parallel_size": 2, "server": {"backend_options": options}}))

    with pytest.raises(
        ConfigError, match="serving_backend 'ray' has no option 'bogus'; accepted: address, routing, routing_options"
    ):
        build({"bogus": 1})
    with pytest.raises(ConfigError, match="num_cpus_per_replica must be a number in \\[0, 1024\\], got -1"):
        build({"num_cpus_per_replica": -1})
    with pytest.raises(ConfigError, match="max_restarts must be an integer"):
        build({"max_restarts": 1.5})
    with pytest.raises(ConfigError, match="routing_options must be an object"):
        build({"routing_options": [1]})
    with pytest.raises(ConfigError, match="address must be host:port, 'auto' or null, got 6379"):
        build({"address": 6379})


def test_hetero_infer_plugins_shows_the_backend_options_with_their_defaults() -> None:
    from hetero_core.plugins import create_plugin_manager, describe_plugins

    (serve_ray,) = [p for p in describe_plugins(create_plugin_manager()) if p["name"] == "serve-ray"]
    options = serve_ray["components"]["serving_backend"]["ray"]
    assert options["routing_options"] == {"type": "Mapping[str, Any]", "default": {}}
    assert options["max_restarts"] == {"type": "int", "default": -1}
