"""How much work one constraint may cost llguidance, and the refusal that names the bound it passed.

Each bound is an option of the backend (``"structured_output": {"name":
"llguidance", "max_items_in_row": 20000}``); llguidance reports passing one
in its own words, which :func:`refusal` turns into a ``ValidationError``
naming the option and its value.

The plugin's options are built from these bounds when it registers, so this
module imports llguidance only when a backend asks for its parser limits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from hetero_core.errors import ValidationError

if TYPE_CHECKING:
    import llguidance

MAX_MASK_THREADS = 32  # the most threads one backend computes its masks on


@attrs.frozen
class GrammarLimits:
    """The bounds on compiling a constraint and on one step of its matcher."""

    max_grammar_size: int = 500_000  # symbols in the compiled grammar
    compile_fuel: int = 1_000_000  # work to build the lexer (llguidance's initial_lexer_fuel)
    max_items_in_row: int = 10_000  # parser items at one position: an object's optional properties take about 4 each
    step_max_items: int = 50_000  # parser items one token may create

    def parser_limits(self) -> llguidance.LLParserLimits:
        import llguidance

        return llguidance.LLParserLimits(
            max_grammar_size=self.max_grammar_size,
            initial_lexer_fuel=self.compile_fuel,
            max_items_in_row=self.max_items_in_row,
            step_max_items=self.step_max_items,
            verbose_errors=False,
        )


# what llguidance says when a bound is passed, and the option that sets it
PASSED_BOUND = (
    ("grammar size (number of symbols) too big", "max_grammar_size"),
    ("initial lexer configuration (grammar) too big", "compile_fuel"),
    ("items; max is", "max_items_in_row"),
    ("Too many items (limit", "step_max_items"),
)


def passed_bound(error: str) -> str | None:
    """The option whose bound llguidance's ``error`` says was passed, if any."""
    return next((option for fragment, option in PASSED_BOUND if fragment in error), None)


def refusal(what: str, error: str, limits: GrammarLimits) -> ValidationError:
    """The 400 for a constraint (``what``: "the json_schema", ...) that llguidance failed with ``error``."""
    reason = error.strip().splitlines()[0] if error.strip() else "unknown error"
    option = passed_bound(reason)
    if option is not None:
        return ValidationError(
            f"structured_output: {what} passes the grammar engine's limit "
            f"structured_output.{option} = {getattr(limits, option):,}: {reason}",
            param="structured_output",
        )
    return ValidationError(f"structured_output: {what} cannot be used: {reason}", param="structured_output")
