"""EngineConfig: accepted exactly when valid, loaded from the seed's JSON, strict about keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetero_core.config import MAX_BLOCK_SIZE, MAX_COUNT, ComponentSpec, EngineConfig
from hetero_core.errors import ConfigError

SIZES = ["block_size", "max_num_blocks", "max_batch_size", "max_num_seqs", "max_model_len", "max_total_tokens"]
SEED_CONFIG = {
    "block_size": 16,
    "max_num_blocks": 1024,
    "max_batch_size": 32,
    "max_num_seqs": 256,
    "max_model_len": 2048,
    "max_total_tokens": 4096,
    "memory_threshold": 0.9,
    "max_retry_attempts": 2,
}
EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "config.example.json"

size_values = st.one_of(st.integers(-3, 3), st.integers(-(2**40), 2**40), st.booleans(), st.floats(-2, 2), st.none())
threshold_values = st.one_of(
    st.floats(-1, 2), st.just(float("nan")), st.sampled_from([0, 0.0, 1, 1.0, 1e-12, 1.0000001]), st.booleans()
)


@given(sizes=st.fixed_dictionaries({name: size_values for name in SIZES}), threshold=threshold_values)
def test_accepted_exactly_when_sizes_positive_and_threshold_in_range(sizes, threshold) -> None:
    valid_sizes = all(
        isinstance(v, int)
        and not isinstance(v, bool)
        and 0 < v <= (MAX_BLOCK_SIZE if name == "block_size" else MAX_COUNT)
        for name, v in sizes.items()
    )
    valid_threshold = isinstance(threshold, (int, float)) and not isinstance(threshold, bool) and 0 < threshold <= 1
    try:
        config = EngineConfig(**sizes, memory_threshold=threshold)
    except ConfigError as exc:
        assert not (valid_sizes and valid_threshold)
        assert (
            exc.param in [*SIZES, "memory_threshold"]
            and repr(offending_value(sizes, threshold, exc.param)) in exc.message
        )
    else:
        assert valid_sizes and valid_threshold
        config.validate()


def offending_value(sizes: dict, threshold: object, param: str) -> object:
    return threshold if param == "memory_threshold" else sizes[param]


def test_the_seed_config_file_loads(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SEED_CONFIG))
    config = EngineConfig.from_file(path)
    assert {k: getattr(config, k) for k in SEED_CONFIG} == SEED_CONFIG


def test_the_complete_example_loads_and_round_trips() -> None:
    config = EngineConfig.from_file(EXAMPLE)
    assert config.cache_allocator == ComponentSpec("paged", {"enable_prefix_caching": True})
    assert config.executor.options["dtype"] == "auto"
    assert EngineConfig.from_mapping(config.to_json()) == config
    assert set(json.loads(EXAMPLE.read_text())) == set(config.to_json())  # the example shows every key


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"blocksize": 16}, "unknown config key.*blocksize.*allowed: block_size"),
        ({"plugins": {"disabled": ["x"]}}, r"plugins\.disabled"),
        ({"server": 3}, "server must be an object"),
        ({"executor": 5}, "executor must be a component name"),
        ({"executor": {"dtype": "float32"}}, "executor must be a component name"),
        ({"data_parallel_size": 0}, r"data_parallel_size must be an integer in \[1, 1024\], got 0"),
        ({"data_parallel_size": 2000}, r"data_parallel_size must be an integer in \[1, 1024\]"),
        ({"data_parallel_size": True}, "data_parallel_size must be an integer"),
        ({"data_parallel_backend": ""}, "data_parallel_backend must be a non-empty string"),
        ({"ray_address": "auto"}, r"config key ray_address is now server.backend_options.address"),
        ({"memory_threshold": 1.5}, r"memory_threshold must be a number in \(0.0, 1.0\], got 1.5"),
        ({"max_retry_attempts": -1}, "max_retry_attempts"),
        ({"model": 5}, "model must be a non-empty string, got 5"),
        ({"kv_cache_memory_mb": float("inf")}, "kv_cache_memory_mb must be a number in .*got inf"),
        ({"memory_threshold": float("nan")}, "memory_threshold must be a number"),
        ({"block_size": 10**9}, r"block_size must be an integer in \[1, 1024\], got 1000000000"),
        ({"max_num_blocks": 2**40}, r"max_num_blocks must be an integer in \[1, 16777216\]"),
        ({"enable_chunked_prefill": 1}, "enable_chunked_prefill must be true or false, got 1"),
    ],
)
def test_bad_values_are_named(values, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        EngineConfig.from_mapping(values)


def test_unreadable_and_malformed_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        EngineConfig.from_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{block_size: 16}")
    with pytest.raises(ConfigError, match="not valid JSON"):
        EngineConfig.from_file(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        EngineConfig.from_file(bad)
    bad.write_text('{"max_num_blocks": Infinity}')
    with pytest.raises(ConfigError, match="max_num_blocks must be an integer.*got inf"):
        EngineConfig.from_file(bad)
    bad.write_bytes(b'{"model": "caf\xe9.gguf"}')
    with pytest.raises(ConfigError, match="is not UTF-8 text: invalid byte at offset 14"):
        EngineConfig.from_file(bad)


def test_components_by_name_or_object_and_evolve() -> None:
    config = EngineConfig(executor="mock", tokenizer={"name": "simple", "add_bos": True})
    assert config.executor == ComponentSpec("mock") and config.tokenizer.options == {"add_bos": True}
    changed = config.evolve(block_size=8, server={"port": 9})
    assert (changed.block_size, changed.server) == (8, {"port": 9})
    assert changed.evolve(server={"host": "::1"}).server == {"port": 9, "host": "::1"}  # keys merge onto the section
    nested = changed.evolve(server={"backend_options": {"address": "auto"}}).evolve(
        server={"backend_options": {"max_restarts": 2}}
    )
    assert nested.server["backend_options"] == {"address": "auto", "max_restarts": 2}  # objects within it too
    with pytest.raises(ConfigError):
        config.evolve(block_size=0)
