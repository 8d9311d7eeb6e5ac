"""JSON values, typed: what crosses a boundary as JSON. Stdlib only (the sandbox worker imports it).

`JsonValue` is any value `json.loads` can return; `JsonObject` a JSON object (tool arguments, a
verifier's evidence, a manifest's stats, a stored record). A type checker sees the recursive union,
so reading a field means narrowing it (`isinstance`, or a pydantic model at the boundary); at run
time the names are `Any`, so a pydantic model with a `JsonObject` field validates what it did before
(this module adds no check and changes no value).

Parameters that only read take `Mapping[str, JsonValue]` / `Sequence[JsonValue]` (a `dict[str, str]`
is one; `dict` is invariant, so it is not a `JsonObject`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

__all__ = ["JsonObject", "JsonScalar", "JsonValue"]

if TYPE_CHECKING:
    JsonScalar: TypeAlias = str | int | float | bool | None
    JsonValue: TypeAlias = JsonScalar | list["JsonValue"] | dict[str, "JsonValue"]
    JsonObject: TypeAlias = dict[str, JsonValue]
else:
    JsonScalar = str | int | float | bool | None
    JsonValue = Any
    JsonObject = dict[str, Any]
