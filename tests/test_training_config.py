"""TrainingConfig: the paper's defaults, validation, a schema Prefect can render as a form, and the
options of `worldsmith train` and `cotrain` derived from it."""

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
from worldsmith.cli.training import COTRAIN_DEFAULTS, COTRAIN_OPTIONS, TRAIN_OPTIONS
from worldsmith.training.config import TINY, TrainingConfig
from worldsmith.training.world_model_sft import WorldModelConfig


def test_defaults_follow_the_reference_recipe():
    config = TrainingConfig(model="/models/tiny", set_name="train-set")
    assert (config.group_size, config.learning_rate, config.history, config.window) == (16, 7e-7, "windowed", 3)
    assert config.rewards.reward("format_error") == -1.0 and config.lora.enabled is False


def test_bad_values_are_named():
    with pytest.raises(ValidationError, match="group_size"):
        TrainingConfig(model="m", set_name="s", group_size=1)
    with pytest.raises(ValidationError, match="window applies to history='windowed' only"):
        TrainingConfig(model="m", set_name="s", history="full", window=5)


def test_json_schema_has_descriptions_enums_and_nested_fields():
    schema = TrainingConfig.model_json_schema()
    properties = schema["properties"]
    assert properties["history"]["enum"] == ["windowed", "full"] and properties["profile"]["enum"] == ["cpu-test", "gpu"]
    assert all(properties[name].get("description") for name in ("model", "set_name", "group_size", "learning_rate", "window"))
    assert schema["$defs"]["LoraConfig"]["properties"]["rank"]["maximum"] == 512


def _leaves(model: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    """Every leaf field of `model` by dotted path (nested models flattened)."""
    leaves: dict[str, FieldInfo] = {}
    for name, info in model.model_fields.items():
        nested = next((a for a in (info.annotation, *typing.get_args(info.annotation))
                       if isinstance(a, type) and issubclass(a, BaseModel)), None)
        leaves.update(_leaves(nested, f"{prefix}{name}.") if nested else {prefix + name: info})
    return leaves


def _click_options(command: str) -> dict[str, Any]:
    """The options of `worldsmith COMMAND` by parameter name."""
    return {p.name: p for p in typer.main.get_command(app).commands[command].params}


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
    names = {name for p in params.values() for name in (*p.opts, *p.secondary_opts)}
    assert {"--set", "--model", "--profile", "--steps", "--group-size", "--learning-rate", "--beta", "--history",
            "--window", "--max-turns", "--max-completion-length", "--rows-per-step", "--processes", "--lora",
            "--tensorboard", "--output", "--save-every", "--warmup-steps", "--seed", "--simulate", "--wm-samples",
            "--uncertainty-threshold", "--real-share", "--json"} <= names
    assert params["steps"].default == TrainingConfig.model_fields["steps"].default == 100


def test_cotrain_options_have_their_configs_defaults_or_co_trainings_own():
    from worldsmith.flows.cotrain import CotrainConfig

    params = _click_options("cotrain")
    parts = {"policy": _leaves(TrainingConfig), "world_model": _leaves(WorldModelConfig)}
    for option in COTRAIN_OPTIONS:
        part, _, field = option.paths[0].partition(".")
        expected = COTRAIN_DEFAULTS.get(option.paths[0], parts[part][field].get_default())
        assert params[option.parameter].default == (None if expected is PydanticUndefined else expected), option.flag
    knobs = {"rounds": "rounds", "real_samples": "real_samples", "real_share": "real_share", "wm_samples": "samples",
             "uncertainty_threshold": "uncertainty_threshold", "max_new_tokens": "max_new_tokens"}
    for parameter, field in knobs.items():
        assert params[parameter].default == CotrainConfig.model_fields[field].default, parameter


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
    args = ["--set", "s", "--simulate", "code", "--wm-samples", "3", "--lora-rank", "8", "--no-tensorboard",
            "--rewards-partial", "0.5"]
    assert runner.invoke(probe, args).exit_code == 0
    assert seen[-1] == {"model": TINY, "set_name": "s", "simulate": {"world_model": "code", "samples": 3},
                        "lora": {"rank": 8}, "tensorboard": False, "rewards": {"partial": 0.5}}
    config = TrainingConfig(**seen[-1])
    assert config.simulate is not None and (config.simulate.samples, config.simulate.uncertainty_threshold) == (3, 1.0)
    assert (config.lora.rank, config.rewards.partial) == (8, 0.5)
