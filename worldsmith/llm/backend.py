"""The generator interface shared by every backend: ask for a pydantic spec, get a valid one
with the call's usage, or a `GenerationFault` saying why not."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Protocol, TypedDict, TypeVar

from pydantic import BaseModel

from worldsmith.jsonvalue import JsonObject
from worldsmith.llm.looks import Look, LookOffer

Spec = TypeVar("Spec", bound=BaseModel)


@dataclass
class Usage:
    """What generating one spec cost (summed over the HTTP attempts of one call)."""

    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    retries: list[str] = field(default_factory=list)  # why each retried HTTP attempt failed

    def add(self, other: Usage) -> None:
        self.calls += other.calls
        self.tokens_in += other.tokens_in
        self.tokens_out += other.tokens_out
        self.cost_usd += other.cost_usd
        self.seconds += other.seconds
        self.retries += other.retries


@dataclass
class Generation(Generic[Spec]):
    spec: Spec
    usage: Usage
    raw: str = ""
    looks: list[Look] = field(default_factory=list)  # the looks the model made before answering (llm/looks.py)


class PromptContext(TypedDict, total=False):
    """The structured facts behind a prompt's text. A world's stages give its scenario (as
    `Scenario.model_dump()`), seed, env_id and the repair feedback of the previous attempt (None on a
    first try); the scenario stage gives the example scenarios, how many to propose, its round, the names
    taken (shown in the prompt, at most scenario.TAKEN_SHOWN) and feedback."""

    scenario: JsonObject
    seed: int
    env_id: str
    feedback: str | None
    examples: list[JsonObject]
    count: int
    round: int
    taken: list[str]


@dataclass
class Prompt:
    """One request: the system and user messages and the stage it belongs to. `context` carries
    the structured facts behind the text (scenario, seed, whether errors were fed back), which
    the procedural backend uses and LLM backends ignore. `looks`: what the model may look at before it
    answers (llm/looks.py), for the backends that converse; None: nothing."""

    stage: str
    system: str
    user: str
    context: PromptContext = field(default_factory=PromptContext)
    looks: LookOffer | None = None


class Generator(Protocol):
    """A backend: `openai` (any OpenAI-compatible endpoint) or `procedural` (offline)."""

    backend: str
    model: str

    def generate(self, prompt: Prompt, spec: type[Spec]) -> Generation[Spec]:
        """A valid `spec` instance for `prompt`; raises a GenerationFault of its kind (llm/errors.py: OutputFault,
        RequestFault, EndpointAuthFault, TransientFault), with usage attached as `fault.usage` when any was spent
        (and the looks made, as `fault.looks`, where the prompt offered any)."""
        ...


def decode(text: str, spec: type[Spec], usage: Usage) -> Spec:
    """The spec in a model's text output, or an OutputFault (with the text and usage) saying why not."""
    from pydantic import ValidationError

    from worldsmith.llm.errors import OutputFault
    from worldsmith.llm.jsonrepair import parse_json_object, unterminated_json

    def fault(message: str, kind: str) -> OutputFault:
        error = OutputFault(message, text=text, kind=kind)
        error.usage = usage
        return error

    def cut_off(problem: str) -> OutputFault | None:
        """An answer that does not decode because its JSON is cut off mid-way (whatever the finish reason
        said): truncated, not bad JSON or a schema mismatch."""
        left_open = unterminated_json(text)
        if left_open is None:
            return None
        return fault(
            f"output truncated: the answer ends inside an unterminated JSON {left_open}, cut off before its end; "
            f"answer again in full, more concisely ({problem})",
            "truncated",
        )

    try:
        data = parse_json_object(text)
    except ValueError as exc:
        raise cut_off(str(exc)) or fault(str(exc), "invalid_json") from None
    try:
        return spec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()[:10])
        problem = f"output does not match {spec.__name__}: {problems}"
        raise cut_off(problem) or fault(problem, "schema_mismatch") from None
