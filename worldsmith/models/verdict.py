"""The verdict vocabulary: what an episode came to. Stdlib only: the sandbox worker maps every
verifier's result to a `Verdict` (worldsmith/bundle/kinds.py)."""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    """What an episode came to: its verifier's judgement, or the failure that ended it first.

    complete, partial, incomplete: what the task's verifier said. agent_error: the agent failed
    (or a judge overruled the verifier). format_error: the agent's tool call was malformed.
    env_error: the environment failed; counted against the environment, never the agent.
    """

    complete = "complete"
    partial = "partial"
    incomplete = "incomplete"
    agent_error = "agent_error"
    env_error = "env_error"
    format_error = "format_error"


#: What a verifier may say; the other verdicts are outcomes of the episode, not of its verifier.
VERIFIER_VERDICTS: tuple[Verdict, ...] = (Verdict.complete, Verdict.partial, Verdict.incomplete)
