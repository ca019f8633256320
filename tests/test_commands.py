"""Commands plugins add through ``register_commands``; the ones the project's plugins add name what to install."""

from __future__ import annotations

import pytest

from hetero_core.cli import commands
from hetero_core.cli.main import main
from hetero_core.hookspecs import hookimpl

from .conftest import core_plugin_manager


class Greeter:
    @hookimpl
    def register_commands(self, register) -> None:
        register("greet", lambda argv: print("hello", *argv) or len(argv))


@pytest.fixture
def with_greeter(monkeypatch) -> None:
    monkeypatch.setattr(commands, "create_plugin_manager", lambda: core_plugin_manager((Greeter(), "greeter")))


def test_a_plugin_command_gets_its_arguments_and_gives_the_exit_status(with_greeter, capsys) -> None:
    assert main(["greet", "a", "--b"]) == 2
    assert capsys.readouterr().out == "hello a --b\n"


def test_an_unknown_command_lists_the_installed_ones(with_greeter, capsys) -> None:
    assert main(["frobnicate"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [
        "hetero-infer: error: unknown command 'frobnicate'; installed: 'greet'"
        " (the core's commands: generate, plugins, bench, export-tokenizer)"
    ]


@pytest.mark.parametrize("argv", [["serve"], ["--serve", "--port", "9"], ["batch", "--input-file", "x"]])
def test_a_missing_project_plugin_is_named_in_one_line(monkeypatch, argv, capsys) -> None:
    monkeypatch.setattr(commands, "_is_installed", lambda distribution: False)
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert (
        len(error) == 1
        and "needs the plugin hetero-serve-openai, which is not installed: pip install hetero-serve-openai" in error[0]
    )


def test_replicas_of_an_input_file_need_the_batch_command(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(commands, "_is_installed", lambda distribution: False)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    assert (
        main(["--input-file", str(prompts), "--data-parallel-size", "2", "--tokenizer", "simple", "--executor", "mock"])
        == 2
    )
    assert "the batch command needs the plugin hetero-serve-openai" in capsys.readouterr().err


def test_plugins_lists_the_commands(with_greeter) -> None:
    from hetero_core.plugins import describe_plugins

    listing = {p["name"]: p for p in describe_plugins(commands.create_plugin_manager())}
    assert listing["greeter"]["components"] == {"command": {"greet": {}}}
