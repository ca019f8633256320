"""The CLI's failures: exit statuses, one-line errors, failed generations, component options."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_core.cli.main import build_parser, main
from hetero_core.cli.options import engine_config
from hetero_core.model_source import embedded_model_path

from .test_cli import MOCK, run_cli

FAILING_EXECUTOR = """
from hetero_core.builtin.mock_executor import MockExecutor
from hetero_core.hookspecs import hookimpl


class Failing(MockExecutor):
    def execute(self, batch):
        output = super().execute(batch)
        for seq in batch.sequences:
            if seq.do_sample and 66 in seq.all_token_ids:  # a prompt holding "B" fails
                del output.sampled_token_ids[seq.seq_id]
                output.errors[seq.seq_id] = "cannot generate after a B"
        return output


@hookimpl
def register_executors(register):
    register("failing", lambda config, **options: Failing(**options))
"""


@pytest.fixture
def failing_config(tmp_path, monkeypatch) -> str:
    (tmp_path / "failing_executor.py").write_text(FAILING_EXECUTOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "config.json"
    config = {"tokenizer": "simple", "executor": "failing", "block_size": 4, "plugins": {"load": ["failing_executor"]}}
    path.write_text(json.dumps(config))
    return str(path)


def test_a_failed_generation_exits_1_with_its_error(failing_config, capsys) -> None:
    assert main(["--config", failing_config, "--input", "a B", "--raw", "--max-tokens", "3"]) == 1
    assert "hetero-infer: error: generation failed: cannot generate after a B" in capsys.readouterr().err
    assert main(["--config", failing_config, "--input", "fine", "--raw", "--max-tokens", "3"]) == 0


def test_a_batch_writes_every_error_and_exits_1(failing_config, tmp_path, capsys) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "good"}\n{"prompt": "a B"}\n{"prompt": ""}\n{"prompt": "also good"}\n')
    out = tmp_path / "out.jsonl"
    assert (
        main(["--config", failing_config, "--input-file", str(prompts), "--output-file", str(out), "--max-tokens", "3"])
        == 1
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r.get("error") for r in rows] == [None, "cannot generate after a B", "prompt must not be empty", None]
    assert rows[0]["completion_tokens"] == rows[3]["completion_tokens"] == 3
    assert "2 of 4 prompts failed; the first, prompt 2: cannot generate after a B" in capsys.readouterr().err


def test_component_options_and_the_cache_allocator_flag() -> None:
    args = build_parser().parse_args(
        [
            *MOCK,
            "--cache-allocator",
            "paged",
            "-o",
            "cache_allocator.enable_prefix_caching=false",
            "--option",
            "executor.vocab_size=128",
            "-o",
            "executor.step_latency=0.5",
            "-o",
            "tokenizer.add_bos=true",
        ]
    )
    config = engine_config(args)
    assert config.cache_allocator.options == {"enable_prefix_caching": False}
    assert config.executor.options == {"vocab_size": 128, "step_latency": 0.5}
    assert config.tokenizer.options == {"add_bos": True}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["-o", "executor.vocab_size=lots"],
            "executor 'mock' option vocab_size must be an integer in [1, 2147483647], got 'lots'",
        ),
        (
            ["-o", "executor.colour=red"],
            "executor 'mock' has no option 'colour'; accepted: vocab_size, eos_token_id, eos_probability,",
        ),
        (["--dtype", "float32"], "--dtype is the executor's option now: use -o executor.dtype=float32"),
        (
            ["-o", "engine.x=1"],
            "--option takes COMPONENT.KEY=VALUE with COMPONENT one of tokenizer, scheduler, cache_allocator",
        ),
        (
            ["-o", "server=1"],
            "--option takes COMPONENT.KEY=VALUE with COMPONENT one of tokenizer, scheduler, cache_allocator,"
            " executor, structured_output, speculator, server,",
        ),
        (["--cache-allocator", "pagd"], "unknown cache_allocator 'pagd'; installed: 'paged'"),
        (["--block-size", "1000000000"], "block_size must be an integer in [1, 1024], got 1000000000"),
    ],
)
def test_bad_flags_are_one_line_errors_with_status_2(flags, message: str, capsys) -> None:
    assert main(["--input", "x", *MOCK, *flags]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("hetero-infer: error: ") and message in error[0]


@pytest.mark.parametrize(
    "content",
    [b'{"model": 5}', b'{"kv_cache_memory_mb": Infinity}', b'{"block_size": 100000000}', b'{"model": "\xff"}'],
)
def test_bad_config_files_exit_2_without_a_traceback(tmp_path, content: bytes) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    result = run_cli("--config", str(path), "--input", "x", *MOCK)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("hetero-infer: error: ") and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("fraction", [0.001, 0.5])  # the vocabulary cut off, or only the weights
def test_a_truncated_model_file_is_a_config_error(tmp_path, fraction: float) -> None:
    whole = embedded_model_path().read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(whole[: int(len(whole) * fraction)])
    result = run_cli("--model", str(truncated), "--input", "x")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert str(truncated) in result.stderr or "failed to start" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_plugins_follows_the_config_file(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"plugins": {"disable": ["numba-cuda"]}}))
    result = run_cli("plugins", "--config", str(path))
    listing = {p["name"]: p for p in json.loads(result.stdout)}
    assert "numba-cuda" not in listing and "torch" in listing
    assert listing["torch"]["components"]["executor"]["torch"]["dtype"] == {"type": "str", "default": "auto"}


def test_a_broken_plugin_does_not_break_the_commands(tmp_path) -> None:
    (tmp_path / "wreck_plugin.py").write_text("raise ImportError('half installed')\n")
    info = tmp_path / "wreck_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: wreck-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hetero_infer]\nwreck = wreck_plugin\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cli = str(Path(sys.executable).parent / "hetero-infer")
    listing = subprocess.run([cli, "plugins"], capture_output=True, text=True, env=env, timeout=120)
    assert listing.returncode == 0
    broken = {p["name"]: p for p in json.loads(listing.stdout)}["wreck"]
    assert broken == {"name": "wreck", "broken": "cannot load entry point 'wreck_plugin': ImportError: half installed"}
    generated = subprocess.run(
        [cli, "--input", "hi", "--max-tokens", "2", *MOCK], capture_output=True, text=True, env=env, timeout=120
    )
    assert generated.returncode == 0 and "wreck" in generated.stderr  # a warning names it; the rest works
