"""An engine on a GGUF parses the file's metadata once, though the tokenizer and the executor both read it."""

from __future__ import annotations

import pytest

from hetero_core import EngineConfig, gguf_header
from hetero_core.engine import InferenceEngine

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_the_tokenizer_and_the_executor_share_one_parse(monkeypatch) -> None:
    real, opened = gguf_header.read_gguf_header, []

    def counting_reader(path):
        opened.append(path)
        return real(path)

    for module in ("hetero_executor_torch.loading", "hetero_tokenizer_hf.gguf_vocab"):
        monkeypatch.setattr(f"{module}.read_gguf_header", counting_reader)
    engine = InferenceEngine(
        EngineConfig(tokenizer={"name": "huggingface"}, executor={"name": "torch", "num_threads": 2}, max_model_len=256)
    )
    try:
        assert len(opened) == 1
        assert engine.tokenizer.decode(engine.tokenizer.encode("Paris")) == "Paris"
    finally:
        engine.close()
