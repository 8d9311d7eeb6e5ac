"""What each flow run leaves in Prefect when it ends: its tables and markdown summary (each ending
with a link to its dashboard section) and the summary's log line; and the generate flow's progress
bar while its worlds are built. One `summarise_*` function per flow, called once its run record is
written; the artifact keys are what the dashboard and the tests look up."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.futures import PrefectFuture, as_completed
from sqlmodel import select

from worldsmith.flows.links import dashboard_link
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.llm.prompts import prompt_version
from worldsmith.models.catalog import StageAttempt
from worldsmith.models.curation import CurationResult
from worldsmith.models.evaluation import EvaluationReport, EvaluationSummary
from worldsmith.models.generation import WorldOutcome
from worldsmith.models.training import CotrainResult, StepMetrics, TrainResult
from worldsmith.stages.attempts import stage_summary
from worldsmith.storage.catalog import open_catalog
from worldsmith.tasks.parameters import EvaluateParameters, GenerateParameters
from worldsmith.training.config import CotrainConfig, TrainingConfig
from worldsmith.training.success import success_line


def _rounded(row: Mapping[str, JsonValue], columns: Sequence[str] | None = None) -> JsonObject:
    """`row`'s `columns` (default: all) for display: floats rounded to 4 places, a missing column None."""

    def shown(value: JsonValue) -> JsonValue:
        return round(value, 4) if isinstance(value, float) else value

    return {c: shown(row.get(c)) for c in columns or list(row)}


def as_completed_with_progress(futures: list[PrefectFuture[Any]], key: str, description: str) -> Iterator[Any]:
    """`futures` as they complete, a progress artifact `key` advancing with each."""
    progress = cast(UUID, create_progress_artifact(0.0, key=key, description=description))  # sync: not a coroutine
    for done, future in enumerate(as_completed(futures), start=1):
        update_progress_artifact(progress, 100.0 * done / len(futures))
        yield future


def summarise_generation(params: GenerateParameters, run_id: str, results: list[WorldOutcome]) -> None:
    """A generation run's tables (per stage: rates, attempts, tokens, cost; per world: its outcome) and
    summary (how many worlds good, duplicate, failed, each failed one's stage and reason)."""
    with open_catalog().session() as session:
        attempts = session.exec(select(StageAttempt).where(StageAttempt.run_id == run_id)).all()
    create_table_artifact(
        [dict(row) for row in stage_summary(list(attempts))],
        key="generation-stages",
        description="Per stage: first-attempt success, repair and failure rates, attempts, tokens, cost",
    )
    create_table_artifact(
        [r.model_dump(mode="json") for r in results],
        key="generation-environments",
        description="Environments of this run: status (good, failed, duplicate), ref, failed stage and reason",
    )
    counts = {status: sum(1 for r in results if r.status == status) for status in ("good", "failed", "duplicate")}
    good = counts["good"] + counts["duplicate"]
    failed_lines = "".join(
        f"- `{r.env_id}` ({r.failed_stage or 'checks'}): {r.reason}\n" for r in results if r.status == "failed"
    )
    create_markdown_artifact(
        f"# Generation run\n\n{good} of {len(results)} environments good: {counts['good']} published as good, "
        f"{counts['duplicate']} identical to a good one already published, {counts['failed']} failed "
        f"(backend {params.backend}, prompt version {prompt_version()}).\n\n"
        + (f"Failed:\n\n{failed_lines}\n" if failed_lines else "")
        + dashboard_link("generate"),
        key="generation-summary",
    )
    get_run_logger().info("%d of %d environments good (%d failed)", good, len(results), counts["failed"])


def summarise_curation(result: CurationResult) -> None:
    """A curation run's table (the set's members) and summary (created or found, splits, tasks)."""
    members, splits = result.members, result.split_counts()
    create_table_artifact(
        [m.model_dump(mode="json") for m in members],
        key="curated-set-members",
        description=f"Members of set {result.name}",
    )
    verb = "Created" if result.created else "Found existing"
    create_markdown_artifact(
        f"# Curation\n\n{verb} set `{result.name}`: {len(members)} environment versions ({splits['train']} train, "
        f"{splits['validation']} validation), {result.tasks} tasks.\n\n{dashboard_link('curate')}",
        key="curation-summary",
    )
    get_run_logger().info("set %s: %d members", result.name, len(members))


def summarise_evaluation(params: EvaluateParameters, result: EvaluationReport) -> None:
    """An evaluation run's table (scores per environment) and summary (its overall scores)."""
    rows = [{"env": env, **_rounded(scores.model_dump())} for env, scores in result.per_env.items()]
    create_table_artifact(
        rows, key="evaluation-per-env", description=f"{params.policy} on {params.set_name}: scores per environment"
    )
    overall = result.overall
    create_markdown_artifact(
        f"# Evaluation {result.run_id}\n\n{params.policy} on set `{params.set_name}` ({params.split}, {result.world} "
        f"worlds), {params.samples} sample(s) per task: "
        f"pass@1 {overall.pass_at_1:.3f}, pass@{params.samples} {overall.pass_at_k:.3f}, mean turns "
        f"{overall.mean_turns:.2f}, env_error rate {overall.env_error_rate:.3f}, format_error rate "
        f"{overall.format_error_rate:.3f}.\n\n{dashboard_link('evaluate')}",
        key="evaluation-summary",
    )
    get_run_logger().info("evaluation %s: %s", result.run_id, json.dumps(overall.model_dump()))


_STEP_COLUMNS = ("step", "loss", "reward", "reward_std", "success_rate", "env_error_rate", "turns", "tokens", "kl")
_JUDGE_COLUMNS = ("judge_requests", "judge_cache_hits", "judge_cost_usd", "judge_latency_s", "judge_error_rate")
_WORLD_COLUMNS = ("reward_real", "reward_imagined", "reward_gap", "real_start_rate")


def step_table(log: list[StepMetrics], config: TrainingConfig) -> list[JsonObject]:
    """One row per logged step with the metrics people watch (rounded for display): with a judged reward
    also the judge's requests, cost and latency; in simulated training the real and imagined rewards apart."""
    columns: tuple[str, ...] = _STEP_COLUMNS
    if config.reward != "verifier":
        columns += _JUDGE_COLUMNS
    if config.simulate is not None:
        columns += _WORLD_COLUMNS
    return [_rounded(entry, columns) for entry in log]


def training_summary(config: TrainingConfig, result: TrainResult) -> str:
    """A training run's markdown summary: what was trained where, validation before and after, the
    success rate on its own tasks, the last step, the final model."""

    def line(name: str, report: EvaluationSummary | None) -> str:
        if report is None:
            return f"- {name}: not evaluated (no validation split in the set, or validation off)"
        return f"- {name}: pass@1 {report.scores.pass_at_1:.3f}, mean reward {report.scores.mean_reward:.3f} (evaluation {report.run_id})"

    last = result.log[-1] if result.log else {}
    worlds = (
        "real worlds"
        if config.simulate is None
        else f"world model `{config.simulate.world_model}` ({config.real_share:.0%} of groups real)"
    )
    return "\n".join(
        [
            f"# Training run {result.run_id}",
            "",
            (
                f"GRPO of `{config.model}` on set `{config.set_name}` ({config.split}) in the {worlds}, "
                f"{result.steps} steps, group {config.group_size}, history {config.history}."
            ),
            "",
            line("before", result.before),
            line("after", result.after),
            *(
                [f"- success rate on its own tasks (sampled as in training): {success_line(result.success)}"]
                if result.success
                else []
            ),
            "",
            f"Last step: reward {last.get('reward', float('nan')):.3f}, success rate {last.get('success_rate', float('nan')):.3f}.",
            f"Final model: object {result.checkpoint}.",
            "",
            dashboard_link("train"),
        ]
    )


def summarise_training(config: TrainingConfig, result: TrainResult) -> None:
    """A training run's table (metrics per step) and summary (`training_summary`)."""
    create_table_artifact(
        step_table(result.log, config),
        key="training-steps",
        description=f"Training run {result.run_id}: metrics per step",
    )
    create_markdown_artifact(training_summary(config, result), key="training-summary")
    get_run_logger().info(
        "training run %s finished: %s steps, checkpoint %s", result.run_id, result.steps, result.checkpoint
    )


_ROUND_COLUMNS = (
    "round",
    "real_success_rate",
    "transitions",
    "wm_accuracy_fresh",
    "wm_loss",
    "imagined_rate",
    "stopped_rate",
    "policy_reward",
    "policy_reward_real",
    "policy_reward_imagined",
    "eval_pass@1",
)


def summarise_cotraining(config: CotrainConfig, result: CotrainResult, eval_split: str) -> None:
    """A co-training run's table (metrics per round) and summary (real success rate first -> last round,
    the last evaluation, the models)."""
    rounds = result.rounds
    create_table_artifact(
        [_rounded(r.model_dump(), _ROUND_COLUMNS) for r in rounds],
        key="cotrain-rounds",
        description=f"Co-training run {result.run_id}: metrics per round",
    )
    last = rounds[-1]
    create_markdown_artifact(
        f"# Co-training run {result.run_id}\n\n{len(rounds)} rounds on set `{config.policy.set_name}`: real success "
        f"rate {rounds[0].real_success_rate:.3f} -> {last.real_success_rate:.3f}; last evaluation ({eval_split}) "
        f"pass@1 {last.eval_pass_at_1 if last.eval_pass_at_1 is not None else 'n/a'}.\n\nPolicy: `{result.policy}`. "
        f"World model: `{result.world_model}`.\n\n{dashboard_link('cotrain')}",
        key="cotrain-summary",
    )
