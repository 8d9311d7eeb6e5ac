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
- verifier_too_strict: the finding's answer and the answer variants on the reference's end state, or
  with the finding's `build`, its answer on the correct end state those calls make (finding_states.py);
  confirmed when one is not complete;
- verifier_too_lenient: by construction: the wrong end state the finding describes, made by its `build`
  calls through the runtime, judged by the task's verifier (with the finding's answer, else the task's);
  confirmed when judged complete; not confirmed when a call fails, when the state is the reference
  solution's own, or when the verifier rejects it.

Every finding has an id (`review-N`) and an outcome (`FindingOutcome`): a confirmed one goes back to its
stage with the evidence (the state built, the verdict); later rounds probe it again on the repaired world
(`repaired` once its probe no longer shows it), and a verifiers stage that disputes it with a reason
(`VerifierCode.disputed`) has it rejected as `disputed`. Each round's outcomes are recorded as a stage
attempt of `review:findings` (with a log) and in the review's quality check.

Off by default (GenerateParameters.review) and for the procedural backend, which has nothing to find.
Its model calls are recorded as stage attempts of stage `review` (their tokens and cost).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from worldsmith.agent.adversarial import Probe, judge_answer_variants, run_probes
from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject
from worldsmith.llm.backend import Generator, Prompt
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.quality import QualityCheck
from worldsmith.models.specs import Review, ReviewFinding
from worldsmith.quality.probes import REPLAY_CLOCK_SKEW_S
from worldsmith.runtime.episode import Runtime
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.finding_states import build_state
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
_EVIDENCE = 2400  # the evidence of a finding checked by construction: the verdict, the calls, the changes


class FindingOutcome(StrEnum):
    """What became of a review finding in one round."""

    CONFIRMED = "confirmed"  # its probe showed the defect: sent back to its stage as a repair
    UNPROBED = "unprobed"  # no probe can check it: sent back once, on the model's word
    NOT_CONFIRMED = "not_confirmed"  # its probe did not show it: rejected
    REPAIRED = "repaired"  # confirmed in an earlier round; its probe no longer shows it
    DISPUTED = "disputed"  # confirmed, and the stage it went back to disagreed with a reason: rejected


#: The outcomes that send a finding back to its stage.
SENT_BACK = frozenset({FindingOutcome.CONFIRMED, FindingOutcome.UNPROBED})


@dataclass
class CheckedFinding:
    """A finding and its probe's outcome: `confirmed` (a defect to repair) or not, and why (`detail`: the
    evidence). `probed` False: no probe could check it (it is repaired once, on the model's word).
    `resolved` is set for a later round's verdict on an earlier confirmed finding (repaired, disputed)."""

    finding: ReviewFinding
    confirmed: bool
    detail: str
    probed: bool = True
    finding_id: str = ""
    resolved: FindingOutcome | None = None

    @property
    def outcome(self) -> FindingOutcome:
        if self.resolved is not None:
            return self.resolved
        if not self.confirmed:
            return FindingOutcome.NOT_CONFIRMED
        return FindingOutcome.CONFIRMED if self.probed else FindingOutcome.UNPROBED

    def record(self) -> JsonObject:
        f = self.finding
        return {
            "finding": self.finding_id,
            "probe": f"review {f.category}",
            "target": f.target,
            "problem": f.problem,
            "confirmed": self.confirmed,
            "probed": self.probed,
            "outcome": self.outcome.value,
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
        elif f.category == "verifier_too_lenient" and not f.build:
            problems.append(
                f"finding {index} (verifier_too_lenient): give `build`, the tool calls that make the wrong end "
                "state it would accept"
            )
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
        return _lenient_by_construction(runtime, bundle, task, finding)
    if category == "verifier_too_strict" and finding.build:
        built = build_state(runtime, bundle, task, finding.build, finding.answer or "")
        refused = built.failed is None and built.verdict != "complete"
        return CheckedFinding(finding, refused, f"a correct end state {built.describe()}"[:_EVIDENCE])
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


def _lenient_by_construction(
    runtime: Runtime, bundle: Bundle, task: TaskSpec, finding: ReviewFinding
) -> CheckedFinding:
    """A too-lenient finding checked by building the wrong end state it describes (module docstring)."""
    assert finding.build is not None  # check_review
    built = build_state(runtime, bundle, task, finding.build, finding.answer or task.answer or "")
    if built.failed is None and built.verdict == "complete":
        reference = build_state(runtime, bundle, task, task.solution, task.answer or "")
        if reference.failed is None and reference.changes == built.changes:
            detail = f"not a wrong state: the reference solution's own end state ({built.calls})"
            return CheckedFinding(finding, False, detail)
    accepted = built.failed is None and built.verdict == "complete"
    return CheckedFinding(finding, accepted, f"a wrong end state {built.describe()}"[:_EVIDENCE])


def review_check(checked: list[CheckedFinding]) -> QualityCheck:
    """The review's quality check: passed when no finding goes back to its stage (confirmed and not
    repaired or disputed, or unprobed)."""
    sent_back = [c for c in checked if c.outcome in SENT_BACK]
    return QualityCheck(
        kind="review",
        passed=not sent_back,
        summary={
            "findings": len(checked),
            "confirmed": len(sent_back),
            "outcomes": dict(Counter(c.outcome.value for c in checked)),
            "categories": dict(Counter(c.finding.category for c in checked)),
        },
        details=[c.record() for c in checked],
    )


def repair_route(checked: list[CheckedFinding]) -> tuple[Stage, str | None, str] | None:
    """Where the findings sent back go (`SENT_BACK`): the earliest stage's (stage, step, error), the error
    naming each finding by id with its evidence, or None."""
    sent_back = [c for c in checked if c.outcome in SENT_BACK]
    if not sent_back:
        return None
    owner = min((OWNER[c.finding.category] for c in sent_back), key=lambda o: ENVIRONMENT_STAGES.index(o[0]))
    owned = [c for c in sent_back if OWNER[c.finding.category] == owner]
    error = "\n".join(
        f"review {c.finding_id}: {c.finding.category} {c.finding.target}: {c.finding.problem}\n  evidence: {c.detail}"
        for c in owned
    )
    if owner[0] == Stage.VERIFIERS:
        error += (
            "\nRepair each finding; if you are sure one is not a defect, leave it and list it in `disputed` "
            "with its id and your reason."
        )
    return owner[0], owner[1], error


def resolve(checked: CheckedFinding, before: FindingOutcome | None, work: EnvWork) -> CheckedFinding:
    """`checked` (a later round's probe of a finding) with what became of it since the round it was first
    confirmed in (`before`): `repaired` when its probe no longer shows it, `disputed` when the verifiers
    stage it went back to disagreed (`VerifierCode.disputed`), with the stage's reason."""
    if before not in SENT_BACK:
        return checked
    if not checked.confirmed:
        return dataclasses.replace(checked, resolved=FindingOutcome.REPAIRED)
    disputes = {d.finding: d.reason for d in work.verifiers.disputed} if work.verifiers else {}
    if OWNER[checked.finding.category][0] == Stage.VERIFIERS and checked.finding_id in disputes:
        detail = f"the verifiers stage disagreed: {disputes[checked.finding_id]} (evidence: {checked.detail})"
        return dataclasses.replace(checked, resolved=FindingOutcome.DISPUTED, detail=detail)
    return checked


def _record_outcomes(log: AttemptLog | None, work: EnvWork, round_number: int, checked: list[CheckedFinding]) -> None:
    """One `review:findings` attempt for this round: each finding's id, category, target, outcome and why."""
    if log is None or not checked:
        return
    sent_back = any(c.outcome in SENT_BACK for c in checked)
    outcomes = [
        {
            "finding": c.finding_id,
            "category": c.finding.category,
            "target": c.finding.target,
            "outcome": c.outcome.value,
            "why": c.detail,
        }
        for c in checked
    ]
    log.record(
        env_id=work.env_id,
        stage=Stage.REVIEW.step("findings"),
        attempt=round_number,
        outcome="failure" if sent_back else "success",
        error_class="findings_sent_back" if sent_back else None,
        error_text=json.dumps(outcomes),
    )


def with_review(
    validate: Validator, review: Callable[[EnvWork], Review], runtime: Runtime, log: AttemptLog | None = None
) -> Validator:
    """`validate`, then, once a round passes, the model's `review` of the world (asked once per world): each
    finding probed on the round's bundle, the review's quality check added to the round's checks, and
    the confirmed findings sent back to their owning step as a failed validation would be. Later rounds
    probe the same findings again on the repaired world, without asking the model again; a finding no
    probe can check goes back once. A review the model never gets right (StageFailed) finds nothing: the
    check says so (`unanswered`), the world is not failed for it. With `log`, each round's outcomes are
    recorded (`review:findings`)."""
    asked: list[Review] = []
    unanswered: list[str] = []
    first_outcomes: dict[str, FindingOutcome] = {}

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
        checked = [
            dataclasses.replace(probe_finding(runtime, validation.bundle, f), finding_id=f"review-{n}")
            for n, f in enumerate(asked[0].findings, start=1)
        ]
        checked = [c for c in checked if c.probed or first]
        if first:
            first_outcomes.update({c.finding_id: c.outcome for c in checked})
        else:
            checked = [resolve(c, first_outcomes.get(c.finding_id), work) for c in checked]
        _record_outcomes(log, work, round_number, checked)
        check = review_check(checked)
        check.summary.update({"unanswered": unanswered[0]} if unanswered else {})
        checks = [*validation.checks, check]
        route = repair_route(checked)
        if route is None:
            return Validation(validation.bundle, checks)
        stage, step, error = route
        return Validation(validation.bundle, checks, stage, error, step)

    return reviewed
