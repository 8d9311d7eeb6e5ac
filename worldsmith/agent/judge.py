"""The LLM judge: an OpenAI-compatible model reviews a verified episode and rules complete,
partial, agent_error or env_error; with `votes` > 1, several samples vote and the majority rules.

Ties go to the verifier's verdict when it is among the tied, else to the stricter ruling
(agent_error < partial < complete; env_error only by a strict majority). Unparseable votes are
dropped; when none is left, the verifier's verdict stands and the record says why.
"""

from __future__ import annotations

import json
from collections import Counter

import openai

from worldsmith.agent.loop import JudgeRecord, Trajectory
from worldsmith.jsonvalue import JsonValue
from worldsmith.llm.jsonrepair import parse_json_object
from worldsmith.llm.prompts import render
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.verdict import Verdict

#: What a judge may rule, strictest first.
RULINGS = (Verdict.agent_error, Verdict.partial, Verdict.complete, Verdict.env_error)
#: A verifier's verdict as the ruling that agrees with it.
VERIFIER_TO_RULING = {Verdict.incomplete: Verdict.agent_error}


def _clip(value: JsonValue, limit: int = 400) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


def transcript(trajectory: Trajectory) -> str:
    """The tool calls of an episode as numbered lines, results clipped."""
    lines = [
        f"{i}. {s.call.name}({json.dumps(s.call.arguments)}) -> {s.status}: {_clip(s.value if s.status == 'ok' else s.error)}"
        for i, s in enumerate(trajectory.steps, start=1)
    ]
    return "\n".join(lines) or "(none)"


def majority(votes: list[Verdict], verifier: Verdict | None) -> Verdict:
    """The ruling of `votes` (see the module docstring for ties; None: the judge did not see the verifier's verdict)."""
    counts = Counter(votes).most_common()
    top = [ruling for ruling, n in counts if n == counts[0][1]]
    if len(top) == 1:
        return top[0]
    if verifier is not None and (ruling := VERIFIER_TO_RULING.get(verifier, verifier)) in top:
        return ruling
    return min((r for r in top if r != Verdict.env_error), key=RULINGS.index, default=Verdict.agent_error)


def parse_vote(text: str) -> tuple[Verdict | None, str]:
    """A judge's answer as (ruling, reason); (None, why) when it is not a JSON object with a known verdict."""
    try:
        data = parse_json_object(text)
    except ValueError as exc:
        return None, f"unparseable vote: {exc}"
    ruling = data.get("verdict")
    if ruling not in RULINGS:
        return None, f"unknown verdict {ruling!r}"
    return Verdict(ruling), str(data.get("reason", ""))


class LLMJudge:
    """Reviews episodes through an OpenAI-compatible chat endpoint."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        votes: int = 1,
        temperature: float | None = None,
        timeout_s: float = 60.0,
    ):
        if votes < 1:
            raise ValueError("votes must be at least 1")
        self.model, self.votes = model, votes
        self.temperature = temperature if temperature is not None else (0.0 if votes == 1 else 0.7)
        self.client = openai.OpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout_s, max_retries=2
        )

    def _vote(self, system: str, user: str) -> tuple[Verdict | None, str]:
        response = self.client.chat.completions.create(
            model=self.model,
            temperature=self.temperature,
            max_tokens=300,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        )
        return parse_vote(response.choices[0].message.content or "")

    def review(self, task: TaskSpec, trajectory: Trajectory) -> tuple[Verdict, JudgeRecord]:
        """(ruling, record): the majority of `votes` judge samples, with each vote and reason."""
        system, user = render(
            "judge",
            instruction=task.instruction,
            steps=transcript(trajectory),
            answer=trajectory.answer or "(none)",
            verdict=trajectory.verdict,
            evidence=_clip(trajectory.evidence, 2000),
        )
        ballots = [self._vote(system, user) for _ in range(self.votes)]
        votes = [ruling for ruling, _ in ballots if ruling is not None]
        record: JudgeRecord = {"model": self.model, "votes": [{"ruling": r, "reason": why} for r, why in ballots]}
        if not votes:
            return trajectory.verdict, {**record, "error": "no valid vote; the verifier's verdict stands"}
        return majority(votes, trajectory.verdict), record
