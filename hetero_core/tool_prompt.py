"""The default way a chat shows tools to a model whose chat template has no tool support.

Tokenizers call :func:`inline_tools` when their template does not read the
``tools`` variable (SmolLM2's ChatML template does not): it rewrites the
messages into plain ``role``/``content`` ones that any template renders.

- The tools are listed, one JSON object a line inside ``<tools></tools>``,
  in a system block with the calling convention; the block is appended to
  the first system message, or is the first message when there is none.
- An assistant message's ``tool_calls`` become its content's
  ``<tool_call>`` blocks (after any text), one per call::

      <tool_call>
      {"name": "get_weather", "arguments": {"city": "Paris"}}
      </tool_call>

- ``tool`` messages become one user message of ``<tool_response>`` blocks
  (consecutive ones are merged, in order).

The server's parser reads the same ``<tool_call>`` convention back out of
generated text, and forced tool calls are generated in exactly this form.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"

INSTRUCTIONS = """You can call functions (tools). Their signatures, one JSON object a line:
<tools>
{tools}
</tools>
To call a function, answer with its name and arguments as JSON inside <tool_call></tool_call> tags, one call a block:
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}
</tool_call>"""


def tool_call_block(name: str, arguments: Any) -> str:
    """One call as the model writes it; ``arguments`` is an object or its JSON text."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # shown as the string it is
    return (
        f"{TOOL_CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{TOOL_CALL_CLOSE}"
    )


def tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    return INSTRUCTIONS.format(tools="\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools))


def inline_tools(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """``messages`` (and ``tools``, if any) as plain ``role``/``content`` messages (with any ``name``) in the default
    convention."""
    plain: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message.get("content")
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if plain and plain[-1].get("is_tool_response"):
                plain[-1]["content"] += "\n" + block
            else:
                plain.append({"role": "user", "content": block, "is_tool_response": True})
            continue
        if message.get("tool_calls"):
            calls = [tool_call_block(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
            content = "\n".join([content, *calls] if content else calls)
        plain.append(
            {"role": role, "content": content, **({"name": message["name"]} if message.get("name") is not None else {})}
        )
    for message in plain:
        message.pop("is_tool_response", None)
    if tools:
        if plain and plain[0]["role"] == "system":
            plain[0]["content"] = f"{plain[0]['content']}\n\n{tools_block(tools)}"
        else:
            plain.insert(0, {"role": "system", "content": tools_block(tools)})
    return plain
