"""The execute-and-repair loop every stage runs: ask the generator, execute what it wrote, and on
a semantic fault ask again with every earlier attempt of the step fed back (its answer, error, evidence
and typed failures: stages/history.py), at most `max_attempts` times.
Every attempt is recorded with its class: an output fault's kind (invalid_json, truncated, refusal...),
the check's kind (sql_error...), or the request fault's; and with its trace: the prompt sent, the model's
answer, the spec decoded from it, the check's evidence, the looks the model made (llm/looks.py). Transient faults (the endpoint failing through
its own retries) propagate for Prefect to retry; a request the endpoint rejects for good (context_length)
fails the stage at once; a fatal fault (auth) propagates to stop the run."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from pydantic import BaseModel

from worldsmith.errors import WorldsmithError
from worldsmith.jsonvalue import JsonObject
from worldsmith.llm.backend import Generator, Prompt, Usage
from worldsmith.llm.errors import GenerationFault, OutputFault, TransientFault
from worldsmith.stages.attempts import AttemptLog, AttemptTrace
from worldsmith.stages.history import Fault, StepHistory

Spec = TypeVar("Spec", bound=BaseModel)
Result = TypeVar("Result")


class CheckFailed(WorldsmithError):
    """What the stage wrote did not survive execution; `kind` classifies it (sql_error, tool_crash...).
    `faults` are its typed failures (default: one of `kind` about the message's first line), `evidence`
    what the checks saw, where the message does not say it already (for the repair prompt), `records`
    the records that show it (failed probes' records, kept with the attempt's trace)."""

    def __init__(
        self,
        kind: str,
        message: str,
        faults: Iterable[Fault] = (),
        evidence: str = "",
        records: list[JsonObject] | None = None,
    ):
        super().__init__(message)
        self.kind = kind
        self.faults = list(faults) or [Fault(kind=kind, subject=message.split("\n")[0][:200])]
        self.evidence = evidence
        self.records = records or []


def refuse_repeated(names: Sequence[str], kind: str, what: str) -> None:
    """Raise `CheckFailed` of `kind` when a name stands twice in `names` (`what` they are: "task ids"), one
    fault for each such name."""
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise CheckFailed(
            kind,
            f"{what} must be unique; repeated: {', '.join(repeated)}",
            [Fault(kind=kind, subject=n) for n in repeated],
        )


class StageFailed(WorldsmithError):
    """A stage ran out of attempts (or met a fault no attempt can repair); the environment is failed with
    this reason. `error_class` is the last attempt's class."""

    def __init__(self, stage: str, attempts: int, error: str, error_class: str | None = None):
        super().__init__(f"stage {stage} failed after {attempts} attempts: {error}")
        self.stage = stage
        self.attempts = attempts
        self.error = error
        self.error_class = error_class


def _retried(usage: Usage) -> str:
    return f"\n(transient faults retried within this attempt: {'; '.join(usage.retries)})" if usage.retries else ""


def run_with_repair(
    *,
    stage: str,
    env_id: str | None,
    generator: Generator,
    prompt: Callable[[str | None], Prompt],
    spec: type[Spec],
    check: Callable[[Spec], Result],
    log: AttemptLog,
    max_attempts: int = 5,
    first_feedback: str | None = None,
    history: StepHistory | None = None,
) -> Result:
    """Run one stage to success or StageFailed. `prompt(feedback)` builds each attempt's request, the
    feedback being the repair prompt of `history` (the step's earlier attempts, this run's added to it as
    they are made) once an attempt failed. `first_feedback`, a later check's error about the latest
    accepted answer, makes the first attempt a repair. Raises TransientFault (for Prefect to retry) and
    fatal faults (to stop the run) after recording them."""
    history = history if history is not None else StepHistory()
    if first_feedback is not None and not history.awaits_repair():
        history.reject_latest(first_feedback)
    feedback = history.repair_text() if first_feedback is not None else None
    error, error_class = "no attempt made", None
    for attempt in range(1, max_attempts + 1):
        started = time.perf_counter()
        request = prompt(feedback)
        try:
            generation = generator.generate(request, spec)
        except TransientFault as fault:
            log.record(
                env_id=env_id,
                stage=stage,
                attempt=attempt,
                outcome="transient",
                usage=fault.usage,
                error_class=fault.kind,
                error_text=str(fault),
                trace=AttemptTrace(request),
            )
            raise
        except GenerationFault as fault:
            usage = fault.usage or Usage()
            usage.seconds = usage.seconds or time.perf_counter() - started
            error, error_class = f"{type(fault).__name__}: {fault}", fault.kind
            log.record(
                env_id=env_id,
                stage=stage,
                attempt=attempt,
                outcome="failure",
                usage=usage,
                error_class=error_class,
                error_text=error + _retried(usage),
                trace=AttemptTrace(request, fault.text or None, looks=fault.looks),
            )
            if fault.fatal:
                raise
            if not isinstance(fault, OutputFault):  # the endpoint rejects the request itself: no repair helps
                raise StageFailed(stage, attempt, error, error_class) from fault
            history.add(fault.text, error, faults=[Fault(kind=fault.kind)], checked=False)
            feedback = history.repair_text()
            continue
        usage = generation.usage
        try:
            result = check(generation.spec)
        except CheckFailed as failed:
            usage.seconds = time.perf_counter() - started
            error, error_class = f"{failed.kind}: {failed}", failed.kind
            log.record(
                env_id=env_id,
                stage=stage,
                attempt=attempt,
                outcome="failure",
                usage=usage,
                error_class=failed.kind,
                error_text=str(failed) + _retried(usage),
                trace=AttemptTrace(request, generation.raw, generation.spec, failed.records, generation.looks),
            )
            history.add(generation.raw, error, failed.evidence, failed.faults)
            feedback = history.repair_text()
            continue
        usage.seconds = time.perf_counter() - started
        history.add(generation.raw)
        retried = "; ".join(usage.retries) or None  # transient faults the client recovered from
        log.record(
            env_id=env_id,
            stage=stage,
            attempt=attempt,
            outcome="success",
            usage=usage,
            error_class="retried" if retried else None,
            error_text=retried,
            trace=AttemptTrace(request, generation.raw, generation.spec, looks=generation.looks),
        )
        return result
    raise StageFailed(stage, max_attempts, error, error_class)
