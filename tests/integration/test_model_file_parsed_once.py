"""An engine on a GGUF parses the file's metadata once, though the tokenizer and the executor both read it."""

from __future__ import annotations

import gguf
import pytest

from hetero_core import EngineConfig
from hetero_core.engine import InferenceEngine

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_the_tokenizer_and_the_executor_share_one_parse(monkeypatch) -> None:
    real, opened = gguf.GGUFReader, []

    def counting_reader(path, *args, **kwargs):
        opened.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", counting_reader)
    engine = InferenceEngine(EngineConfig(tokenizer={"name": "huggingface"}, executor={"name": "torch", "num_threads": 2}, max_model_len=256))
    try:
        assert len(opened) == 1
        assert engine.tokenizer.decode(engine.tokenizer.encode("Paris")) == "Paris"
    finally:
        engine.close()
