"""The hetero-infer command: flags over the config file, one-shot, batch files, plugins, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_core.cli.main import build_parser, main
from hetero_core.cli.options import engine_config, generation_params

MOCK = ["--tokenizer", "simple", "--executor", "mock", "--block-size", "4"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "hetero-infer"), *args], capture_output=True, text=True, timeout=120
    )


def test_flags_override_the_config_file(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"block_size": 32, "max_num_blocks": 100, "executor": {"name": "torch", "dtype": "float32"}})
    )
    args = build_parser().parse_args(["--config", str(path), "--max-num-blocks", "7", "-o", "executor.dtype=bfloat16"])
    config = engine_config(args)
    assert config.block_size == 32  # from the file
    assert config.max_num_blocks == 7  # the flag wins
    assert config.executor.name == "torch" and config.executor.options == {"dtype": "bfloat16"}
    assert config.scheduler.name == "fcfs" and config.seed == 0  # defaults where neither says


def test_component_flags_keep_the_file_options_of_the_same_component(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "tokenizer": {"name": "huggingface", "path": "tok.json"},
                "executor": {"name": "torch", "dtype": "float32"},
            }
        )
    )
    config = engine_config(
        build_parser().parse_args(
            ["--config", str(path), "--tokenizer", "huggingface", "--executor", "mock", "--scheduler", "priority"]
        )
    )
    assert config.tokenizer.options == {"path": "tok.json"}
    assert config.executor.name == "mock" and config.executor.options == {}  # torch's options do not apply to mock
    assert config.scheduler.name == "priority"


def test_one_shot_streams_and_summarises(capsys) -> None:
    assert main(["--input", "hello", "--max-tokens", "5", "--temperature", "0", *MOCK]) == 0
    captured = capsys.readouterr()
    assert captured.out.endswith("\n") and len(captured.out) > 1
    assert "[5 tokens in" in captured.err and "tokens/s]" in captured.err


def test_batch_file_writes_jsonl_in_input_order(tmp_path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "first"}\n{"messages": [{"role": "user", "content": "second"}]}\nthird plain line\n')
    out = tmp_path / "out.jsonl"
    assert main(["--input-file", str(prompts), "--output-file", str(out), "--max-tokens", "3", *MOCK]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["input"] for r in rows] == ["first", [{"role": "user", "content": "second"}], "third plain line"]
    assert all(r["completion_tokens"] == 3 and r["finish_reason"] == "length" for r in rows)


def test_each_line_of_a_batch_file_may_set_its_own_parameters(tmp_path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"prompt": "first", "max_tokens": 2}\n'
        '{"messages": [{"role": "user", "content": "second"}], "max_tokens": 5, "top_k": -1, "stop": "no such text"}\n'
        "third plain line\n"
    )
    out = tmp_path / "out.jsonl"
    assert main(["--input-file", str(prompts), "--output-file", str(out), "--max-tokens", "3", *MOCK]) == 0
    assert [json.loads(line)["completion_tokens"] for line in out.read_text().splitlines()] == [2, 5, 3]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ('{"prompt": "x", "max_token": 2}', "unknown key 'max_token'"),
        ('{"prompt": "x", "structured_output": "a+"}', "unknown key 'structured_output'"),
        ('{"prompt": "x", "temperature": 5}', "temperature must be"),
        (
            '{"prompt": "x", "messages": [{"role": "user", "content": "y"}]}',
            "expected an object with 'prompt' or 'messages' (one of them)",
        ),
    ],
)
def test_a_bad_line_of_a_batch_file_is_an_input_error_naming_it(tmp_path, capsys, line: str, error: str) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "fine"}\n' + line + "\n")
    assert main(["--input-file", str(prompts), *MOCK]) == 2
    assert f"{prompts}:2: {error}" in capsys.readouterr().err


def test_chat_keeps_the_history(monkeypatch, capsys) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\nagain\n"))
    assert main(["--chat", "--max-tokens", "3", *MOCK]) == 0
    assert capsys.readouterr().out.count("> ") == 3


def test_errors_are_one_line_without_traceback() -> None:
    result = run_cli("--input", "x", "--temperature", "9", *MOCK)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "hetero-infer: error: temperature must be a number in [0.0, 2.0], got 9.0"
    ]
    missing = run_cli("--config", "/nonexistent.json", "--input", "x")
    assert missing.returncode == 2 and "cannot read config file" in missing.stderr and "Traceback" not in missing.stderr


def test_plugins_lists_the_installed_components() -> None:
    result = run_cli("plugins")
    assert result.returncode == 0
    listing = {p["name"]: p for p in json.loads(result.stdout)}
    found = {(point, name) for p in listing.values() for point, names in p["components"].items() for name in names}
    expected = {("tokenizer", "simple"), ("tokenizer", "huggingface"), ("executor", "mock"), ("executor", "torch")}
    assert expected | {("scheduler", "fcfs"), ("scheduler", "priority"), ("cache_allocator", "paged")} <= found
    assert listing["builtin"]["version"] and "register_executors" in listing["builtin"]["hooks"]


def test_nothing_to_do_is_an_error(capsys) -> None:
    assert main([*MOCK]) == 2
    assert "nothing to do" in capsys.readouterr().err


def test_file_problems_are_one_line_errors(tmp_path) -> None:
    missing = run_cli("--input-file", str(tmp_path / "absent.txt"), *MOCK)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"hetero-infer: error: {tmp_path / 'absent.txt'}: No such file or directory"
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"prompt": broken\n')
    malformed = run_cli("--input-file", str(prompts), *MOCK)
    assert malformed.returncode == 2 and f"{prompts}:2: invalid JSON" in malformed.stderr
    assert "Traceback" not in malformed.stderr


def test_debug_shows_the_traceback() -> None:
    result = run_cli("--input", "x", "--temperature", "9", "--debug", *MOCK)
    assert result.returncode != 0 and "Traceback" in result.stderr and "ValidationError" in result.stderr


def test_bench_runs_a_benchmark_program(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "serve", "--help"])
    assert exit_info.value.code == 0
    assert "--rate" in capsys.readouterr().out
    assert main(["bench", "nonsense"]) == 2
    assert "bench needs a benchmark name (serve, throughput, attention), got 'nonsense'" in capsys.readouterr().err


def test_json_schema_and_regex_constrain_one_shot_and_batch_answers(tmp_path, capsys) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(schema))
    assert main(["--input", "hello", "--max-tokens", "40", "--json-schema", str(schema_file), *MOCK]) == 0
    assert json.loads(capsys.readouterr().out) in ({"ok": True}, {"ok": False})
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("one\ntwo\n")
    out = tmp_path / "out.jsonl"
    assert (
        main(
            [
                "--input-file",
                str(prompts),
                "--output-file",
                str(out),
                "--max-tokens",
                "20",
                "--regex",
                "[0-9]{3}",
                *MOCK,
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(r["output"]) for r in rows] == [3, 3] and all(r["output"].isdigit() for r in rows)


def test_a_schema_file_that_is_not_json_is_an_input_error(tmp_path, capsys) -> None:
    schema_file = tmp_path / "schema.json"
    schema_file.write_text("{not json")
    assert main(["--input", "hello", "--json-schema", str(schema_file), *MOCK]) == 2
    assert "the JSON schema is not valid JSON" in capsys.readouterr().err


def test_output_shaping_flags_reach_the_parameters() -> None:
    plain = generation_params(build_parser().parse_args(["--input", "x"]))
    assert not plain.include_stop_str_in_output and plain.skip_special_tokens
    shaped = generation_params(
        build_parser().parse_args(
            ["--input", "x", "--stop", "!", "--include-stop-str-in-output", "--no-skip-special-tokens"]
        )
    )
    assert shaped.include_stop_str_in_output and not shaped.skip_special_tokens


def test_the_speculator_flag_and_its_options(tmp_path, capsys) -> None:
    config = engine_config(build_parser().parse_args([*MOCK, "--speculator", "ngram", "-o", "speculator.k=3"]))
    assert config.speculator.name == "ngram" and config.speculator.options == {"k": 3}
    assert engine_config(build_parser().parse_args(MOCK)).speculator is None
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"speculator": {"name": "ngram", "k": 5}}))
    config = engine_config(build_parser().parse_args(["--config", str(path), "-o", "speculator.min_ngram=1"]))
    assert config.speculator.options == {"k": 5, "min_ngram": 1}
    with pytest.raises(Exception, match="sets an option of no speculator: choose one with --speculator NAME"):
        engine_config(build_parser().parse_args([*MOCK, "-o", "speculator.k=3"]))
    assert (
        main(["--input", "abcabcabcabc", "--max-tokens", "6", "--temperature", "0", "--speculator", "ngram", *MOCK])
        == 0
    )
    assert capsys.readouterr().out.strip()
