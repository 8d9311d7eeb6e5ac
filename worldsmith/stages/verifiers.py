"""Stage `verifiers`: one verifier per task plus reference solutions. The assembled bundle must
load, every reference solution must run and be judged complete, and the untouched database must
not be."""

from __future__ import annotations

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.errors import BundleError
from worldsmith.bundle.loader import build_bundle
from worldsmith.llm.backend import Generator, Prompt
from worldsmith.llm.prompts import prompt_version
from worldsmith.models.bundle import GeneratorInfo, Manifest
from worldsmith.models.specs import VerifierCode
from worldsmith.quality.probes import check_environment
from worldsmith.runtime.episode import Runtime
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.order import Stage
from worldsmith.stages.repair import CheckFailed, run_with_repair
from worldsmith.stages.work import EnvWork


def assemble(work: EnvWork, generator: Generator) -> Bundle:
    """The bundle of `work` (all stages done); raises CheckFailed listing every defect."""
    manifest = Manifest(
        env_id=work.env_id,
        scenario=work.scenario,
        clock=work.now,
        generator=GeneratorInfo(
            backend=generator.backend, model=generator.model, prompt_version=prompt_version(), seed=work.seed
        ),
    )
    try:
        return build_bundle(work.sources(), manifest)
    except BundleError as exc:
        raise CheckFailed("bundle", str(exc)) from None


def run_verifiers_stage(
    work: EnvWork,
    generator: Generator,
    runtime: Runtime,
    log: AttemptLog,
    max_attempts: int,
    feedback: str | None = None,
) -> EnvWork:
    def prompt(extra: str | None) -> Prompt:
        return work.prompt("verifiers", extra, schema=work.schema_sql, tools=work.tool_lines(), tasks=work.task_lines())

    def check(code: VerifierCode) -> VerifierCode:
        candidate = work.model_copy(update={"verifiers": code})
        bundle = assemble(candidate, generator)
        failures = [
            r for r in check_environment(runtime, bundle, reuse=True) if not r.passed and r.probe != "tool runs"
        ]
        if failures:
            kind = (
                "verifier_accepts_untouched"
                if any(r.probe == "untouched rejected" for r in failures)
                else "reference_rejected"
            )
            raise CheckFailed(kind, "\n".join(f"{r.probe} failed for task {r.target}: {r.detail}" for r in failures))
        return code

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
    )
    return work.model_copy(update={"verifiers": code})
