"""A tool schema as JSON: what policies, chat templates and OpenAI requests are given of a tool. Stdlib only
(the sandbox worker, which reports an ASGI app's routes as tool schemas, may import it).

`ToolSchemaJson` is one entry of `tools.json` (`models.bundle.ToolSchema.model_dump()`): the tool's name, a
description and the JSON Schema of its arguments (`parameters`). A type checker sees the TypedDict; at run
time the name is `dict` (as `jsonvalue`'s names are `Any`): pydantic refuses `typing.TypedDict` on Python
3.11 and this module may import nothing but the stdlib, so a model field of this type validates what it
did before (any JSON object), and `ToolSchemaJson(name=..., ...)` builds a plain dict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["ToolSchemaJson"]

if TYPE_CHECKING:
    from typing import TypedDict

    from worldsmith.jsonvalue import JsonObject

    class ToolSchemaJson(TypedDict):
        """One tool: its name, what it does, and the JSON Schema (type object) of its arguments."""

        name: str
        description: str
        parameters: JsonObject

else:
    ToolSchemaJson = dict
