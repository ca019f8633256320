"""docs/hooks.md documents every hook spec, with the spec's exact signature, and nothing else."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from hetero_core import hookspecs

DOC = Path(__file__).resolve().parents[1] / "docs" / "hooks.md"


def specs() -> dict[str, str]:
    found = {}
    for name, function in inspect.getmembers(hookspecs, inspect.isfunction):
        if hasattr(function, "hetero_infer_spec"):
            found[name] = f"{name}({', '.join(inspect.signature(function).parameters)})"
    return found


def documented() -> dict[str, str]:
    text = DOC.read_text()
    headings = re.findall(r"^## (\w+)\n\n`([^`]+)`", text, flags=re.MULTILINE)
    return dict(headings)


def test_there_are_hook_specs() -> None:
    assert {"register_tokenizers", "register_executors", "on_step_finished"} <= set(specs())


def test_every_hook_is_documented_with_its_signature() -> None:
    assert documented() == specs()


def test_every_hook_spec_has_a_docstring_with_params_and_return() -> None:
    for name in specs():
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert ":param" in doc and ":return:" in doc, name
