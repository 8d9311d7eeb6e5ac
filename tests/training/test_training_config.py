"""TrainingConfig: the paper's defaults, validation, a schema Prefect can render as a form, and the
options of `worldsmith train`, `cotrain` and `wm train` derived from it, CotrainConfig and
WorldModelConfig."""

from __future__ import annotations

import typing
from typing import Any

import pytest
import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.cli.config_options import config_command
from worldsmith.cli.training import COTRAIN_DEFAULTS, COTRAIN_OPTIONS, COTRAIN_PARTS, TRAIN_OPTIONS
from worldsmith.cli.wm import WM_TRAIN_OPTIONS
from worldsmith.training.config import TINY, CotrainConfig, TrainingConfig, WorldModelConfig

pytestmark = pytest.mark.unit


def test_defaults_follow_the_reference_recipe():
    config = TrainingConfig(model="/models/tiny", set_name="train-set")
    assert (config.group_size, config.learning_rate, config.history, config.window) == (16, 7e-7, "windowed", 3)
    assert (
        config.rewards.reward("format_error") == 0.0 and config.lora.enabled is False
    )  # an attempt, not below giving up


def test_bad_values_are_named():
    with pytest.raises(ValidationError, match="group_size"):
        TrainingConfig(model="m", set_name="s", group_size=1)
    with pytest.raises(ValidationError, match="window applies to history='windowed' only"):
        TrainingConfig(model="m", set_name="s", history="full", window=5)


def test_a_full_history_configuration_survives_its_stored_form():
    """A run's configuration is stored and sent (resume, the deployment form) with every field set."""
    config = TrainingConfig(model="m", set_name="s", history="full")
    assert TrainingConfig.model_validate(config.model_dump()) == config
    assert TrainingConfig.model_validate_json(config.model_dump_json()) == config


def test_the_json_schema_describes_each_field_with_its_constraints():
    schema = TrainingConfig.model_json_schema()
    properties = schema["properties"]
    assert properties["history"]["enum"] == ["windowed", "full"] and properties["profile"]["enum"] == [
        "cpu-test",
        "gpu",
    ]
    assert all(
        properties[name].get("description") for name in ("model", "set_name", "group_size", "learning_rate", "window")
    )
    assert schema["$defs"]["LoraConfig"]["properties"]["rank"]["maximum"] == 512


def _leaves(model: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    """Every leaf field of `model` by dotted path (nested models flattened)."""
    leaves: dict[str, FieldInfo] = {}
    for name, info in model.model_fields.items():
        nested = next(
            (
                a
                for a in (info.annotation, *typing.get_args(info.annotation))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            None,
        )
        leaves.update(_leaves(nested, f"{prefix}{name}.") if nested else {prefix + name: info})
    return leaves


def _click_options(*command: str) -> dict[str, Any]:
    """The options of `worldsmith COMMAND...` by parameter name."""
    found = typer.main.get_command(app)
    for name in command:
        found = found.commands[name]
    return {p.name: p for p in found.params}


def _flags(params: dict[str, Any]) -> set[str]:
    """Every option name (`--lora` and `--no-lora`) of `params`."""
    return {name for p in params.values() for name in (*p.opts, *p.secondary_opts)}


def test_every_field_is_a_train_option_with_the_configs_default():
    options = {o.paths[0]: o for o in TRAIN_OPTIONS}
    params = _click_options("train")
    assert set(options) == set(_leaves(TrainingConfig))  # a field added to the config is an option
    for path, info in _leaves(TrainingConfig).items():
        param = params[options[path].parameter]
        if path == "model":
            assert param.default == TINY  # the config requires a model; the command line's is the tiny one
        elif path in ("set_name", "simulate.world_model"):
            assert param.default is None and param.required == (path == "set_name")
        else:
            assert param.default == info.get_default(call_default_factory=True), path
        assert param.help and (info.description or "")[1:] in param.help, path  # the field's description
    # the options' names of before the derivation
    assert {
        "--set",
        "--model",
        "--profile",
        "--steps",
        "--group-size",
        "--learning-rate",
        "--beta",
        "--history",
        "--window",
        "--max-turns",
        "--max-completion-length",
        "--rows-per-step",
        "--processes",
        "--lora",
        "--tensorboard",
        "--output",
        "--save-every",
        "--warmup-steps",
        "--seed",
        "--simulate",
        "--wm-samples",
        "--uncertainty-threshold",
        "--real-share",
        "--json",
    } <= _flags(params)
    assert params["steps"].default == TrainingConfig.model_fields["steps"].default == 100


def test_cotrain_options_have_their_configs_defaults_or_co_trainings_own():
    params = _click_options("cotrain")
    options = {o.paths[0]: o for o in COTRAIN_OPTIONS}
    knobs = {name for name in CotrainConfig.model_fields if name not in COTRAIN_PARTS}
    assert knobs <= set(options)  # a co-training knob added to the config is an option
    leaves = _leaves(CotrainConfig)
    for option in COTRAIN_OPTIONS:
        info = leaves[option.paths[0]]
        expected = COTRAIN_DEFAULTS.get(option.paths[0], info.get_default(call_default_factory=True))
        assert params[option.parameter].default == (None if expected is PydanticUndefined else expected), option.flag
        assert info.description and info.description[1:] in params[option.parameter].help, option.flag
    # the options' names and the knobs' defaults of before the derivation
    assert {
        "--set",
        "--model",
        "--world-model",
        "--profile",
        "--policy-steps",
        "--wm-steps",
        "--group-size",
        "--learning-rate",
        "--wm-learning-rate",
        "--max-turns",
        "--max-completion-length",
        "--warmup-steps",
        "--seed",
        "--rounds",
        "--real-samples",
        "--real-share",
        "--wm-samples",
        "--uncertainty-threshold",
        "--max-new-tokens",
        "--json",
    } <= _flags(params)
    assert {
        name: params[name].default
        for name in ("rounds", "real_samples", "real_share", "wm_samples", "uncertainty_threshold", "max_new_tokens")
    } == {
        "rounds": 3,
        "real_samples": 2,
        "real_share": 0.2,
        "wm_samples": 3,
        "uncertainty_threshold": 0.5,
        "max_new_tokens": 384,
    }
    assert params["wm_steps"].help == "Optimizer steps. (world_model.steps)"


def test_cotrain_gives_the_config_the_fields_set():
    """Co-training's own defaults are always set; a knob left at its default is left to the config;
    --wm-samples is the knob `samples`, and --seed sets both parts."""
    seen: list[dict[str, Any]] = []
    probe = typer.Typer()

    @probe.command()
    @config_command(COTRAIN_OPTIONS)
    def record(fields: dict[str, Any]) -> None:
        seen.append(fields)

    args = ["--set", "s", "--wm-samples", "5", "--seed", "3", "--no-reference-transitions"]
    assert CliRunner().invoke(probe, args).exit_code == 0
    assert seen[-1] == {
        "policy": {
            "model": TINY,
            "set_name": "s",
            "steps": 8,
            "group_size": 4,
            "learning_rate": 1e-4,
            "max_turns": 6,
            "max_completion_length": 128,
            "warmup_steps": 60,
            "seed": 3,
        },
        "world_model": {"steps": 40, "seed": 3},
        "samples": 5,
        "reference_transitions": False,
    }
    config = CotrainConfig(**seen[-1])
    assert (config.rounds, config.samples, config.policy.steps, config.world_model.steps) == (3, 5, 8, 40)
    assert (config.policy.seed, config.world_model.seed, config.world_model.learning_rate) == (3, 3, 3e-3)


def test_every_world_model_field_is_a_wm_train_option_with_the_configs_default():
    params = _click_options("wm", "train")
    assert {o.paths[0] for o in WM_TRAIN_OPTIONS} == set(WorldModelConfig.model_fields)
    for option in WM_TRAIN_OPTIONS:
        info = WorldModelConfig.model_fields[option.paths[0]]
        assert params[option.parameter].default == info.default and info.description == params[option.parameter].help
    assert {
        "--model",
        "--profile",
        "--steps",
        "--learning-rate",
        "--batch-size",
        "--seed",
        "--output",
        "--json",
    } <= _flags(params)
    assert (params["steps"].default, params["learning_rate"].default, params["batch_size"].default) == (60, 3e-3, 8)


def test_a_command_receives_only_the_fields_given():
    """Options left at their default leave the field unset (the config's validators see what the
    user wrote); an optional nested model is set only with its switch."""
    seen: list[dict[str, Any]] = []
    probe = typer.Typer()

    @probe.command()
    @config_command(TRAIN_OPTIONS)
    def record(fields: dict[str, Any]) -> None:
        seen.append(fields)

    runner = CliRunner()
    assert runner.invoke(probe, ["--set", "s", "--wm-samples", "3", "--history", "full"]).exit_code == 0
    assert seen[-1] == {"model": TINY, "set_name": "s", "history": "full"}
    config = TrainingConfig(**seen[-1])
    assert config.simulate is None and "window" not in config.model_fields_set
    args = [
        "--set",
        "s",
        "--simulate",
        "code",
        "--wm-samples",
        "3",
        "--lora-rank",
        "8",
        "--no-tensorboard",
        "--rewards-partial",
        "0.5",
    ]
    assert runner.invoke(probe, args).exit_code == 0
    assert seen[-1] == {
        "model": TINY,
        "set_name": "s",
        "simulate": {"world_model": "code", "samples": 3},
        "lora": {"rank": 8},
        "tensorboard": False,
        "rewards": {"partial": 0.5},
    }
    config = TrainingConfig(**seen[-1])
    assert config.simulate is not None and (config.simulate.samples, config.simulate.uncertainty_threshold) == (3, 1.0)
    assert (config.lora.rank, config.rewards.partial) == (8, 0.5)
