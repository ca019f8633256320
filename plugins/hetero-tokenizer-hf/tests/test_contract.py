"""The huggingface tokenizer passes the core's tokenizer contract."""

from __future__ import annotations

import pytest

from hetero_core.testing import TokenizerContract


class TestHuggingFaceTokenizerContract(TokenizerContract):
    @pytest.fixture
    def tokenizer(self, embedded):
        return embedded
