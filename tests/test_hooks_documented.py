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


def documented() -> dict[str, str | None]:
    """Each ``## hook`` heading of the page and the code line right under it (None when missing)."""
    sections = re.split(r"^## ", DOC.read_text(), flags=re.MULTILINE)[1:]
    found = {}
    for section in sections:
        heading, _, body = section.partition("\n")
        signature = re.match(r"\s*`([^`]+)`", body)
        found[heading.strip()] = signature.group(1) if signature else None
    return found


def test_there_are_hook_specs() -> None:
    assert {"register_tokenizers", "register_executors", "on_step_finished"} <= set(specs())


def test_every_hook_has_a_heading_and_every_heading_is_a_hook() -> None:
    assert sorted(documented()) == sorted(specs())


def test_documented_signatures_match_the_specs() -> None:
    for name, signature in documented().items():
        spec = specs().get(name)
        assert signature == spec, f"docs/hooks.md documents {signature!r}, the spec is {spec!r}"


def test_every_hook_spec_has_a_docstring_with_params_and_return() -> None:
    for name in specs():
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert ":param" in doc and ":return:" in doc, name
