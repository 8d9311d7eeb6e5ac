"""Every command that starts a flow (or a training run) takes its options from the flow's parameter
model (worldsmith/cli/config_options.py): each field of the model is an option whose default and help
are the field's, so a field added to a model appears on the command line without copying. Also the
option names users had before the options were derived, and what the helper makes of a field's type."""

from __future__ import annotations

import enum
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import click
import pytest
import typer
from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.cli.config_options import ConfigOption, config_command, options_for
from worldsmith.cli.curation import CURATE_OPTIONS
from worldsmith.cli.evaluation import EVAL_OPTIONS
from worldsmith.cli.generation import GENERATE_OPTIONS
from worldsmith.cli.sets import CREATE_OPTIONS
from worldsmith.cli.stack import DEMO_OPTIONS
from worldsmith.cli.training import COTRAIN_DEFAULTS, COTRAIN_OPTIONS, COTRAIN_PARTS, TRAIN_OPTIONS
from worldsmith.cli.wm import WM_TRAIN_OPTIONS
from worldsmith.demo import DemoOptions
from worldsmith.models.sets import SetQuery
from worldsmith.tasks.parameters import CurateParameters, EvaluateParameters, GenerateParameters
from worldsmith.training.config import TINY, CotrainConfig, TrainingConfig, WorldModelConfig

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Derived:
    """A command whose options are the fields of `model` (those under `offered_only` by choice: a
    selection of them, with the command's own defaults in `defaults`)."""

    command: tuple[str, ...]
    model: type[BaseModel]
    options: list[ConfigOption]
    defaults: dict[str, Any] = field(default_factory=dict)
    offered_only: tuple[str, ...] = ()

    def __str__(self) -> str:
        return " ".join(self.command)


COMMANDS = [
    Derived(("generate",), GenerateParameters, GENERATE_OPTIONS),
    Derived(("eval",), EvaluateParameters, EVAL_OPTIONS),
    Derived(("curate",), CurateParameters, CURATE_OPTIONS),
    Derived(("sets", "create"), SetQuery, CREATE_OPTIONS),
    Derived(("train",), TrainingConfig, TRAIN_OPTIONS, {"model": TINY}),
    Derived(("cotrain",), CotrainConfig, COTRAIN_OPTIONS, COTRAIN_DEFAULTS, COTRAIN_PARTS),
    Derived(("wm", "train"), WorldModelConfig, WM_TRAIN_OPTIONS),
    Derived(("demo",), DemoOptions, DEMO_OPTIONS),
]


def _nested(info: FieldInfo) -> type[BaseModel] | None:
    candidates = (info.annotation, *typing.get_args(info.annotation))
    return next((a for a in candidates if isinstance(a, type) and issubclass(a, BaseModel)), None)


def _leaves(model: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    """Every leaf field of `model` by dotted path (nested models flattened)."""
    leaves: dict[str, FieldInfo] = {}
    for name, info in model.model_fields.items():
        nested = _nested(info)
        leaves.update(_leaves(nested, f"{prefix}{name}.") if nested else {prefix + name: info})
    return leaves


def _model_default(model: type[BaseModel], path: str) -> Any:
    """What the model makes of the field at `path` when it is not given: the value in the default instance
    of a nested model above it, else the field's own default (PydanticUndefined: required)."""
    names = path.split(".")
    for depth, name in enumerate(names[:-1]):
        info = model.model_fields[name]
        default = info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            for attribute in names[depth + 1 :]:
                default = getattr(default, attribute)
            return default
        model = _nested(info)
    return model.model_fields[names[-1]].get_default(call_default_factory=True)


def _click_params(command: tuple[str, ...]) -> dict[str, click.Parameter]:
    """The parameters of `worldsmith COMMAND...` by name."""
    found: Any = typer.main.get_command(app)
    for name in command:
        found = found.commands[name]
    return {p.name: p for p in found.params}


def _flags(params: dict[str, click.Parameter]) -> set[str]:
    return {name for p in params.values() for name in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("derived", COMMANDS, ids=str)
def test_every_field_of_the_model_is_an_option_of_the_command(derived: Derived) -> None:
    params = _click_params(derived.command)
    by_path = {path: o for o in derived.options for path in o.paths}
    wanted = {p for p in _leaves(derived.model) if not p.startswith(tuple(f"{part}." for part in derived.offered_only))}
    assert wanted <= set(by_path), f"{derived}: fields without an option: {sorted(wanted - set(by_path))}"
    assert {by_path[p].parameter for p in wanted} <= set(params), f"{derived}: options missing from the command"


@pytest.mark.parametrize("derived", COMMANDS, ids=str)
def test_every_option_carries_its_fields_default_with_its_description(derived: Derived) -> None:
    params = _click_params(derived.command)
    leaves = _leaves(derived.model)
    for option in derived.options:
        path = option.paths[0]
        param, info = params[option.parameter], leaves[path]
        expected = derived.defaults.get(path, _model_default(derived.model, path))
        if option.switch_of is not None:  # the optional model's required field: unset, the model is off
            assert param.default is None and not param.required, option.flag
        elif expected is PydanticUndefined:
            assert param.required, option.flag
        else:
            assert param.default == expected, f"{derived} {option.flag}: {param.default!r} != {expected!r}"
        description = info.description or ""
        assert description and description[1:] in (param.help or ""), f"{derived} {option.flag}: help {param.help!r}"
        if typing.get_origin(info.annotation) is Literal:  # a choice option of the same values
            assert param.type_descriptor.annotation == info.annotation, option.flag


#: The option names of the commands before their options were derived from the models.
FLAGS_BEFORE = {
    ("generate",): "--count --backend --record --model --seed --concurrency --scenarios --max-attempts --fault-rate "
    "--min-good-share --review --no-review",
    ("eval",): "--set --policy --samples --split --max-turns --window --temperature --tool-format --meta-tools "
    "--no-meta-tools --judge --judge-votes --side-effects --no-side-effects --concurrency --seed --simulate "
    "--wm-samples --uncertainty-threshold --json",
    ("curate",): "--name --category --env --count --seed --validation-fraction --min-tasks --min-tools "
    "--require-passed --json",
    ("sets", "create"): "--category --env --count --seed --validation-fraction --min-tasks --min-tools "
    "--require-passed --status",
    ("demo",): "--envs --fault-rate --train-steps --warmup-steps --seed",
}


@pytest.mark.parametrize("command", sorted(FLAGS_BEFORE), ids=" ".join)
def test_the_option_names_of_before_the_derivation_stay(command: tuple[str, ...]) -> None:
    assert set(FLAGS_BEFORE[command].split()) <= _flags(_click_params(command))


def _received(options: list[ConfigOption], args: list[str]) -> dict[str, Any]:
    """The fields a command built with `options` receives for `args`."""
    seen: list[dict[str, Any]] = []
    probe = typer.Typer()

    @probe.command()
    @config_command(options)
    def record(fields: dict[str, Any]) -> None:
        seen.append(fields)

    result = CliRunner().invoke(probe, args)
    assert result.exit_code == 0, result.output
    return seen[-1]


def test_curate_without_options_takes_the_flows_default_query() -> None:
    assert CurateParameters(**_received(CURATE_OPTIONS, [])) == CurateParameters()
    given = _received(CURATE_OPTIONS, ["--category", "retail", "--category", "travel", "--count", "2"])
    params = CurateParameters(**given)
    assert (params.query.categories, params.query.count) == (["retail", "travel"], 2)
    assert params.query.require_passed == CurateParameters().query.require_passed  # the flow's default checks


def test_eval_sets_simulation_only_with_its_switch() -> None:
    assert _received(EVAL_OPTIONS, ["--set", "s", "--wm-samples", "3"]) == {"set_name": "s"}
    given = _received(EVAL_OPTIONS, ["--set", "s", "--simulate", "code", "--wm-samples", "3", "--judge", "m"])
    assert given == {"set_name": "s", "judge_model": "m", "simulate": {"world_model": "code", "samples": 3}}
    assert EvaluateParameters(**given).simulate.uncertainty_threshold == 1.0  # the model's default


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Inner(BaseModel):
    size: int = Field(1, description="Size.")


class Probe(BaseModel):
    """A model standing for a flow's parameters, with a field added later (`shade`)."""

    name: str = Field(description="Name.")
    mode: Literal["fast", "slow"] = Field("fast", description="Mode.")
    shade: Colour = Field(Colour.RED, description="Shade.")
    tags: list[str] = Field(default_factory=list, description="Tags.")
    inner: Inner = Field(default_factory=lambda: Inner(size=5), description="Inner.")


def test_a_field_added_to_a_model_becomes_an_option_of_its_type() -> None:
    options = {o.flag: o for o in options_for(Probe)}
    assert set(options) == {"--name", "--mode", "--shade", "--tags", "--inner-size"}
    assert options["--shade"].default is Colour.RED and options["--shade"].help == "Shade."
    assert options["--inner-size"].default == 5 and options["--inner-size"].fixed  # the default instance's value
    assert _received(list(options.values()), ["--name", "n", "--shade", "blue", "--tags", "a", "--tags", "b"]) == {
        "name": "n",
        "shade": Colour.BLUE,
        "tags": ["a", "b"],
        "inner": {"size": 5},
    }
    probe = typer.Typer()
    probe.command()(config_command(list(options.values()))(lambda fields: None))
    refused = CliRunner().invoke(probe, ["--name", "n", "--shade", "green"])
    words = " ".join(refused.output.replace("│", " ").split())  # the error box, unwrapped
    assert refused.exit_code == 2 and "'green' is not one of 'red', 'blue'" in words, refused.output
