"""Stage `verifiers`: one verifier per task plus reference solutions, written from the schema, the
tools, the tasks and a view of the seed rows the tasks touch. The assembled bundle must load,
every reference solution must run and be judged complete, and the untouched database must not be; the
reference's end state with its final answer worded otherwise (agent/answer_variants.py) must stay complete;
end states mutated from the reference must be judged as they are (half done, the wrong entity, an extra
insert or another task's answer rejected; commuting writes reordered accepted) and no verifier may read a
row id only this seed has (quality/verifier_mutations.py, verifier_ids.py). Before answering, the model may
look (stages/looking.py): SQL over the seed, calls of the tools, and runs of a reference solution (each call's
result and the end state's diff), each on a throwaway copy of the seed."""

from __future__ import annotations

from worldsmith.agent.adversarial import answer_variant_failures
from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.errors import BundleError
from worldsmith.bundle.loader import build_bundle
from worldsmith.bundle.sqlscript import build_world
from worldsmith.bundle.toolspec import derive_tool_schemas
from worldsmith.llm.backend import Generator, Prompt
from worldsmith.models.specs import VerifierCode
from worldsmith.quality.ahead import ChecksAhead
from worldsmith.quality.probe_results import Probe
from worldsmith.quality.probes import check_environment
from worldsmith.quality.seedview import named_by_tasks, seed_view
from worldsmith.runtime.episode import Runtime
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.history import Fault
from worldsmith.stages.looking import offer_looks, with_looks
from worldsmith.stages.order import Stage
from worldsmith.stages.repair import CheckFailed, run_with_repair
from worldsmith.stages.routing import owning_step
from worldsmith.stages.tools import tools_only_bundle
from worldsmith.stages.work import EnvWork

#: The repair kind of a failed check, by the first of these probes that failed (else "reference_rejected"):
#: a mutated end state judged wrongly (quality/verifier_mutations.py) is repaired with that end state.
REPAIR_KINDS = (
    (Probe.UNTOUCHED_REJECTED, "verifier_accepts_untouched"),
    (Probe.REFERENCE_ACCEPTED, "reference_rejected"),
    (Probe.WRONG_END_STATE_REJECTED, "verifier_too_lenient"),
    (Probe.EQUIVALENT_END_STATE_ACCEPTED, "verifier_false_negative"),
    (Probe.NO_SEED_IDS, "verifier_reads_seed_ids"),
)


def assemble(work: EnvWork, generator: Generator) -> Bundle:
    """The bundle of `work` (all stages done); raises CheckFailed listing every defect."""
    try:
        return build_bundle(work.sources(), work.manifest(generator))
    except BundleError as exc:
        raise CheckFailed("bundle", str(exc)) from None


def seeded_world(work: EnvWork) -> bytes:
    """The seeded database of `work` (the database stage built it)."""
    world, faults = build_world(work.schema_sql or "", work.seed_sql or "")
    assert world is not None, f"the database stage built this seed: {faults[:1]}"
    return world


def seed_rows(work: EnvWork, world: bytes | None = None) -> str:
    """The bounded view of the seeded database the verifiers prompt shows: the rows the tasks name and
    their neighbours, a few rows of every table, the rows of the tables the tasks filter on (by their
    words and the tools' queries), each table's next id (seedview.seed_view)."""
    named = named_by_tasks(work.tasks) if work.tasks else []
    return seed_view(world or seeded_world(work), named, texts=work.task_texts(), tools_py=work.tools_py or "")


def bundle_before_verifiers(work: EnvWork, generator: Generator, world: bytes | None = None) -> Bundle:
    """The world before the verifiers exist: the tools, seeded database, clock and manifest of the bundle
    `assemble` makes once they do, no tasks (the same tool_calls.tool_behaviour_key)."""
    assert work.tools_py is not None, "the tools stage ran"
    tools, issues = derive_tool_schemas(work.tools_py)
    assert not issues, f"the tools stage checked this code: {issues[:1]}"
    return tools_only_bundle(work, work.tools_py, tools, world=world or seeded_world(work), generator=generator)


def run_verifiers_stage(
    work: EnvWork,
    generator: Generator,
    runtime: Runtime,
    log: AttemptLog,
    max_attempts: int,
    feedback: str | None = None,
) -> EnvWork:
    world = seeded_world(work)
    rows = seed_rows(work, world)
    # while the model answers: the seed-data expectations (validation's) and the deep probes' tool calls
    # that need no reference solution; the checks below reuse what they computed (quality/ahead.py)
    before = bundle_before_verifiers(work, generator, world)
    ahead = ChecksAhead(runtime, before)

    def prompt(extra: str | None) -> Prompt:
        asked = work.prompt(
            "verifiers",
            extra,
            schema=work.schema_sql,
            seed_rows=rows,
            tools=work.tool_lines(),
            tasks=work.task_lines(),
        )
        return with_looks(asked, offer_looks(world, runtime, before, solutions=True))

    def check(code: VerifierCode) -> VerifierCode:
        ahead.stop()
        candidate = work.model_copy(update={"verifiers": code})
        bundle = assemble(candidate, generator)
        probed = check_environment(runtime, bundle, reuse=True)  # tool calls made ahead are reused
        failures = [  # the tool code's failures are validation's to send back to the tools stage
            r for r in probed if not r.passed and owning_step(r)[0] == Stage.VERIFIERS
        ]
        if failures:
            failed = {r.probe for r in failures}
            kind = next((kind for probe, kind in REPAIR_KINDS if probe in failed), "reference_rejected")
            raise CheckFailed(
                kind,
                "\n".join(f"{r.probe} failed for task {r.target}: {r.detail}" for r in failures),
                [Fault(kind=str(r.failure), subject=r.target) for r in failures],
                "\n".join(f"task {r.target}: {r.cause}" for r in failures if r.cause),
                records=[r.record() for r in failures],
            )
        rejected = [] if any(not r.passed for r in probed) else answer_variant_failures(runtime, bundle)
        if rejected:  # only once every reference is accepted: a variant then fails on its wording alone
            raise CheckFailed(
                "verifier_false_negative",
                "these correct final answers (the reference solution's end state, its answer worded otherwise) were "
                "not judged complete; judge the answer by its content, not its wording or format:\n"
                + "\n".join(
                    f"task {p.task_id}, {p.variant} answer {p.answer!r}: {p.verdict} {str(p.evidence)[:300]}"
                    for p in rejected[:8]
                ),
                [Fault(kind="verifier_false_negative", subject=p.task_id) for p in rejected],
            )
        return code

    history = work.history_of(Stage.VERIFIERS.value)
    with ahead:
        code = run_with_repair(
            stage=Stage.VERIFIERS.value,
            env_id=work.env_id,
            generator=generator,
            prompt=prompt,
            spec=VerifierCode,
            check=check,
            log=log,
            max_attempts=max_attempts,
            first_feedback=feedback,
            history=history,
        )
    return work.model_copy(update={"verifiers": code, "history": work.remembering({Stage.VERIFIERS.value: history})})
