"""What a serving backend honours, and the 400 for a request that asks for more.

A backend declares ``capabilities``: the names of the
:class:`~hetero_core.params.GenerationParams` fields it honours. A request
whose parameters set a field the backend does not honour (to anything but
that field's default) is refused with a 400 naming the request field, so no
client gets a 200 that quietly dropped its ``logit_bias``, its schema or its
forced tool call. ``max_tokens``, ``temperature`` and ``top_p`` are the
baseline every backend honours; a backend with no ``capabilities`` attribute
honours only those.
"""

from __future__ import annotations

from typing import Mapping

import attrs

from hetero_core.errors import ConfigError
from hetero_core.params import GenerationParams
from hetero_serve_openai.errors import APIError

_FIELDS = tuple(field.name for field in attrs.fields(GenerationParams))
CAPABILITIES = frozenset(_FIELDS)  # every name a backend can declare
BASELINE = frozenset({"max_tokens", "temperature", "top_p"})  # honoured by every backend, declared or not
_DEFAULTS = GenerationParams()  # a field at its default asks nothing of the backend


def capabilities_of(backend: object, name: str) -> frozenset[str]:
    """What the backend registered as ``name`` honours: its declared ``capabilities`` and the baseline.

    A name that is not a :class:`GenerationParams` field is a
    :class:`~hetero_core.errors.ConfigError` (a misspelt capability must not pass
    for an honoured one).
    """
    declared = frozenset(getattr(backend, "capabilities", ()))
    unknown = sorted(declared - CAPABILITIES)
    if unknown:
        raise ConfigError(
            f"serving backend {name!r} declares unknown capabilities {', '.join(map(repr, unknown))}; known: "
            f"{', '.join(sorted(CAPABILITIES))}",
            param="server.backend",
        )
    return BASELINE | declared


def unhonoured(params: GenerationParams, honoured: frozenset[str]) -> str | None:
    """The first field ``params`` sets (away from its default) outside ``honoured``; None if there is none."""
    return next(
        (name for name in _FIELDS if name not in honoured and getattr(params, name) != getattr(_DEFAULTS, name)), None
    )


def check_capabilities(
    params: GenerationParams, honoured: frozenset[str], backend_name: str, fields: Mapping[str, str | None]
) -> None:
    """Refuse ``params`` if it sets a field outside ``honoured``: a 400 naming the request field
    (``fields`` maps where a name differs)."""
    name = unhonoured(params, honoured)
    if name is not None:
        field = fields.get(name) or name
        raise APIError(
            400,
            f"{field} is not supported by this server's backend {backend_name!r}",
            param=field,
            code="unsupported_parameter",
        )
