"""`worldsmith wm ...`: world models: transition data from real episodes, their training, and their
evaluation against the real worlds. The options of `wm train` are the fields of WorldModelConfig
(worldsmith/training/config.py), the form of the world-model SFT that co-training runs too."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from worldsmith.agent.trajectories import read_jsonl
from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.loader import load_bundle
from worldsmith.cli.config_options import ConfigValues, config_command, options_for
from worldsmith.cli.console import console, failure, say
from worldsmith.cli.run_log import flow_logs
from worldsmith.runtime.episode import Runtime
from worldsmith.training.config import WorldModelConfig
from worldsmith.worldmodel.transitions import build_transitions, read_transitions, write_transitions

app = typer.Typer(
    help="World models: transition data from real episodes, their training, and their evaluation against "
    "the real worlds.",
    no_args_is_help=True,
)

WM_TRAIN_OPTIONS = options_for(WorldModelConfig)

#: The splits `wm eval --split` takes: a transition's split, or all of them.
WM_SPLITS = ("train", "validation", "test", "all")


@app.command("data")
def wm_data(
    trajectories: Annotated[Path, typer.Argument(help="trajectories.jsonl of an evaluation run (any policy).")],
    out: Annotated[Path, typer.Argument(help="Directory to write transitions.jsonl into.")],
    seed: Annotated[int, typer.Option(help="Seed of the environment split.")] = 0,
    validation_fraction: Annotated[float, typer.Option(help="Share of environments in the validation split.")] = 0.15,
    test_fraction: Annotated[float, typer.Option(help="Share of environments in the test split.")] = 0.15,
) -> None:
    """Replay every tool call of the trajectories in fresh episodes: (state, action) -> (observation,
    diff) transitions, split by environment (no world is in two splits)."""
    from worldsmith.storage.bundle_cache import cached_bundle
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.versions import version_with_content

    loaded = read_jsonl(trajectories)
    bundles: dict[str, Bundle] = {}
    with open_catalog().session() as session:
        for key in sorted({t.env_key for t in loaded}):
            version = version_with_content(session, key)
            if version is None:
                raise failure(f"environment version {key[:12]}... of the trajectories is not in the catalog")
            bundles[key] = load_bundle(cached_bundle(version.ref, key))
    with Runtime() as runtime:
        transitions = build_transitions(
            runtime, bundles, loaded, seed=seed, validation=validation_fraction, test=test_fraction
        )
    if not transitions:
        raise failure(f"no tool call in {trajectories}: nothing to write")
    path = write_transitions(transitions, out / "transitions.jsonl")
    splits = {s: len({t.env_id for t in transitions if t.split == s}) for s in ("train", "validation", "test")}
    say(
        f"{len(transitions)} transitions of {len(loaded)} trajectories: {path} (environments per split: {splits})",
        highlight=False,
    )


@app.command("train")
@config_command(WM_TRAIN_OPTIONS)
def wm_train(
    fields: ConfigValues,
    transitions: Annotated[Path, typer.Argument(help="transitions.jsonl made by `wm data` (its train split is used).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the run's record as JSON.")] = False,
) -> None:
    """Fine-tune a causal LM (SFT with TRL) to answer a call's observation and diff as JSON; the run,
    its losses and the final model go to the catalog and the object store. Evaluate it with
    `wm eval --model hf:DIR`."""
    from worldsmith.models.runs import RunKind
    from worldsmith.storage.run_records import recorded_if_refused
    from worldsmith.training.world_model_runs import train_split, train_world_model

    # a bad value, an unreadable file: one line by the root handler (cli/console.AnsweringGroup)
    config = WorldModelConfig.model_validate(fields)
    try:
        # refused before its run opens: a failed run record naming it too (`runs ls`, the dashboard)
        with recorded_if_refused(RunKind.WORLD_MODEL, f"{config.model} on {transitions}"):
            loaded = read_transitions(transitions)
            train_split(loaded)
        with flow_logs("wm-train", announce=not as_json, libraries=True):  # the libraries' lines in a log file
            result = train_world_model(loaded, config)  # a failure once its run opened: the run reads failed
    except ValueError as exc:
        raise failure(str(exc).splitlines()[0]) from None
    if as_json:
        print(json.dumps(result.model_dump(mode="json"), indent=2, default=str))
        return
    losses = [entry["loss"] for entry in result.log]
    say(
        f"world-model run {result.run_id}: {result.steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; "
        f"model {result.model} (object {result.checkpoint})",
        highlight=False,
    )


@app.command("eval")
def wm_eval(
    transitions: Annotated[Path, typer.Argument(help="transitions.jsonl made by `wm data`.")],
    model: Annotated[
        str,
        typer.Option(
            help="oracle | static | openai:MODEL (the WORLDSMITH_LLM_* endpoint) | hf:PATH (e.g. from `wm train`)."
        ),
    ] = "oracle",
    split: Annotated[str, typer.Option(help="train | validation | test | all")] = "test",
    k: Annotated[int, typer.Option(help="Steps of the compound-error evaluation.")] = 3,
    samples: Annotated[int, typer.Option(help="Samples per call for self-consistency (1: none).")] = 1,
    max_new_tokens: Annotated[int, typer.Option(help="hf: models: tokens generated per answer at most.")] = 512,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Score a world model against the real worlds: one-step accuracy (observation, outcome, diff
    P/R/F1 at row and field level) per environment, k-step compound error, self-consistency."""
    from worldsmith.worldmodel.evaluation import evaluate_world_model
    from worldsmith.worldmodel.world_models import world_model

    if split not in WM_SPLITS:
        raise failure(f"--split {split}: not a split; use {' | '.join(WM_SPLITS)}")
    for option, value in (("--k", k), ("--samples", samples), ("--max-new-tokens", max_new_tokens)):
        if value < 1:
            raise failure(f"{option} {value}: give a number of at least 1")
    # an hf: model's library lines (loading weights, warnings) go to a log file (cli/run_log.py)
    with flow_logs("wm-eval", announce=not as_json, libraries=True) if model.startswith("hf:") else nullcontext():
        try:  # an unreadable file: one line by the root handler (cli/console.AnsweringGroup)
            chosen = [t for t in read_transitions(transitions) if split == "all" or t.split == split]
            wm = world_model(model, max_new_tokens=max_new_tokens)
        except ValueError as exc:
            raise failure(str(exc)) from None
        if not chosen:
            raise failure(f"no transitions in split {split!r} of {transitions}")
        report = evaluate_world_model(wm, chosen, k=k, samples=samples)
    if as_json:
        print(json.dumps(report.model_dump(mode="json"), indent=2))
        return
    one = report.one_step
    table = Table(title=f"world model {wm.name} on {one.transitions} transitions ({split})")
    for column in ("environment", "transitions", "observation exact", "outcome agreement", "rows F1", "fields F1"):
        table.add_column(column)
    for env, scores in [*one.per_env.items(), ("all", one)]:
        table.add_row(
            env,
            str(scores.transitions),
            f"{scores.observation_exact:.3f}",
            f"{scores.outcome_agreement:.3f}",
            f"{scores.rows.f1:.3f}",
            f"{scores.fields.f1:.3f}",
        )
    console.print(table)
    steps = ", ".join(f"{s.step}: {s.compound_error:.3f}" for s in report.k_step.steps)
    say(f"compound error by step: {steps}", highlight=False)
