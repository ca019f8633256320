"""What the request bodies' fields share: strict parsing, and text that can be encoded.

A string holding a lone surrogate (JSON allows ``"\\ud800"``) can be neither
tokenized nor sent back, so it is refused where it arrives, naming its field.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict

STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def _encodable(text: str) -> str:
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (it holds a lone surrogate)") from None
    return text


def _encodable_json(value: Any) -> Any:
    _encodable(json.dumps(value, ensure_ascii=False))
    return value


Text = Annotated[str, AfterValidator(_encodable)]
JSONObject = Annotated[dict[str, Any], AfterValidator(_encodable_json)]  # keys and strings at any depth
