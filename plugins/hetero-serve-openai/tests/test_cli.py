"""The ``serve`` and ``batch`` commands this plugin adds to ``hetero-infer``."""

from __future__ import annotations

import json

import pytest

from hetero_core.cli.main import build_parser, main
from hetero_core.cli.options import engine_config
from hetero_serve_openai import run
from hetero_serve_openai.config import server_config

MOCK = ["--tokenizer", "simple", "--executor", "mock", "--block-size", "4"]


@pytest.fixture
def served(monkeypatch) -> list:
    """The configs ``serve`` was called with, instead of serving."""
    configs: list = []
    monkeypatch.setattr(run, "serve", configs.append)
    return configs


def test_server_keys_are_set_with_o_over_the_config_file(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"server": {"port": 9000, "command": "old-program"}}))
    args = build_parser().parse_args(
        [
            "--config",
            str(path),
            "-o",
            "server.backend=command_bridge",
            "-o",
            "server.command=my-bridge --fast",
            "-o",
            "server.command_timeout=5",
        ]
    )
    server = server_config(engine_config(args))
    assert (server.backend, server.command, server.command_timeout, server.port) == (
        "command_bridge",
        ("my-bridge", "--fast"),
        5,
        9000,
    )


@pytest.mark.parametrize("spelling", [["serve"], ["--serve"], ["generate", "--serve"]])
def test_serve_and_the_seed_flag_take_the_server_flags_over_the_file(tmp_path, served, spelling) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"server": {"port": 9000, "host": "0.0.0.0", "drain_timeout": 3}}))
    assert main([*spelling, "--config", str(path), "--port", "9001", "--api-key", "k", *MOCK]) == 0
    server = server_config(served[0])
    assert (server.port, server.host, server.api_key, server.drain_timeout) == (9001, "0.0.0.0", "k", 3)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["-o", "server.colour=red"],
            "unknown config key(s) server.colour; allowed: api_key, backend, backend_options, command,",
        ),
        (["-o", "server.port=99999"], "port must be an integer in [0, 65535], got 99999"),
        (
            ["-o", "server.backend=command_bridge"],
            "server.command must name the program to run for backend 'command_bridge'",
        ),
    ],
)
def test_bad_server_keys_are_one_line_errors_with_status_2(flags, message: str, served, capsys) -> None:
    assert main(["serve", *MOCK, *flags]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("hetero-infer: error: ") and message in error[0]
    assert served == []


def test_an_empty_api_key_variable_warns(monkeypatch, served, capsys) -> None:
    monkeypatch.setenv("HETERO_API_KEY", "")
    assert main(["serve", *MOCK]) == 0
    assert "the API key variable is set but empty" in capsys.readouterr().err


@pytest.mark.integration  # the engine's default scheduler and cache allocator come from their plugins
def test_batch_sends_each_line_with_its_own_parameters_through_the_backend(tmp_path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"prompt": "first", "max_tokens": 2}\n'
        '{"messages": [{"role": "user", "content": "second"}], "max_tokens": 5, "top_k": -1, "stop": "no such text"}\n'
        "third plain line\n"
    )
    out = tmp_path / "out.jsonl"
    assert main(["batch", "--input-file", str(prompts), "--output-file", str(out), "--max-tokens", "3", *MOCK]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["completion_tokens"] for r in rows] == [2, 5, 3]
    assert [r["input"] for r in rows] == ["first", [{"role": "user", "content": "second"}], "third plain line"]


def test_batch_needs_an_input_file(capsys) -> None:
    assert main(["batch", "--input", "x", *MOCK]) == 2
    assert "batch takes --input-file FILE" in capsys.readouterr().err


def test_replicas_of_an_input_file_go_to_the_batch_command(tmp_path, capsys) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    assert (
        main(
            [
                "--input-file",
                str(prompts),
                "--data-parallel-size",
                "2",
                "-o",
                "server.backend=command_bridge",
                "-o",
                "server.command=x",
                *MOCK,
            ]
        )
        == 2
    )
    assert "has no engine to replicate" in capsys.readouterr().err  # the batch command read the serving config
