"""TRL: a plain `GRPOTrainer` trains in worldsmith's worlds through its `environment_factory`, without
worldsmith's trainer.

TRL's contract (trl 1.16, `GRPOTrainer(environment_factory=...)`): an environment is an object whose
public methods are the tools the model may call (typed, with Google-style docstrings: the chat template
shows them), with a `reset(**row)` TRL calls with each dataset row before a rollout. Every world has its
own tools, so `environment_factory(env)` gives one factory per world, by world name (TRL's dict form:
each row's `environment` column picks its world, as `sets export --format hf` writes it). Each factory
makes instances of a class built from the world's `tools.json`: one method per tool, whose call is a
step of the instance's episode (`EnvEpisode.step`) and whose return is what the agent sees.

The reward is `world_reward`, a reward function for `reward_funcs`: it verifies each rollout's episode
with the rollout's final message as the answer (`EnvEpisode.verify`: code verifier, judge or both, as
the `WorldEnv` is configured); an env_error rollout has no reward (None: TRL leaves it out).
"""

from __future__ import annotations

import inspect
import keyword
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast

from worldsmith.integrations.environment import EnvEpisode, TaskRef, WorldEnv
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.runtime.answers import one_line
from worldsmith.runtime.episode import tool_schemas
from worldsmith.toolschema import ToolSchemaJson

#: JSON Schema's scalar and container types as the Python types TRL's schema reader maps back.
_PYTHON_TYPES: dict[str, object] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}
#: Names a tool cannot have as a method: TRL's (`reset`, `get_reward`) and WorldTools' own attributes.
_RESERVED = frozenset({"reset", "get_reward", "env", "world", "episode"})


class WorldTools:
    """An episode of one world for TRL: `reset(**row)` opens the row's task; the subclass made by
    `tools_class` adds one method per tool of the world."""

    env: WorldEnv
    world: str

    def __init__(self) -> None:
        self.episode: EnvEpisode | None = None

    def reset(self, **row: Any) -> None:
        """Open a fresh episode of the row's task (`task_id`; the world is this class's). The row's
        prompt already holds the instruction, so nothing is added to it."""
        if self.episode is not None:
            self.episode.close()
        self.episode = self.env.reset(TaskRef(self.world, str(row["task_id"])))

    def _call(self, name: str, arguments: Mapping[str, object]) -> str:
        if self.episode is None:
            raise RuntimeError("reset() opens an episode before any tool call")
        played = self.episode.step({"name": name, "arguments": dict(arguments)})
        return played.observation


def python_type(schema: JsonValue) -> object:
    """The Python annotation TRL's schema reader turns back into (about) `schema`: scalars, lists of
    a type, enums as Literal, nullable types as `X | None`; anything else `Any` (the world's own
    schema still checks every call)."""
    if not isinstance(schema, dict):
        return Any
    if isinstance(enum := schema.get("enum"), list) and enum and all(isinstance(v, str | int | bool) for v in enum):
        return Literal[tuple(enum)]
    options = schema.get("anyOf")
    kinds = schema.get("type")
    if isinstance(options, list):
        kinds = [o.get("type") for o in options if isinstance(o, dict)]
    if isinstance(kinds, list):
        real = [k for k in kinds if k != "null"]
        if len(real) == 1 and isinstance(real[0], str) and real[0] in _PYTHON_TYPES:
            inner = python_type({**schema, "type": real[0], "anyOf": None})
            return inner | None if "null" in kinds else inner  # type: ignore[operator]
        return Any
    if kinds == "array" and isinstance(items := schema.get("items"), dict):
        item = python_type(items)
        return list if item is Any else list[item]  # type: ignore[valid-type]
    return _PYTHON_TYPES.get(kinds, Any) if isinstance(kinds, str) else Any


def tool_method(world: str, tool: ToolSchemaJson) -> Callable[..., str]:
    """A method calling `tool` in the instance's episode, with the signature and Google-style docstring
    TRL reads the tool's schema from. ValueError for a tool or argument name Python cannot spell."""
    name, parameters = tool["name"], tool["parameters"]
    properties = cast(JsonObject, parameters.get("properties") or {})
    required = set(cast(list[str], parameters.get("required") or []))
    refused = [
        spelled
        for spelled in (name, *properties)
        if not spelled.isidentifier() or keyword.iskeyword(spelled) or spelled == "self"
    ]
    if name in _RESERVED or name.startswith("_"):
        refused.insert(0, name)
    if refused:
        raise ValueError(f"world {world}: tool {name!r} cannot be a TRL tool method ({refused[0]!r} cannot be spelled)")
    signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, object] = {"return": str}
    lines = [one_line(tool["description"] or "") or name, "", "Args:"]
    ordered = sorted(properties, key=lambda p: p not in required)  # required first: no default before them
    for argument in ordered:
        schema = properties[argument]
        annotation = python_type(schema)
        optional = argument not in required
        signature.append(
            inspect.Parameter(
                argument,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=None if optional else inspect.Parameter.empty,
                annotation=annotation,
            )
        )
        annotations[argument] = annotation
        described = one_line(str(schema.get("description") or "")) if isinstance(schema, dict) else ""
        lines.append(f"    {argument}: {described or argument}")
    if not ordered:
        lines = lines[:1]
    else:
        lines += ["", "Returns:", "    The tool's result as JSON text, or the error."]

    def method(self: WorldTools, *args: object, **kwargs: object) -> str:
        bound = inspect.Signature(signature).bind(self, *args, **kwargs)
        given = {k: v for k, v in bound.arguments.items() if k != "self" and not (v is None and k not in required)}
        return self._call(name, given)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = "\n".join(lines)
    method.__signature__ = inspect.Signature(signature, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    return method


def tools_class(env: WorldEnv, world: str) -> type[WorldTools]:
    """The TRL environment class of `world`: `WorldTools` with one method per tool."""
    bundle = env.world(world)
    methods = {t["name"]: tool_method(world, t) for t in tool_schemas(bundle)}
    spelled = re.sub(r"\W", "_", world)
    return type(f"World_{spelled}", (WorldTools,), {**methods, "env": env, "world": world})


def environment_factory(env: WorldEnv, worlds: Sequence[str] | None = None) -> dict[str, Callable[[], WorldTools]]:
    """`GRPOTrainer(environment_factory=...)` for `worlds` (default: every world of `env`): world name ->
    a factory of that world's environment instances (each instance plays one rollout at a time)."""
    names = list(worlds) if worlds is not None else sorted({t.world for t in env.tasks()})
    return {name: tools_class(env, name) for name in names}


def final_answer(completion: Sequence[Mapping[str, object]] | str) -> str:
    """The agent's answer in a conversational completion: its last message when that is the assistant's."""
    if isinstance(completion, str):
        return completion
    if completion and completion[-1].get("role") == "assistant":
        return str(completion[-1].get("content") or "")
    return ""


def world_reward(
    completions: Sequence[Sequence[Mapping[str, object]] | str], environments: Sequence[WorldTools], **_: object
) -> list[float | None]:
    """TRL reward function: each rollout's episode verified with its final message as the answer."""
    rewards: list[float | None] = []
    for completion, environment in zip(completions, environments, strict=True):
        episode = environment.episode
        rewards.append(None if episode is None else episode.verify(final_answer(completion)).reward)
    return rewards
