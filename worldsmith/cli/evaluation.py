"""`worldsmith eval`: a policy evaluated on an environment set by the `evaluate` flow. The flow
imports Prefect, so it is imported when the command runs."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import typer
from rich.table import Table

from worldsmith.agent.policy_checks import preflight
from worldsmith.cli.console import console, refusals, say

app = typer.Typer()

#: The verdicts every report counts as a rate, besides the pass rates.
ERROR_COLUMNS = ("env_error", "agent_error", "format_error")

SIMULATE_HELP = (
    "Simulated mode: a world model answers the tool calls instead of the environments' code: "
    "code | static | openai:MODEL | hf:PATH (see docs/world-models.md)."
)


@app.command("eval")
def eval_command(
    set_name: Annotated[str, typer.Option("--set", help="Environment set to evaluate on.")],
    policy: Annotated[str, typer.Option(help="reference | random | openai:MODEL | hf:PATH")] = "reference",
    samples: Annotated[int, typer.Option(help="Episodes per task (k of pass@k).")] = 1,
    split: Annotated[Literal["all", "train", "validation"], typer.Option(help="Split of the set.")] = "all",
    max_turns: Annotated[int, typer.Option(help="Turns per episode.")] = 20,
    window: Annotated[int | None, typer.Option(help="History window in turns (default: full history).")] = None,
    temperature: Annotated[
        float | None, typer.Option(help="Sampling temperature (default 0 for one sample, 0.7 for more).")
    ] = None,
    tool_format: Annotated[
        Literal["native", "text"], typer.Option(help="openai policy: native tool calls or the <tool_call> text format.")
    ] = "native",
    meta_tools: Annotated[bool, typer.Option(help="openai policy: call tools through list_tools / call_tool.")] = False,
    judge: Annotated[str | None, typer.Option(help="LLM judge model on the configured endpoint.")] = None,
    judge_votes: Annotated[int, typer.Option(help="Judges voting per episode.")] = 1,
    side_effects: Annotated[
        bool,
        typer.Option(
            help="Side-effect guard: a change outside the reference solution's footprint makes a complete "
            "episode partial (tasks without a solution are not checked)."
        ),
    ] = True,
    concurrency: Annotated[int, typer.Option(help="Tasks evaluated at once.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the first sample.")] = 0,
    simulate: Annotated[str | None, typer.Option(help=SIMULATE_HELP)] = None,
    wm_samples: Annotated[
        int, typer.Option(help="--simulate: predictions per call (their disagreement is the uncertainty).")
    ] = 1,
    uncertainty_threshold: Annotated[
        float, typer.Option(help="--simulate: stop an episode at a call more uncertain than this.")
    ] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Evaluate a policy on an environment set with the `evaluate` flow; stores an evaluation run."""
    from worldsmith.flows.evaluate import EvaluateParameters, run_evaluate
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.sets import members_in_split

    simulation: dict[str, Any] | None = (
        None
        if simulate is None
        else {"world_model": simulate, "samples": wm_samples, "uncertainty_threshold": uncertainty_threshold}
    )
    # a bad value is answered in one line by the root handler (cli/console.AnsweringGroup)
    params = EvaluateParameters(
        set_name=set_name,
        policy=policy,
        samples=samples,
        split=split,
        max_turns=max_turns,
        window=window,
        temperature=temperature,
        tool_format=tool_format,
        meta_tools=meta_tools,
        judge_model=judge,
        judge_votes=judge_votes,
        side_effects=side_effects,
        concurrency=concurrency,
        seed=seed,
        simulate=simulation,
    )
    with refusals():  # before the flow (and Prefect) starts
        members_in_split(open_catalog(), set_name, split)
    # an endpoint that is down or a model path that holds no model is refused before the run, and an endpoint
    # failing during it ends the run (PolicyUnavailable: one line, exit 1, by the root handler): not the agent
    preflight(params.policy)
    with refusals(), console.status(f"evaluating {policy} on {set_name}", spinner="dots"):
        result = run_evaluate(params)
    if as_json:
        print(json.dumps(result.model_dump(mode="json"), indent=2, default=str))
        return
    k = params.samples
    table = Table(
        title=f"evaluation {result.run_id}: {policy} on {set_name} ({split}, {result.world} worlds, "
        f"{k} sample(s) per task)"
    )
    passes = ["pass@1"] if k == 1 else ["pass@1", f"pass@{k}"]
    for column in ("env", "tasks", "episodes", *passes, "mean reward", "mean turns", *ERROR_COLUMNS):
        table.add_column(column)
    for env, s in [*result.per_env.items(), ("all", result.overall)]:
        rates = (s.env_error_rate, s.agent_error_rate, s.format_error_rate)  # as ERROR_COLUMNS
        table.add_row(
            env,
            str(s.tasks),
            str(s.episodes),
            *(f"{rate:.3f}" for rate in ([s.pass_at_1] if k == 1 else [s.pass_at_1, s.pass_at_k])),
            f"{s.mean_reward:.3f}",
            f"{s.mean_turns:.2f}",
            *(f"{rate:.3f}" for rate in rates),
        )
    console.print(table)
    say(f"trajectories: {result.trajectories.jsonl}")
