"""Adversarial trajectories that probe a task's verdict path (verifier plus side-effect guard).

For each task with a reference solution, five scripted agents that must not be judged complete:
`nothing` (answers without acting), `claim` (claims success without acting), `wrong_entity` (the
solution played on another row of the same column), `side_effect` (the solution plus one change
outside the task's footprint), and `half` (the first half of the solution's state changes; it must
be judged partial when the solution has two or more). The reference itself must be judged
complete; anything else is a false negative. So must every `answer_variant`: the reference's end state
with its final answer worded otherwise (answer_variants.py), all judged against one episode of the
reference solution (`judge_answer_variants`).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import TypedDict

from worldsmith.agent.answer_variants import answer_variants
from worldsmith.agent.footprint import reference_run
from worldsmith.agent.loop import EpisodeConfig, run_episode
from worldsmith.agent.policies import ReferencePolicy, ScriptPolicy
from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.verdict import Verdict
from worldsmith.quality.probes import SeedValues, sample_arguments
from worldsmith.runtime.episode import Runtime

CLAIM = "I have completed your request: everything you asked for is done and confirmed."
DESTRUCTIVE_WORDS = ("delete", "remove", "cancel", "close", "refund", "update", "set", "hide", "archive", "reject")


@dataclass
class Probe:
    """One adversarial (or reference) trajectory and what its verdict should be."""

    env_id: str
    task_id: str
    kind: str
    expect: str  # "complete", "partial" or "not_complete"
    verdict: Verdict | None = None  # None until judged
    evidence: JsonObject | None = None
    variant: str = ""  # an answer_variant's name (answer_variants.py)
    answer: str | None = None  # an answer_variant's final answer

    @property
    def name(self) -> str:
        """env/task/kind, with the variant's name: how reports list the probe."""
        return f"{self.env_id}/{self.task_id}/{self.kind}" + (f"[{self.variant}]" if self.variant else "")

    @property
    def false_positive(self) -> bool:
        return self.expect != "complete" and self.verdict == Verdict.complete

    @property
    def false_negative(self) -> bool:
        return (
            self.expect == "complete"
            and self.verdict != Verdict.complete
            or self.expect == "partial"
            and self.verdict != Verdict.partial
        )


def _calls(task: TaskSpec) -> list[tuple[str, JsonObject]]:
    return [(step.tool, step.arguments) for step in task.solution]


def wrong_entity(bundle: Bundle, task: TaskSpec, changed: tuple[bool, ...]) -> list[tuple[str, JsonObject]] | None:
    """The solution with the first entity value of a state-changing step (of the last step when
    none changes state) replaced by another seed row's value of that column, everywhere it
    appears; None when no argument is such a value."""
    seeds = SeedValues(bundle.world)
    calls = _calls(task)
    targets = [i for i, did_change in enumerate(changed) if did_change] or [len(calls) - 1]
    for index in targets:
        for name, value in calls[index][1].items():
            others = [v for v in seeds.columns.get(name, []) if v != value and type(v) is type(value)]
            if value in seeds.columns.get(name, []) and others:
                return [
                    (t, {k: (others[0] if k == name and v == value else v) for k, v in a.items()}) for t, a in calls
                ]
    return None


def side_effect(
    runtime: Runtime, bundle: Bundle, task: TaskSpec, tries: int = 60
) -> list[tuple[str, JsonObject]] | None:
    """The solution plus one successful call whose change falls outside the task's footprint
    (found by trying destructive-looking tools with seed-data arguments); None when none is found."""
    footprint = reference_run(runtime, bundle, task).footprint
    rng = random.Random(f"{bundle.key}:{task.id}")
    seeds = SeedValues(bundle.world, rng=rng)
    tools = sorted((t.model_dump() for t in bundle.tools), key=lambda t: not t["name"].startswith(DESTRUCTIVE_WORDS))
    with runtime.open_episode(bundle, task) as episode:
        for name, arguments in _calls(task):
            episode.call_tool(name, arguments)
        solved = episode.snapshot()
        for attempt in range(tries):
            tool = tools[attempt] if attempt < len(tools) else rng.choice(tools)
            arguments = sample_arguments(tool, seeds)
            result = episode.call_tool(tool["name"], arguments)
            if result.ok and result.changed and footprint.overreach(episode.diff(bundle.world)):
                return _calls(task) + [(tool["name"], arguments)]
            if result.changed:
                episode.restore(solved)
    return None


def probes_for(runtime: Runtime, bundle: Bundle, task: TaskSpec) -> list[tuple[Probe, ScriptPolicy]]:
    """The reference and the adversaries of `task` that apply to it, each with its policy."""
    reference = reference_run(runtime, bundle, task)
    mutations = [i for i, changed in enumerate(reference.changed) if changed]

    def make(kind: str, expect: str) -> Probe:
        return Probe(bundle.env_id, task.id, kind, expect)

    probes: list[tuple[Probe, ScriptPolicy]] = [
        (make("reference", "complete"), ReferencePolicy()),
        (make("nothing", "not_complete"), ScriptPolicy("nothing", [], "Done.")),
        (make("claim", "not_complete"), ScriptPolicy("claim", [], CLAIM)),
    ]
    wrong = wrong_entity(bundle, task, reference.changed)
    if wrong is not None:
        probes.append((make("wrong_entity", "not_complete"), ScriptPolicy("wrong_entity", wrong, None)))
    extra = side_effect(runtime, bundle, task)
    if extra is not None:
        probes.append((make("side_effect", "not_complete"), ScriptPolicy("side_effect", extra, task.answer or "Done.")))
    if len(mutations) >= 2:
        cut = mutations[len(mutations) // 2]  # keep the lookups and the first half of the state changes
        probes.append((make("half", "partial"), ScriptPolicy("half", _calls(task)[:cut], "Done.")))
    for probe in variant_probes(bundle, task):
        probes.append((probe, ScriptPolicy(f"answer_variant:{probe.variant}", _calls(task), probe.answer)))
    return probes


def variant_probes(bundle: Bundle, task: TaskSpec) -> list[Probe]:
    """The `answer_variant` probes of `task` (not judged yet): its expected answer worded otherwise."""
    return [
        Probe(bundle.env_id, task.id, "answer_variant", "complete", variant=name, answer=text)
        for name, text in answer_variants(task.answer)
    ]


def judge_answer_variants(runtime: Runtime, bundle: Bundle, task: TaskSpec, probes: list[Probe]) -> list[Probe]:
    """`probes` (answer variants of `task`) judged against one episode: the reference solution played once,
    then each variant's answer verified on that end state. The verifier's verdict is the verdict: the end
    state is the reference's own, so the side-effect guard has nothing to add."""
    with runtime.open_episode(bundle, task) as episode:
        for tool, arguments in _calls(task):
            episode.call_tool(tool, arguments)
        for probe in probes:
            judged = episode.verify(probe.answer or "")
            probe.verdict = Verdict(judged.status)
            probe.evidence = {**judged.evidence, **({"error": judged.error} if judged.error else {})}
    return probes


def answer_variant_failures(runtime: Runtime, bundle: Bundle) -> list[Probe]:
    """The answer variants of `bundle`'s tasks with a reference solution that their verifier does not judge
    complete (one episode per task): the verifier's false negatives."""
    failed = []
    for task in bundle.tasks:
        if task.solution:
            failed += [
                p
                for p in judge_answer_variants(runtime, bundle, task, variant_probes(bundle, task))
                if p.false_negative
            ]
    return failed


def run_probes(runtime: Runtime, bundle: Bundle, *, guard: bool = True) -> list[Probe]:
    """Every probe of every task of `bundle` that has a reference solution, judged (`guard`: with
    the side-effect guard, as episodes are judged by default)."""
    config = EpisodeConfig(side_effects=guard)
    done = []
    for task in bundle.tasks:
        if not task.solution and not task.answer:
            continue
        probes = probes_for(runtime, bundle, task)
        for probe, policy in probes:
            if probe.kind != "answer_variant":
                trajectory = run_episode(runtime, bundle, task, policy, config)
                probe.verdict, probe.evidence = trajectory.verdict, trajectory.evidence
                done.append(probe)
        done += judge_answer_variants(runtime, bundle, task, [p for p, _ in probes if p.kind == "answer_variant"])
    return done


def _share(hits: list[bool]) -> float:
    return sum(hits) / len(hits) if hits else 0.0


class KindCount(TypedDict):
    """How many probes of one kind ran, and their verdicts (None: not judged)."""

    n: int
    verdicts: dict[Verdict | None, int]


class ProbeRates(TypedDict):
    """What `rates` reports of a set of judged probes."""

    probes: int
    false_positive_rate: float
    false_negative_rate: float
    answer_variant_false_negative_rate: float
    by_kind: dict[str, KindCount]
    false_positives: list[str]
    false_negatives: list[str]


def rates(probes: list[Probe]) -> ProbeRates:
    """False-positive rate (adversaries judged complete), false-negative rate (reference or an answer
    variant not complete, or half not partial) and the answer variants' own false-negative rate,
    overall and per kind."""
    adversarial = [p for p in probes if p.expect != "complete"]
    expected_right = [p for p in probes if p.expect in ("complete", "partial")]
    kinds = sorted({p.kind for p in probes})
    return {
        "probes": len(probes),
        "false_positive_rate": _share([p.false_positive for p in adversarial]),
        "false_negative_rate": _share([p.false_negative for p in expected_right]),
        "answer_variant_false_negative_rate": _share([p.false_negative for p in probes if p.kind == "answer_variant"]),
        "by_kind": {
            k: {
                "n": sum(p.kind == k for p in probes),
                "verdicts": dict(Counter(p.verdict for p in probes if p.kind == k)),
            }
            for k in kinds
        },
        "false_positives": [p.name for p in adversarial if p.false_positive],
        "false_negatives": [f"{p.name}: {p.verdict}" for p in expected_right if p.false_negative],
    }
