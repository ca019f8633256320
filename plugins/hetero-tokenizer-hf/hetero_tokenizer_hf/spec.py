"""What a tokenizer source (a GGUF file or a Hugging Face folder) yields once read."""

from __future__ import annotations

import attrs
from tokenizers import Tokenizer, processors


@attrs.frozen
class TokenizerSpec:
    """A ready ``tokenizers.Tokenizer`` plus what the model says around it.

    The tokenizer's post-processor already adds whatever BOS/EOS the model
    wants when encoding with ``add_special_tokens=True``.
    """

    tokenizer: Tokenizer
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    unk_token_id: int | None
    chat_template: str | None


def install_bos_eos(
    tokenizer: Tokenizer, *, bos_token_id: int | None, eos_token_id: int | None, add_bos: bool, add_eos: bool
) -> None:
    """Make ``encode(..., add_special_tokens=True)`` wrap the text in BOS and/or EOS.

    A flag whose token id is unknown is ignored, as ``transformers`` does.
    """
    prefix = [tokenizer.id_to_token(bos_token_id)] if add_bos and bos_token_id is not None else []
    suffix = [tokenizer.id_to_token(eos_token_id)] if add_eos and eos_token_id is not None else []
    ids = {tokenizer.token_to_id(token): token for token in (*prefix, *suffix)}
    single = " ".join([*(f"{token}:0" for token in prefix), "$A:0", *(f"{token}:0" for token in suffix)])
    pair = " ".join([single, *(f"{token}:1" for token in prefix), "$B:1", *(f"{token}:1" for token in suffix)])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(token, token_id) for token_id, token in ids.items()]
    )
