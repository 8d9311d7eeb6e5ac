"""Stage `review` (optional, model-backed): once a world passes validation, the model reads its schema,
seed, tools, tasks and verifiers and lists the bugs it suspects in the audit categories of generated
worlds (models/specs.REVIEW_CATEGORIES). A model's suspicion is not a defect: each finding becomes a
probe, run on the world, and only a confirmed one becomes a repair, fed back to the step that owns it
(`OWNER`) the way validation sends its failures back (pipeline.run_stages). A finding no probe can
check (a task without a reference solution) goes back as a repair once.

- tool_crash: the finding's call, in a free episode; confirmed when it ends in env_error;
- clock_or_randomness: the finding's call in two episodes, the second under a shifted clock (and, as
  every episode, other random seeds); confirmed when result or database differ;
- missing_tool, schema_task_mismatch, task_unsolvable: the task's reference solution, run and judged;
  confirmed when it is not complete;
- verifier_too_strict: the finding's answer and the answer variants on the reference's end state;
  confirmed when one is not complete;
- verifier_too_lenient: the adversarial trajectories of the task; confirmed when one is complete.

Off by default (GenerateParameters.review) and for the procedural backend, which has nothing to find.
Its model calls are recorded as stage attempts of stage `review` (their tokens and cost).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from worldsmith.agent.adversarial import Probe, judge_answer_variants, run_probes
from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject
from worldsmith.llm.backend import Generator, Prompt
from worldsmith.models.quality import QualityCheck
from worldsmith.models.specs import Review, ReviewFinding
from worldsmith.quality.probes import REPLAY_CLOCK_SKEW_S
from worldsmith.runtime.episode import Runtime
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.order import ENVIRONMENT_STAGES, Stage
from worldsmith.stages.repair import CheckFailed, StageFailed, run_with_repair
from worldsmith.stages.validate import Validation, Validator
from worldsmith.stages.verifiers import seed_rows
from worldsmith.stages.work import EnvWork

#: The step that repairs a confirmed finding of each category (order.STEPS; None: the stage's first).
OWNER: dict[str, tuple[Stage, str | None]] = {
    "tool_crash": (Stage.TOOLS, "code"),
    "clock_or_randomness": (Stage.TOOLS, "code"),
    "missing_tool": (Stage.TOOLS, "spec"),
    "schema_task_mismatch": (Stage.DATABASE, "schema"),
    "task_unsolvable": (Stage.DATABASE, "seed"),
    "verifier_too_strict": (Stage.VERIFIERS, None),
    "verifier_too_lenient": (Stage.VERIFIERS, None),
}
TOOL_CATEGORIES = frozenset({"tool_crash", "clock_or_randomness"})
_SHOWN = 300


@dataclass
class CheckedFinding:
    """A finding and its probe's outcome: `confirmed` (a defect to repair) or not, and why. `probed` False:
    no probe could check it (it is repaired once, on the model's word)."""

    finding: ReviewFinding
    confirmed: bool
    detail: str
    probed: bool = True

    def record(self) -> JsonObject:
        f = self.finding
        return {
            "probe": f"review {f.category}",
            "target": f.target,
            "problem": f.problem,
            "confirmed": self.confirmed,
            "probed": self.probed,
            "detail": self.detail,
        }


def review_enabled(wanted: bool, generator: Generator) -> bool:
    """Whether a run reviews its worlds: asked for, and a model behind the generator (not procedural)."""
    return wanted and generator.backend != "procedural"


def _task_lines(work: EnvWork) -> str:
    solutions = {s.task_id: s for s in work.verifiers.solutions} if work.verifiers else {}
    lines = []
    for task in work.tasks.tasks if work.tasks else []:
        solution = solutions.get(task.id)
        steps = json.dumps([s.model_dump() for s in solution.solution]) if solution else "none"
        answer = f"; expected answer: {solution.answer!r}" if solution and solution.answer else ""
        lines.append(f"- {task.id}: {task.instruction}\n  reference solution: {steps}{answer}")
    return "\n".join(lines)


def check_review(work: EnvWork, review: Review) -> Review:
    """`review` when every finding names a tool or task of `work` and carries what its probe needs;
    CheckFailed (for the model to repair) otherwise."""
    tools = {t.name for t in work.tool_plan.tools} if work.tool_plan else set()
    tasks = {t.id for t in work.tasks.tasks} if work.tasks else set()
    problems = []
    for index, f in enumerate(review.findings):
        known = tools if f.category in TOOL_CATEGORIES else tasks
        if f.target not in known:
            kind = "tool" if f.category in TOOL_CATEGORIES else "task id"
            problems.append(f"finding {index} ({f.category}): {f.target!r} is no {kind} of this environment")
        elif f.category in TOOL_CATEGORIES and (f.call is None or f.call.tool != f.target):
            problems.append(f"finding {index} ({f.category}): give `call`, a call of {f.target} that shows it")
        elif f.category == "verifier_too_strict" and not f.answer:
            problems.append(f"finding {index} (verifier_too_strict): give `answer`, the correct answer it rejects")
    if problems:
        raise CheckFailed("finding_unchecked", "\n".join(problems))
    return review


def run_review_stage(
    work: EnvWork, generator: Generator, log: AttemptLog, max_attempts: int, feedback: str | None = None
) -> Review:
    """The model's review of `work` (every stage done), each finding naming a known target."""
    rows = seed_rows(work)
    assert work.verifiers is not None and work.tools_py is not None
    tools_py, verifiers_py = work.tools_py, work.verifiers.verifiers_py

    def prompt(extra: str | None) -> Prompt:
        return work.prompt(
            "review",
            extra,
            schema=work.schema_sql,
            seed_rows=rows,
            tools=work.tool_lines(),
            tools_py=tools_py,
            tasks=_task_lines(work),
            verifiers_py=verifiers_py,
        )

    return run_with_repair(
        stage=Stage.REVIEW.value,
        env_id=work.env_id,
        generator=generator,
        prompt=prompt,
        spec=Review,
        check=lambda review: check_review(work, review),
        log=log,
        max_attempts=max_attempts,
        first_feedback=feedback,
    )


def _outcome(runtime: Runtime, bundle: Bundle, finding: ReviewFinding, clock_skew_s: float) -> tuple[str, str]:
    """The finding's call in a fresh free episode: (what came back, the database change), as text."""
    assert finding.call is not None
    with runtime.open_episode(bundle, clock_skew_s=clock_skew_s) as episode:
        result = episode.call_tool(finding.call.tool, finding.call.arguments)
        changes = episode.diff(bundle.world).model_dump_json()
    shown = result.error if result.status != "ok" else json.dumps(result.value, default=str, sort_keys=True)
    return f"{result.status}: {shown}", changes


def probe_finding(runtime: Runtime, bundle: Bundle, finding: ReviewFinding) -> CheckedFinding:
    """Run the probe of `finding` on `bundle` (see the module docstring)."""
    category = finding.category
    if category in TOOL_CATEGORIES:
        assert finding.call is not None
        shown = f"{finding.call.tool}({json.dumps(finding.call.arguments, default=str)})"
        first, first_changes = _outcome(runtime, bundle, finding, 0.0)
        if category == "tool_crash":
            return CheckedFinding(finding, first.startswith("env_error"), f"{shown} gave {first[:_SHOWN]}")
        second, second_changes = _outcome(runtime, bundle, finding, REPLAY_CLOCK_SKEW_S)
        same = first == second and first_changes == second_changes
        detail = "same result and database" if same else f"{shown} gave {first[:_SHOWN]}, then {second[:_SHOWN]}"
        return CheckedFinding(
            finding, not same, f"{detail} (replayed under a clock shifted by {REPLAY_CLOCK_SKEW_S} s)"
        )
    task = bundle.task(finding.target)
    if not task.solution:
        return CheckedFinding(finding, True, "no reference solution to check it against", probed=False)
    one_task = dataclasses.replace(bundle, tasks=(task,))
    if category == "verifier_too_lenient":
        accepted = [p.name for p in run_probes(runtime, one_task) if p.false_positive]
        detail = f"judged complete: {', '.join(accepted)}" if accepted else "every adversarial trajectory rejected"
        return CheckedFinding(finding, bool(accepted), detail)
    if category == "verifier_too_strict":
        theirs = Probe(bundle.env_id, task.id, "answer_variant", "complete", variant="review", answer=finding.answer)
        probes = [p for p in run_probes(runtime, one_task) if p.kind in ("reference", "answer_variant")]
        probes += judge_answer_variants(runtime, bundle, task, [theirs])
        rejected = [f"{p.name} {p.answer!r}: {p.verdict}" for p in probes if p.false_negative]
        detail = f"not judged complete: {'; '.join(rejected)}" if rejected else "every correct answer judged complete"
        return CheckedFinding(finding, bool(rejected), detail[: _SHOWN * 3])
    reference = next(p for p in run_probes(runtime, one_task) if p.kind == "reference")
    solved = reference.verdict == "complete"
    detail = "the reference solution completes it" if solved else f"the reference solution is {reference.verdict}"
    return CheckedFinding(finding, not solved, f"{detail}: {str(reference.evidence)[:_SHOWN]}")


def review_check(checked: list[CheckedFinding]) -> QualityCheck:
    """The review's quality check: passed when no finding was confirmed."""
    confirmed = [c for c in checked if c.confirmed]
    return QualityCheck(
        kind="review",
        passed=not confirmed,
        summary={
            "findings": len(checked),
            "confirmed": len(confirmed),
            "categories": dict(Counter(c.finding.category for c in checked)),
        },
        details=[c.record() for c in checked],
    )


def repair_route(checked: list[CheckedFinding]) -> tuple[Stage, str | None, str] | None:
    """Where the confirmed findings go back to: the earliest stage's (stage, step, error), or None."""
    confirmed = [c for c in checked if c.confirmed]
    if not confirmed:
        return None
    owner = min((OWNER[c.finding.category] for c in confirmed), key=lambda o: ENVIRONMENT_STAGES.index(o[0]))
    owned = [c for c in confirmed if OWNER[c.finding.category] == owner]
    error = "; ".join(
        f"review: {c.finding.category} {c.finding.target}: {c.finding.problem} (checked: {c.detail})" for c in owned
    )
    return owner[0], owner[1], error


def with_review(validate: Validator, review: Callable[[EnvWork], Review], runtime: Runtime) -> Validator:
    """`validate`, then, once a round passes, the model's `review` of the world (asked once per world): each
    finding probed on the round's bundle, the review's quality check added to the round's checks, and
    the confirmed findings sent back to their owning step as a failed validation would be. Later rounds
    probe the same findings again on the repaired world, without asking the model again; a finding no
    probe can check goes back once. A review the model never gets right (StageFailed) finds nothing: the
    check says so (`unanswered`), the world is not failed for it."""
    asked: list[Review] = []
    unanswered: list[str] = []

    def reviewed(work: EnvWork, round_number: int) -> Validation:
        validation = validate(work, round_number)
        if validation.back_to is not None or validation.bundle is None:
            return validation
        first = not asked
        if first:
            try:
                asked.append(review(work))
            except StageFailed as failed:  # advisory: a model that gives no usable review fails no world
                asked.append(Review())
                unanswered.append(str(failed))
        checked = [probe_finding(runtime, validation.bundle, f) for f in asked[0].findings]
        checked = [c for c in checked if c.probed or first]
        check = review_check(checked)
        check.summary.update({"unanswered": unanswered[0]} if unanswered else {})
        checks = [*validation.checks, check]
        route = repair_route(checked)
        if route is None:
            return Validation(validation.bundle, checks)
        stage, step, error = route
        return Validation(validation.bundle, checks, stage, error, step)

    return reviewed
