"""`worldsmith train`, `resume` and `cotrain`: GRPO of a policy in the worlds, and its co-training
with a world model.

The options of `train` are the fields of TrainingConfig, those of `cotrain` the fields of
CotrainConfig (worldsmith/training/config.py): one source of names, defaults and help with the
training deployments' forms (see `worldsmith/cli/config_options.py`). `cotrain` takes its own knobs
whole and chooses the policy's and the world model's settings it offers, with co-training's smaller
per-round budgets as its own defaults. The flows import Prefect (and the training stack) and the
catalog, so they are imported when a command runs, not when the CLI starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from pydantic import BaseModel
from rich.table import Table

from worldsmith.cli.config_options import UNSET, ConfigValues, config_command, option_for, options_for
from worldsmith.cli.console import console, refusals, say
from worldsmith.cli.run_log import flow_logs
from worldsmith.failures import UserFixable
from worldsmith.training.config import TINY, CotrainConfig, TrainingConfig
from worldsmith.training.memory import check_cuda, check_machine

if TYPE_CHECKING:
    from worldsmith.models.training import TrainResult

app = typer.Typer()

Record = TypeVar("Record", bound=BaseModel)

JsonOption = Annotated[bool, typer.Option("--json", help="Print the run's record as JSON.")]

TRAIN_OPTIONS = options_for(
    TrainingConfig,
    flags={
        "set_name": "--set",
        "lora.enabled": "--lora",
        "simulate.samples": "--wm-samples",
        "simulate.uncertainty_threshold": "--uncertainty-threshold",
    },
    defaults={"model": TINY},  # the config requires a model; the command line's is the offline tiny one
)

COTRAIN_DEFAULTS: dict[str, str | int | float] = {
    "policy.model": TINY,
    "policy.steps": 8,
    "policy.group_size": 4,
    "policy.learning_rate": 1e-4,
    "policy.max_turns": 6,
    "policy.max_completion_length": 128,
    "policy.warmup_steps": 60,
    "world_model.steps": 40,
}
"""Co-training's own defaults on the command line: small budgets per round (TrainingConfig's are a whole run's)."""

COTRAIN_PARTS = ("policy", "world_model")
"""CotrainConfig's nested configs, of which `cotrain` offers the options of `_COTRAIN_PART_FLAGS`; every other
field of CotrainConfig (a co-training knob) is an option of its own."""
_COTRAIN_PART_FLAGS = {
    "--set": ("policy.set_name",),
    "--model": ("policy.model",),
    "--world-model": ("world_model.model",),
    "--profile": ("policy.profile", "world_model.profile"),
    "--policy-steps": ("policy.steps",),
    "--wm-steps": ("world_model.steps",),
    "--group-size": ("policy.group_size",),
    "--learning-rate": ("policy.learning_rate",),
    "--wm-learning-rate": ("world_model.learning_rate",),
    "--max-turns": ("policy.max_turns",),
    "--max-completion-length": ("policy.max_completion_length",),
    "--warmup-steps": ("policy.warmup_steps",),
    "--seed": ("policy.seed", "world_model.seed"),
}
_COTRAIN_KNOB_FLAGS = {"samples": "--wm-samples"}
COTRAIN_OPTIONS = [
    *(
        dataclasses.replace(option, help=f"{option.help} ({' and '.join(option.paths)})")
        for option in (
            option_for(CotrainConfig, *paths, flag=flag, default=COTRAIN_DEFAULTS.get(paths[0], UNSET))
            for flag, paths in _COTRAIN_PART_FLAGS.items()
        )
    ),
    *(
        option_for(CotrainConfig, name, flag=_COTRAIN_KNOB_FLAGS.get(name))
        for name in CotrainConfig.model_fields
        if name not in COTRAIN_PARTS
    ),
]


def _flow_result(command: str, run: Callable[[], Record], as_json: bool) -> Record | None:
    """Run a training flow for `command`, its Prefect log lines, the libraries' warnings and log lines in a
    log file and their progress bars off (cli/run_log.py): a ValueError (a model that is not on this machine,
    a set without tasks) or a catalog refusal exits 2 with its message; with --json the record is printed
    and None returned."""
    from worldsmith.storage.publish import CatalogError

    with refusals(ValueError, CatalogError), flow_logs(command, announce=not as_json, libraries=True):
        result = run()
    if as_json:
        print(json.dumps(result.model_dump(mode="json"), indent=2, default=str))
        return None
    return result


def _check_model_path(model: str, option: str = "--model") -> None:
    """UserFixable (exit 2, one line) when `model` names a path (it holds a separator, or starts with . or ~)
    that is not a directory on this machine: before the flow, not as the Hugging Face loader's traceback."""
    path = Path(model).expanduser()
    if model != TINY and (os.sep in model or model.startswith((".", "~"))) and not path.is_dir():
        reason = "is not a directory" if path.exists() else "does not exist"
        raise UserFixable(
            f"{option} {model}: {reason}; give a model directory, an id in the local Hugging Face cache, or {TINY}"
        )


def _report_training(config: TrainingConfig, result: TrainResult | None) -> None:
    """The validation table and final model of a finished training run (nothing when None: --json)."""
    if result is None:
        return
    resumed = f", resumed after step {result.resumed_from}" if result.resumed_from is not None else ""
    table = Table(
        title=f"training run {result.run_id}: {config.model} on {config.set_name}, {result.steps} steps{resumed}"
    )
    for column in ("validation", "pass@1", "mean reward", "format_error", "evaluation"):
        table.add_column(column)
    for name, report in (("before", result.before), ("after", result.after)):
        if report is not None:
            table.add_row(
                name,
                f"{report.scores.pass_at_1:.3f}",
                f"{report.scores.mean_reward:.3f}",
                f"{report.scores.format_error_rate:.3f}",
                str(report.run_id),
            )
    console.print(table)
    if result.success:  # TrainingConfig.success_samples: the trained tasks, sampled as in training
        from worldsmith.training.success import success_line

        say(f"success rate on the trained tasks: {success_line(result.success)}")
    say(f"final model: {result.final} (object {result.checkpoint})")


def _check_set(name: str, split: str) -> None:
    """UserFixable (exit 2, one line), before the flow (and Prefect) starts, when the set does not exist or
    has no members in `split`."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.publish import CatalogError
    from worldsmith.storage.sets import members_in_split

    try:
        members_in_split(open_catalog(), name, split)
    except CatalogError as exc:
        raise UserFixable(str(exc)) from None


@app.command("train")
@config_command(TRAIN_OPTIONS)
def train_command(fields: ConfigValues, as_json: JsonOption = False) -> None:
    """Train a policy with multi-turn GRPO on an environment set (the `train` flow); stores a training run."""
    from worldsmith.flows.train import check_can_train, run_train, train
    from worldsmith.models.runs import RunKind
    from worldsmith.storage.run_records import recorded_if_refused

    # a bad value is answered in one line by the root handler (cli/console.AnsweringGroup)
    config = TrainingConfig.model_validate(fields)
    # one line before the flow starts (UserFixable, by the root handler): the machine, the other nodes'
    # deployment, the judge's endpoint
    with recorded_if_refused(RunKind.TRAIN, config.model):  # a dashboard page naming the refusal
        check_can_train(config)
        _check_model_path(config.model)
        _check_set(config.set_name, config.split)
    # Ctrl-C or SIGTERM: stopped at the next step boundary, one line naming the checkpoint kept and how to resume
    run = lambda: run_train(lambda: train(config, progress=not as_json), stop_on_signals=True)  # noqa: E731
    _report_training(config, _flow_result("train", run, as_json))


@app.command("resume")
def resume_command(
    run_id: Annotated[int, typer.Argument(help="A training run that stopped before finishing.")],
    as_json: JsonOption = False,
) -> None:
    """Continue a GRPO training run that stopped (a killed worker, a preempted machine) from its
    latest trainer checkpoint in the object store, with the run's own configuration."""
    from worldsmith.flows.train import resume_training, run_train, stored_config

    with refusals(ValueError):
        config = stored_config(run_id)
    check_machine(config)
    run = lambda: run_train(lambda: resume_training(run_id, progress=not as_json), stop_on_signals=True)  # noqa: E731
    _report_training(config, _flow_result("resume", run, as_json))


@app.command("cotrain")
@config_command(COTRAIN_OPTIONS)
def cotrain_command(fields: ConfigValues, as_json: JsonOption = False) -> None:
    """Co-train a policy and a world model (the `cotrain` flow): per round, real rollouts -> world-model
    update -> GRPO on imagined rollouts mixed with real ones -> evaluation in the real worlds. The
    policy's and the world model's steps are per round."""
    from worldsmith.flows.cotrain import run_cotrain
    from worldsmith.models.runs import RunKind
    from worldsmith.storage.run_records import recorded_if_refused

    # a bad value is answered in one line by the root handler (cli/console.AnsweringGroup)
    config = CotrainConfig.model_validate(fields)
    # refused before the flow starts: one line, and a failed run record naming it (`runs ls`, the dashboard)
    with recorded_if_refused(RunKind.COTRAIN, f"{config.policy.model} on {config.policy.set_name}"):
        check_machine(config.policy)
        check_cuda(config.world_model.profile)
        _check_model_path(config.policy.model)
        _check_model_path(config.world_model.model, "--world-model")
        _check_set(config.policy.set_name, config.policy.split)
    # Ctrl-C or SIGTERM: stopped at the next boundary, one line naming the rounds and models kept and how to go on
    result = _flow_result("cotrain", lambda: run_cotrain(config, progress=not as_json), as_json)
    if result is None:
        return
    table = Table(title=f"co-training run {result.run_id} on {config.policy.set_name}")
    columns = {
        "round": "round",
        "real_success_rate": "real success",
        "wm_accuracy_fresh": "wm accuracy (fresh)",
        "wm_loss": "wm loss",
        "imagined_rate": "imagined",
        "stopped_rate": "stopped",
        "eval_pass@1": "eval pass@1",
    }
    for label in columns.values():
        table.add_column(label)
    for r in (row.model_dump() for row in result.rounds):
        table.add_row(
            *[
                f"{r[k]:.3f}" if isinstance(r.get(k), float) else str(r.get(k) if r.get(k) is not None else "")
                for k in columns
            ]
        )
    console.print(table)
    say(f"policy: {result.policy}\nworld model: {result.world_model}", highlight=False)
