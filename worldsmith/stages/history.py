"""What a stage step remembers of its attempts, and the repair prompt made from it.

Every attempt of a step (`tools:code`, `verifiers`...) is kept, across the validation rounds of one
world: its answer, its error, the evidence and its typed failures (`Fault`: a kind, e.g. a probe's
`ProbeFailure` or a check's kind, and the subject it is about: a task id, a tool, a table). A repair
prompt carries them all, oldest first: each answer whole, or, over the prompt's budget, the parts the
failures name with a line naming what was cut (stages/answer_parts.py); a short answer always whole.
An attempt that fails in a way an earlier attempt failed, after an attempt in between was checked
without that failure, brought that failure back: the repair prompt says so first."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from worldsmith.stages.answer_parts import kept_parts, whole

#: The most characters the answers of a repair prompt take together (each short answer whole regardless).
ANSWERS_CHARS = 60_000
#: An answer this short is always shown whole.
SHORT_ANSWER_CHARS = 4_000
#: The most characters of one attempt's error, and of its evidence, a repair prompt shows.
ERROR_CHARS = 6_000


class Fault(BaseModel):
    """One typed failure of an attempt: its `kind` and the `subject` it is about ("" for the whole answer)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    subject: str = ""

    def line(self) -> str:
        return f"{self.kind} ({self.subject})" if self.subject else self.kind


class PastAttempt(BaseModel):
    """One attempt of a step: `number` (1, 2, ... across the world's rounds), its raw `answer` ("" when
    not kept), its `error` ("" while accepted), `evidence`, its `faults`, and whether its answer was
    `checked` (decoded and run through the step's checks, or a later validation)."""

    number: int
    answer: str = ""
    error: str = ""
    evidence: str = ""
    faults: list[Fault] = Field(default_factory=list)
    checked: bool = True

    @property
    def rejected(self) -> bool:
        return bool(self.error)


def _bounded(text: str, limit: int, what: str) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... the last {len(text) - limit} characters of this {what} were cut]"


class StepHistory(BaseModel):
    """The attempts of one step so far, oldest first."""

    attempts: list[PastAttempt] = Field(default_factory=list)

    def add(
        self, answer: str, error: str = "", evidence: str = "", faults: Iterable[Fault] = (), checked: bool = True
    ) -> PastAttempt:
        """Record the next attempt (`error` "" when its answer was accepted)."""
        attempt = PastAttempt(
            number=len(self.attempts) + 1,
            answer=answer,
            error=error,
            evidence=evidence,
            faults=list(faults),
            checked=checked,
        )
        self.attempts.append(attempt)
        return attempt

    def awaits_repair(self) -> bool:
        """Whether the latest attempt was rejected (its repair is the next attempt)."""
        return bool(self.attempts) and self.attempts[-1].rejected

    def reject_latest(self, error: str, faults: Iterable[Fault] = (), evidence: str = "") -> None:
        """A later check (validation, the review) rejected the latest accepted answer; with none kept (a
        work resumed from before attempts were kept), an attempt whose answer is not kept."""
        faults = list(faults) or [Fault(kind="validation", subject=error.split("\n")[0][:200])]
        if self.attempts and not self.attempts[-1].rejected:
            latest = self.attempts[-1]
            self.attempts[-1] = latest.model_copy(update={"error": error, "faults": faults, "evidence": evidence})
        else:
            self.add("", error, evidence, faults)

    def brought_back(self) -> list[str]:
        """For each attempt, the failures of an earlier attempt it brought back (an attempt checked in
        between did not have them), as the repair prompt says it."""
        lines = []
        for index, attempt in enumerate(self.attempts):
            for fault in dict.fromkeys(attempt.faults):
                earlier = [a for a in self.attempts[:index] if fault in a.faults]
                if not earlier:
                    continue
                first = earlier[0]
                between = self.attempts[first.number : index]
                if any(a.checked and fault not in a.faults for a in between):
                    lines.append(
                        f"attempt {attempt.number} brought back the failure of attempt {first.number}: {fault.line()}"
                    )
        return lines

    def _answers(self) -> dict[int, str]:
        """Each attempt's answer as shown: newest first, whole while the budget lasts (short ones always),
        else the parts its failures name."""
        shown: dict[int, str] = {}
        left = ANSWERS_CHARS
        for attempt in reversed(self.attempts):
            if not attempt.answer:
                shown[attempt.number] = "(not kept)"
                continue
            text = whole(attempt.answer)
            if len(text) > SHORT_ANSWER_CHARS and len(text) > left:
                subjects = {f.subject for f in attempt.faults}
                text = kept_parts(attempt.answer, subjects, max(left, SHORT_ANSWER_CHARS))
            shown[attempt.number] = text
            left = max(0, left - len(text))
        return shown

    def repair_text(self) -> str:
        """The repair prompt: what came back, then every attempt (answer, error, evidence), oldest first."""
        answers = self._answers()
        blocks = [
            "Your previous answer was rejected. Here is every earlier attempt of this step, oldest first, each "
            "with its answer, the error it got and the evidence. Fix the latest error and keep every earlier "
            "one fixed: do not bring back a failure an earlier attempt had."
        ]
        back = self.brought_back()
        if back:
            blocks.append("Failures that came back:\n" + "\n".join(f"- {line}" for line in back))
        for attempt in self.attempts:
            status = "rejected" if attempt.rejected else "accepted then (the steps before this one were redone since)"
            lines = [f"=== Attempt {attempt.number}: {status}"]
            if attempt.rejected:
                lines.append("Error:\n" + _bounded(attempt.error, ERROR_CHARS, "error"))
            if attempt.evidence:
                lines.append("Evidence:\n" + _bounded(attempt.evidence, ERROR_CHARS, "evidence"))
            lines.append("Answer:\n" + answers[attempt.number])
            blocks.append("\n".join(lines))
        blocks.append("Fix the problem and answer again in full.")
        return "\n\n".join(blocks)
