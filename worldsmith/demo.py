"""`worldsmith demo`: the main job on the embedded defaults, the whole loop on one machine.

up (local Prefect server, work pools, deployments, worker, dashboard) -> generate ~10 environments
with the offline procedural backend, faults on so the repair loops work (and one fault that survives
repair, so the dashboard has a failed world to open) -> curate the good ones
into a set -> serve one over the MCP gateway and solve its tasks through the MCP client -> evaluate
the reference and random policies -> a short GRPO run of the tiny model on the CPU, with a curriculum
(TrainingConfig.curriculum) that lets it learn: the train tasks with the shortest reference solutions,
only their tools shown, a warm-up on their reference solutions and on a lazy habit; its success rate on
those tasks and on held-out tasks of the same kind (the same tools, other records: the generator makes a
sibling of every task, and the curriculum trains on one task per kind, so each trained task has one it never
trains on), sampled as in training, before -> after -> a summary with the dashboard and Prefect UI
addresses (also written as JSON to WORLDSMITH_HOME/demo-summary.json).

Every flow runs in this process against the local server, so each run shows in the Prefect UI and
every number lands in the catalog the dashboard reads.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import anyio
from pydantic import BaseModel, Field
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from worldsmith.flows.interruption import STOP, Interrupted, run_stoppable_flow, stopped_by, stops_interrupting
from worldsmith.jsonvalue import JsonObject
from worldsmith.ops.stack import Stack
from worldsmith.settings import get_settings

if TYPE_CHECKING:
    from worldsmith.models.results import VerifierResult
    from worldsmith.models.training import TrainResult
    from worldsmith.training.config import TrainingConfig


class DemoOptions(BaseModel):
    """Knobs of the demonstration (the defaults take about 3 minutes on 2 idle cores)."""

    envs: int = Field(10, ge=2, le=100, description="Environments to generate.")
    fault_rate: float = Field(
        0.3, ge=0, le=1, description="Share of first attempts that fail like LLM output (repairs happen)."
    )
    persistent_fault_rate: float = Field(
        0.15,
        ge=0,
        le=1,
        description="Share of worlds whose seed fault survives every repair (they fail: the failed-worlds page "
        "has one to open).",
    )
    seed: int = Field(0, description="Seed of generation, curation, evaluation and training.")
    random_samples: int = Field(2, ge=1, description="Episodes per task of the random policy.")
    train_steps: int = Field(15, ge=1, description="GRPO steps of the tiny model.")
    group_size: int = Field(8, ge=2, description="Rollouts per task in each GRPO step of the tiny model.")
    warmup_steps: int = Field(80, ge=0, description="Supervised warm-up steps of the tiny model.")
    train_tasks: int = Field(
        2,
        ge=1,
        description="Tasks the tiny model trains on: the train split's with the shortest reference solutions, one per kind.",
    )
    success_samples: int = Field(
        32,
        ge=1,
        description="Rollouts per trained task, and per held-out task of its kind, that measure their success "
        "rates before and after GRPO.",
    )
    set_name: str = Field("demo", description="Name of the environment set the demonstration curates.")
    prefect_port: int | None = Field(
        None, ge=0, le=65535, description="Port of the Prefect server (default WORLDSMITH_PREFECT_PORT; 0: any free)."
    )
    dashboard_port: int | None = Field(
        None, ge=0, le=65535, description="Port of the dashboard (default WORLDSMITH_DASHBOARD_PORT; 0: any free)."
    )

    def training_config(self) -> TrainingConfig:
        """The training stage's recipe (the tiny model's cache key derives from it: bench/tiny_prepare.py)."""
        from worldsmith.training.config import TINY, Curriculum, TrainingConfig

        return TrainingConfig(
            model=TINY,
            set_name=self.set_name,
            curriculum=Curriculum(tasks=self.train_tasks, tools="solution", lazy_habit=True),
            steps=self.train_steps,
            group_size=self.group_size,
            rows_per_step=min(2, self.train_tasks),
            learning_rate=5e-4,
            temperature=0.7,
            warmup_steps=self.warmup_steps,
            max_turns=4,
            max_completion_length=64,
            success_samples=self.success_samples,
            seed=self.seed,
        )


class DemoUrls(TypedDict):
    prefect_ui: str
    dashboard: str


class DemoGeneration(TypedDict):
    environments: int
    good: int
    failed: int
    repaired_stage_runs: int


class DemoSet(TypedDict):
    name: str
    members: int
    train: int
    validation: int


class DemoMcp(TypedDict):
    env: str
    tasks: int
    complete: int


DemoEvaluation = TypedDict("DemoEvaluation", {"run_id": int, "pass@1": float, "episodes": int, "env_error_rate": float})

DemoTraining = TypedDict(
    "DemoTraining",
    {
        "run_id": int,
        "steps": int,
        "checkpoint": str,
        "reward_first": float | None,
        "reward_last": float | None,
        "validation_pass@1_before": float | None,
        "validation_pass@1_after": float | None,
        "success_before": float,
        "success_after": float,
        "success_rollouts": int,
        "held_out_tasks": int,
        "held_out_before": float | None,
        "held_out_after": float | None,
    },
)


class DemoSummary(TypedDict, total=False):
    """What the demonstration did, step by step (written as WORLDSMITH_HOME/demo-summary.json): its options, the
    seconds of each step, the addresses, and the numbers of each step (present once the step ran)."""

    options: JsonObject
    seconds: dict[str, float]
    urls: DemoUrls
    generation: DemoGeneration
    set: DemoSet
    mcp: DemoMcp
    evaluations: dict[str, DemoEvaluation]
    training: DemoTraining


def _solve_over_mcp(url: str, gateway: Any, env_id: str, task: Any) -> str:
    """Replay `task`'s reference solution through an MCP session, then verify it; returns the verdict."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def solve() -> str:
        async with streamable_http_client(f"{url}/envs/{env_id}/mcp?task={task.id}") as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                for step in task.solution:
                    await session.call_tool(step.tool, step.arguments)
                (episode,) = gateway.sessions.values()  # one session at a time
                verdict: VerifierResult = await anyio.to_thread.run_sync(episode.verify, task.answer or "")
        return verdict.status.value

    return anyio.run(solve)


def held_out_line(training: DemoTraining) -> str:
    """The held-out tasks' success rates as the demo prints them beside the trained tasks'."""
    if training["held_out_before"] is None or training["held_out_after"] is None:
        return "no held-out task of the same kind in the set"
    return (
        f"on {training['held_out_tasks']} held-out tasks of the same kind (same tools, other records) "
        f"{training['held_out_before']:.3f} -> {training['held_out_after']:.3f}"
    )


class Demo:
    """The demonstration's steps, each printing what it did; `summary` collects the numbers."""

    def __init__(self, options: DemoOptions, console: Console):
        self.options, self.console = options, console
        self.stack = Stack.current().with_ports(options.prefect_port, options.dashboard_port)
        self.summary: DemoSummary = {"options": options.model_dump()}

    def run(self) -> DemoSummary:
        # Flows in this process report to the stack's server; Prefect's console logging stays quiet.
        os.environ["PREFECT_API_URL"] = self.stack.api_url
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
        for variable in (
            "HF_HUB_DISABLE_PROGRESS_BARS",
            "HF_DATASETS_DISABLE_PROGRESS_BARS",
        ):  # the demo draws its own progress
            os.environ.setdefault(variable, "1")
        warnings.filterwarnings("ignore", category=FutureWarning)
        # Ctrl-C or SIGTERM: the step in flight stops as its own command would, the steps after it do not run
        return run_stoppable_flow(self._steps, lambda _: "the demonstration completed first", "nothing done yet")

    def _steps(self) -> DemoSummary:
        seconds: dict[str, float] = {}
        self.summary["seconds"] = seconds
        for step in (self.up, self.generate, self.curate, self.serve_over_mcp, self.evaluate, self.train):
            started = time.monotonic()
            try:
                with stops_interrupting():
                    STOP.check()
                    step()
            except Interrupted as exc:
                raise Interrupted(self.stopped_line(step.__name__, exc), exc.signum, exc.kept) from None
            seconds[step.__name__] = round(time.monotonic() - started, 1)
        self.finish()
        return self.summary

    def stopped_line(self, step: str, stop: Interrupted) -> str:
        """What a demonstration stopped in `step` kept (the steps done, and what the step's own stop said)
        and how to go on."""
        done = list(self.summary.get("seconds", {}))
        said = "" if str(stop) == stopped_by(stop.signum) else f" ({stop})"  # the step's own account, if any
        stack = (
            f"the local stack is still up ({self.stack.dashboard_url}; `worldsmith down` stops it)"
            if "urls" in self.summary
            else "the local stack may be partly up (`worldsmith down` stops it)"
        )
        return (
            f"demo stopped in its {step} step{said}; steps done: {', '.join(done) or 'none'}; what they made "
            f"stays in the catalog; {stack}; run `worldsmith demo` again to go on"
        )

    def _step(self, number: int, title: str) -> None:
        self.console.rule(f"[bold]{number}. {title}")

    def up(self) -> None:
        self._step(1, "local stack: Prefect server, work pools, deployments, worker, dashboard")
        with self.console.status("starting the Prefect server and deploying deployments/prefect.yaml"):
            state = self.stack.up()
        for part, what in state.items():
            self.console.print(f"{part}: {what}", highlight=False)
        self.summary["urls"] = {"prefect_ui": self.stack.ui_url, "dashboard": self.stack.dashboard_url}

    def generate(self) -> None:
        from sqlmodel import col, select

        from worldsmith.flows.generate import run_generate
        from worldsmith.models.catalog import StageAttempt
        from worldsmith.stages.attempts import stage_summary
        from worldsmith.storage.catalog import open_catalog
        from worldsmith.tasks.parameters import GenerateParameters

        o = self.options
        self._step(2, f"generate {o.envs} environments (procedural backend, fault rate {o.fault_rate})")
        params = GenerateParameters(
            count=o.envs,
            backend="procedural",
            seed=o.seed,
            fault_rate=o.fault_rate,
            persistent_fault_rate=o.persistent_fault_rate,
            concurrency=2,
        )
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
        ) as bar:
            task = bar.add_task("environments built", total=o.envs)
            results = run_generate(params, on_progress=lambda _: bar.advance(task))
        good = [r for r in results if r.status == "good"]
        with open_catalog().session() as session:
            attempts = session.exec(
                select(StageAttempt).where(col(StageAttempt.env_id).in_([r.env_id for r in results]))
            ).all()
        stages = stage_summary(list(attempts))
        table = Table(title=f"{len(good)} of {len(results)} environments published as good")
        for column in ("stage", "invocations", "first-attempt success", "repair rate", "failure rate"):
            table.add_column(column)
        for row in stages:
            table.add_row(
                row["stage"],
                str(row["invocations"]),
                f"{row['first_attempt_success']:.2f}",
                f"{row['repair_rate']:.2f}",
                f"{row['failure_rate']:.2f}",
            )
        self.console.print(table)
        for failed in (r for r in results if r.status == "failed"):
            self.console.print(
                f"failed world {failed.env_id} (stage {failed.failed_stage}): its failing prompt, answer and files "
                f"are on {self.stack.dashboard_url}/failed-worlds",
                highlight=False,
            )
        repaired = sum(round(r["repair_rate"] * r["invocations"]) for r in stages)
        self.summary["generation"] = {
            "environments": len(results),
            "good": len(good),
            "failed": len(results) - len(good),
            "repaired_stage_runs": repaired,
        }

    def curate(self) -> None:
        from worldsmith.flows.curate import run_curate
        from worldsmith.models.sets import SetQuery
        from worldsmith.tasks.parameters import CurateParameters

        self._step(3, f"curate the good environments into set {self.options.set_name!r}")
        query = SetQuery(require_passed=["expectations", "probes"], validation_fraction=0.1, seed=self.options.seed)
        result = run_curate(CurateParameters(name=self.options.set_name, query=query))
        splits = result.split_counts()
        verb = "created" if result.created else "reused"
        self.console.print(
            f"{verb} set {result.name}: {len(result.members)} environments ({splits['train']} train, {splits['validation']} validation), "
            f"{result.tasks} tasks",
            highlight=False,
        )
        self.summary["set"] = {
            "name": result.name,
            "members": len(result.members),
            "train": splits["train"],
            "validation": splits["validation"],
        }

    def serve_over_mcp(self) -> None:
        from worldsmith.bundle.loader import load_bundle
        from worldsmith.localserver import BackgroundServer
        from worldsmith.runtime.episode import Runtime
        from worldsmith.serving.gateway import Gateway
        from worldsmith.storage.bundle_cache import cached_bundle
        from worldsmith.storage.catalog import open_catalog
        from worldsmith.storage.sets import get_set, members_of

        with open_catalog().session() as session:
            version, _ = members_of(session, get_set(session, self.options.set_name))[0]
            ref, key = version.ref, version.content_key
        bundle = load_bundle(cached_bundle(ref, key))
        self._step(4, f"serve {ref} over MCP and solve its tasks through the MCP client")
        with Runtime() as runtime:
            gateway = Gateway(runtime, [bundle])
            with BackgroundServer(gateway.app()) as server:
                self.console.print(f"MCP gateway: {server.url}/envs/{bundle.env_id}/mcp", highlight=False)
                verdicts = [_solve_over_mcp(server.url, gateway, bundle.env_id, task) for task in bundle.tasks]
        solved = sum(v == "complete" for v in verdicts)
        self.console.print(f"{solved}/{len(verdicts)} tasks complete through MCP", highlight=False)
        self.summary["mcp"] = {"env": ref, "tasks": len(verdicts), "complete": solved}

    def evaluate(self) -> None:
        from worldsmith.flows.evaluate import run_evaluate
        from worldsmith.tasks.parameters import EvaluateParameters

        self._step(5, "evaluate the reference and random policies on the set")
        table = Table()
        for column in ("policy", "samples", "pass@1", "pass@k", "mean turns", "env_error rate", "evaluation"):
            table.add_column(column)
        self.summary["evaluations"] = {}
        for policy, samples in (("reference", 1), ("random", self.options.random_samples)):
            with self.console.status(f"evaluating {policy} ({samples} sample(s) per task)"):
                report = run_evaluate(
                    EvaluateParameters(
                        set_name=self.options.set_name, policy=policy, samples=samples, seed=self.options.seed
                    )
                )
            overall = report.overall
            table.add_row(
                policy,
                str(samples),
                f"{overall.pass_at_1:.3f}",
                f"{overall.pass_at_k:.3f}",
                f"{overall.mean_turns:.2f}",
                f"{overall.env_error_rate:.3f}",
                str(report.run_id),
            )
            self.summary["evaluations"][policy] = {
                "run_id": report.run_id,
                "pass@1": overall.pass_at_1,
                "episodes": overall.episodes,
                "env_error_rate": overall.env_error_rate,
            }
        self.console.print(table)

    def train(self) -> None:
        from worldsmith.flows.train import train

        o = self.options
        self._step(
            6, f"GRPO of the tiny model on the CPU: {o.train_tasks} tasks, {o.train_steps} steps, group {o.group_size}"
        )
        config = o.training_config()
        self.console.print(
            f"curriculum: the {o.train_tasks} train tasks with the shortest reference solutions (one per kind), only their tools "
            "shown; the tiny model is built offline and warmed up on their reference solutions and a lazy habit "
            "(cached afterwards)",
            highlight=False,
        )
        result = cast("TrainResult", train(config, progress=True))
        log, success = result.log, result.success
        assert success is not None  # the demo's training samples its success rate (success_samples)
        self.summary["training"] = {
            "run_id": result.run_id,
            "steps": result.steps,
            "checkpoint": result.checkpoint,
            "reward_first": log[0].get("reward") if log else None,
            "reward_last": log[-1].get("reward") if log else None,
            "validation_pass@1_before": result.before.scores.pass_at_1 if result.before else None,
            "validation_pass@1_after": result.after.scores.pass_at_1 if result.after else None,
            "success_before": success.before.rate,
            "success_after": success.after.rate,
            "success_rollouts": success.after.rollouts,
            "held_out_tasks": success.held_out_tasks,
            "held_out_before": success.held_out_before.rate if success.held_out_before else None,
            "held_out_after": success.held_out_after.rate if success.held_out_after else None,
        }
        t = self.summary["training"]
        self.console.print(
            f"training run {t['run_id']}: {t['steps']} steps, reward {t['reward_first']:.3f} -> {t['reward_last']:.3f}; "
            f"success rate on its {o.train_tasks} tasks {t['success_before']:.3f} -> {t['success_after']:.3f} "
            f"({t['success_rollouts']} sampled rollouts each); {held_out_line(t)}; validation pass@1 (unseen "
            f"environments, all tools) {t['validation_pass@1_before']} -> {t['validation_pass@1_after']}",
            highlight=False,
        )

    def finish(self) -> None:
        self.console.rule("[bold]summary")
        s = self.summary
        lines = [
            f"environments: {s['generation']['good']} good, {s['generation']['failed']} failed, {s['generation']['repaired_stage_runs']} stage runs repaired",
            f"set {s['set']['name']}: {s['set']['members']} environments ({s['set']['train']} train, {s['set']['validation']} validation)",
            f"MCP: {s['mcp']['complete']}/{s['mcp']['tasks']} tasks of {s['mcp']['env']} complete",
            *(
                f"evaluation {p}: pass@1 {e['pass@1']:.3f} over {e['episodes']} episodes"
                for p, e in s["evaluations"].items()
            ),
            f"training run {s['training']['run_id']}: {s['training']['steps']} steps, success rate "
            f"{s['training']['success_before']:.3f} -> {s['training']['success_after']:.3f} on its tasks, "
            f"{held_out_line(s['training'])}, final model {s['training']['checkpoint']}",
            f"dashboard:  {s['urls']['dashboard']}",
            f"Prefect UI: {s['urls']['prefect_ui']}",
            "seconds per step: " + ", ".join(f"{name} {t:.0f}" for name, t in s["seconds"].items()),
            "stop the local stack with `worldsmith down`",
        ]
        for line in lines:
            self.console.print(line, highlight=False)
        path = Path(get_settings().home) / "demo-summary.json"
        path.write_text(json.dumps(s, indent=2, default=str))
        self.console.print(f"summary: {path}", highlight=False)


def run_demo(options: DemoOptions, console: Console) -> int:
    """Run the demonstration; returns the process exit code (0 = every step did what it should)."""
    summary = Demo(options, console).run()
    ok = (
        summary["generation"]["good"] >= 2
        and summary["mcp"]["complete"] == summary["mcp"]["tasks"]
        and summary["evaluations"]["reference"]["pass@1"] == 1.0
        and summary["training"]["steps"] == options.train_steps
    )
    return 0 if ok else 1
