"""`worldsmith eval`: a policy evaluated on an environment set by the `evaluate` flow. Its options are
the fields of EvaluateParameters (worldsmith/tasks/parameters.py, see `worldsmith/cli/config_options.py`).
The flow imports Prefect, so it is imported when the command runs."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from worldsmith.agent.policy_checks import preflight
from worldsmith.cli.config_options import ConfigValues, config_command, options_for
from worldsmith.cli.console import console, refusals, say
from worldsmith.cli.run_log import flow_logs
from worldsmith.llm.endpoint_check import check_endpoint, configured_endpoint
from worldsmith.tasks.parameters import EvaluateParameters

app = typer.Typer()

#: The verdicts every report counts as a rate, besides the pass rates.
ERROR_COLUMNS = ("env_error", "agent_error", "format_error")

EVAL_OPTIONS = options_for(
    EvaluateParameters,
    flags={
        "set_name": "--set",
        "judge_model": "--judge",
        "simulate.samples": "--wm-samples",
        "simulate.uncertainty_threshold": "--uncertainty-threshold",
    },
)


@app.command("eval")
@config_command(EVAL_OPTIONS)
def eval_command(
    fields: ConfigValues,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Evaluate a policy on an environment set with the `evaluate` flow; stores an evaluation run."""
    from worldsmith.flows.evaluate import run_evaluate
    from worldsmith.models.runs import RunKind
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.run_records import recorded_if_refused
    from worldsmith.storage.sets import members_in_split

    # a bad value is answered in one line by the root handler (cli/console.AnsweringGroup)
    params = EvaluateParameters.model_validate(fields)
    with refusals():  # before the flow (and Prefect) starts
        members_in_split(open_catalog(), params.set_name, params.split)
    # an endpoint that is down or a model path that holds no model is refused before the run, and an endpoint
    # failing during it ends the run (PolicyUnavailable: one line, exit 1, by the root handler): not the agent
    with recorded_if_refused(RunKind.EVALUATE, f"{params.policy} on {params.set_name}"):  # a dashboard page
        preflight(params.policy)
        if params.judge_model is not None:  # the judge's endpoint too: a judge that cannot answer is refused here
            check_endpoint(configured_endpoint("the judge endpoint", params.judge_model, model_setting="--judge"))
    with (
        refusals(),
        flow_logs("eval", announce=not as_json),
        console.status(f"evaluating {params.policy} on {params.set_name}", spinner="dots"),
    ):
        result = run_evaluate(params, stop_on_signals=True)  # Ctrl-C: one line, the run recorded cancelled
    if as_json:
        print(json.dumps(result.model_dump(mode="json"), indent=2, default=str))
        return
    k = params.samples
    table = Table(
        title=f"evaluation {result.run_id}: {params.policy} on {params.set_name} ({params.split}, {result.world} worlds, "
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
