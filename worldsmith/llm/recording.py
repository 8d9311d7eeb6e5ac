"""Record and replay of model answers: a run's every request and answer kept in a directory, and a
`replay:DIR` backend that answers from it, so a recorded night reruns offline to the same catalog.

A recording directory holds:

- `generators/<sha256>.json`: each generator that recorded into it (backend, model and the
  parameters that shape its answers: temperature, max_tokens, seed...), and the embeddings model
  scenario dedup used, if any;
- `answers/<key>.<n>.json`: the n-th answer (0, 1, ...) to the request `key`, the sha256 of the
  model, those parameters, the response format (the spec's name and JSON Schema) and the prompt
  (system and user messages), and the looks it offered (their kinds and bounds, llm/looks.py) where it
  offered any; embeddings are keyed by their model and texts. An answer keeps the raw text, or the fault
  the generator raised (its class, message and text), the call's usage, and the looks the model made
  before answering (each with its answer): a replay gives them back as they were, without looking again.

Every file is written whole under a temporary name and linked into place (`os.link` fails if the
name is taken, so concurrent threads and processes recording one request get numbers of their own).
A replay answers the n-th ask of a request with its n-th recorded answer (the last one repeats),
decoded by the same path as live output (`llm/backend.decode`), so repair loops run as they did.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict, final

from pydantic import BaseModel

from worldsmith.errors import WorldsmithError
from worldsmith.llm.backend import Generation, Generator, Prompt, Spec, Usage, decode
from worldsmith.llm.errors import GenerationFault, OutputFault, TransientFault
from worldsmith.llm.looks import Look

#: Attributes of a generator that shape its answers to one prompt (those it has are part of the key).
GENERATION_PARAMETERS: tuple[
    Literal["temperature", "max_tokens", "seed", "fault_rate", "persistent_fault_rate"], ...
] = ("temperature", "max_tokens", "seed", "fault_rate", "persistent_fault_rate")
REPLAY_PREFIX = "replay:"


class GenerationParameters(TypedDict, total=False):
    """The GENERATION_PARAMETERS a generator has, by name (the openai backend's temperature and
    max_tokens, the procedural backend's seed, fault_rate and persistent_fault_rate)."""

    temperature: float
    max_tokens: int
    seed: int
    fault_rate: float
    persistent_fault_rate: float


@final
class GeneratorRecord(TypedDict):
    """`generators/<sha256>.json` of a generator that recorded answers."""

    backend: str
    model: str
    parameters: GenerationParameters


@final
class EmbeddingsRecord(TypedDict):
    """`generators/<sha256>.json` of the embeddings model scenario dedup used."""

    backend: str
    embeddings_model: str


class UsageRecord(TypedDict):
    """A recorded call's usage (`Usage` less its seconds and retries)."""

    calls: int
    tokens_in: int
    tokens_out: int
    cost_usd: float


#: A recorded fault: its class ("module:qualname"), kind and message.
FaultRecord = TypedDict("FaultRecord", {"class": str, "kind": str, "message": str})


class AnswerRecord(TypedDict):
    """`answers/<key>.<n>.json` of a generated spec: the request, and the raw text or the fault with the usage."""

    stage: str
    env_id: str | None
    backend: str
    model: str
    parameters: GenerationParameters
    spec: str
    system: str
    user: str
    text: str
    fault: FaultRecord | None
    usage: UsageRecord
    looks: NotRequired[list[dict[str, Any]]]  # each a `Look` as JSON (recordings made before looks have none)


class EmbeddingsAnswerRecord(TypedDict):
    """`answers/<key>.<n>.json` of embeddings: the stage "embeddings", the model and the vectors."""

    stage: Literal["embeddings"]
    model: str
    vectors: list[list[float]]


#: What one file of a recording holds.
RecordFile = GeneratorRecord | EmbeddingsRecord | AnswerRecord | EmbeddingsAnswerRecord


class RecordingNotFound(WorldsmithError, ValueError):
    """A `replay:DIR` whose directory does not exist or holds no recording."""


class ReplayMiss(GenerationFault):
    """A request the recording holds no answer to: the replayed run asked something the recorded one
    did not (code, prompts or parameters changed). Run-wide and not transient: `fatal`."""

    kind = "replay_miss"
    fatal = True


def _sha256(material: object) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def generation_parameters(generator: Generator) -> GenerationParameters:
    """The parameters of `generator` that shape its answers (GENERATION_PARAMETERS it has)."""
    parameters = GenerationParameters()
    for name in GENERATION_PARAMETERS:
        if hasattr(generator, name):
            parameters[name] = getattr(generator, name)
    return parameters


def request_key(model: str, parameters: GenerationParameters, spec: type[BaseModel], prompt: Prompt) -> str:
    """The key of one request: model, generation parameters, response format, prompt and the looks it
    offers (a prompt offering none keys as before looks existed)."""
    response_format = {"name": spec.__name__, "schema": spec.model_json_schema()}
    material: dict[str, object] = {
        "model": model,
        "parameters": parameters,
        "response_format": response_format,
        "system": prompt.system,
        "user": prompt.user,
    }
    if prompt.looks is not None:
        material["looks"] = prompt.looks.key()
    return _sha256(material)


def embeddings_key(model: str, texts: list[str]) -> str:
    return _sha256({"embeddings_model": model, "texts": texts})


def _written(directory: Path, data: RecordFile) -> Path:
    """A temporary file in `directory` holding `data` as JSON, written whole (flushed to disk)."""
    temporary = directory / f".{uuid.uuid4().hex}.tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump(data, out, ensure_ascii=False)
        out.flush()
        os.fsync(out.fileno())
    return temporary


def _replace(path: Path, data: RecordFile) -> None:
    """`path` holds `data` as JSON, replaced atomically."""
    os.replace(_written(path.parent, data), path)


def _add_numbered(directory: Path, stem: str, data: RecordFile) -> Path:
    """`data` as JSON in `directory/<stem>.<n>.json` for the first free n, taken atomically (a link
    fails where the name is taken, so concurrent writers never share a number or see half a file)."""
    temporary = _written(directory, data)
    try:
        number = 0
        while True:
            target = directory / f"{stem}.{number}.json"
            try:
                os.link(temporary, target)
                return target
            except FileExistsError:
                number += 1
    finally:
        temporary.unlink(missing_ok=True)


class Recording:
    """A recording directory (see the module docstring)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.generators_dir = directory / "generators"
        self.answers_dir = directory / "answers"

    @classmethod
    def create(cls, directory: Path) -> Recording:
        recording = cls(directory)
        recording.generators_dir.mkdir(parents=True, exist_ok=True)
        recording.answers_dir.mkdir(parents=True, exist_ok=True)
        return recording

    @classmethod
    def existing(cls, directory: Path) -> Recording:
        """The recording in `directory`; RecordingNotFound (naming the fix) when there is none."""
        recording = cls(directory)
        if not directory.is_dir():
            raise RecordingNotFound(f"no recording at {directory}: no such directory (make one with --record DIR)")
        if not recording.generators():
            raise RecordingNotFound(
                f"no recording at {directory}: it holds no recorded generator (make one with --record DIR)"
            )
        return recording

    def add_generator(self, identity: GeneratorRecord | EmbeddingsRecord) -> None:
        _replace(self.generators_dir / f"{_sha256(identity)}.json", identity)

    def generators(self) -> list[GeneratorRecord | EmbeddingsRecord]:
        """The generators that recorded here (backend, model, parameters), in a stable order."""
        if not self.generators_dir.is_dir():
            return []
        return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(self.generators_dir.glob("*.json"))]

    def add_answer(self, key: str, entry: AnswerRecord | EmbeddingsAnswerRecord) -> Path:
        return _add_numbered(self.answers_dir, key, entry)

    def answer_count(self, key: str) -> int:
        count = 0
        while (self.answers_dir / f"{key}.{count}.json").exists():
            count += 1
        return count

    def _read_answer(self, key: str, number: int) -> Any:
        return json.loads((self.answers_dir / f"{key}.{number}.json").read_text(encoding="utf-8"))

    def answer(self, key: str, number: int) -> AnswerRecord:
        """The `number`-th answer to the request `key` (see `request_key`)."""
        entry: AnswerRecord = self._read_answer(key, number)
        return entry

    def embeddings_answer(self, key: str, number: int) -> EmbeddingsAnswerRecord:
        """The `number`-th answer to the embeddings request `key` (see `embeddings_key`)."""
        entry: EmbeddingsAnswerRecord = self._read_answer(key, number)
        return entry


def _usage_record(usage: Usage) -> UsageRecord:
    return {
        "calls": usage.calls,
        "tokens_in": usage.tokens_in,
        "tokens_out": usage.tokens_out,
        "cost_usd": usage.cost_usd,
    }


def _fault_record(fault: GenerationFault) -> FaultRecord:
    return {"class": f"{type(fault).__module__}:{type(fault).__qualname__}", "kind": fault.kind, "message": str(fault)}


def _replayed_fault(record: FaultRecord, text: str) -> GenerationFault:
    """The recorded fault raised again, of its kind: its own class when that is a GenerationFault built
    from (message, text=...), else an OutputFault with its message."""
    module, _, name = record["class"].partition(":")
    fault: GenerationFault = OutputFault(record["message"], text=text)
    try:
        recorded_class = getattr(importlib.import_module(module), name)
        if isinstance(recorded_class, type) and issubclass(recorded_class, GenerationFault):
            fault = recorded_class(record["message"], text=text)
    except (ImportError, AttributeError, TypeError):
        pass
    fault.kind = record.get("kind", fault.kind)
    return fault


class RecordingGenerator:
    """`inner` with every request and answer kept in a recording directory; answers as `inner` does.
    Transient and fatal faults (the endpoint failing, not the model answering) are not recorded."""

    def __init__(self, inner: Generator, directory: Path):
        self.inner = inner
        self.backend = inner.backend
        self.model = inner.model
        self.parameters = generation_parameters(inner)
        self.recording = Recording.create(directory)
        self.recording.add_generator({"backend": self.backend, "model": self.model, "parameters": self.parameters})

    def _keep(
        self,
        key: str,
        prompt: Prompt,
        spec: type[BaseModel],
        text: str,
        usage: Usage,
        fault: FaultRecord | None,
        looks: list[Look],
    ) -> None:
        self.recording.add_answer(
            key,
            {
                "stage": prompt.stage,
                "env_id": prompt.context.get("env_id"),
                "backend": self.backend,
                "model": self.model,
                "parameters": self.parameters,
                "spec": spec.__name__,
                "system": prompt.system,
                "user": prompt.user,
                "text": text,
                "fault": fault,
                "usage": _usage_record(usage),
                "looks": [look.model_dump(mode="json") for look in looks],
            },
        )

    def generate(self, prompt: Prompt, spec: type[Spec]) -> Generation[Spec]:
        key = request_key(self.model, self.parameters, spec, prompt)
        try:
            generation = self.inner.generate(prompt, spec)
        except GenerationFault as fault:
            if not isinstance(fault, TransientFault) and not fault.fatal:
                self._keep(key, prompt, spec, fault.text, fault.usage or Usage(), _fault_record(fault), fault.looks)
            raise
        text = generation.raw or generation.spec.model_dump_json()
        self._keep(key, prompt, spec, text, generation.usage, None, generation.looks)
        return generation

    def __getattr__(self, name: str) -> Any:
        """`embed` (scenario dedup by embeddings) when `inner` has it, its answers recorded."""
        inner = self.inner
        if name != "embed" or not hasattr(inner, "embed"):
            raise AttributeError(name)

        def embed(texts: list[str], model: str) -> list[list[float]]:
            vectors: list[list[float]] = inner.embed(texts, model)
            self.recording.add_generator({"backend": self.backend, "embeddings_model": model})
            self.recording.add_answer(
                embeddings_key(model, texts), {"stage": "embeddings", "model": model, "vectors": vectors}
            )
            return vectors

        return embed


class ReplayGenerator:
    """The `replay:DIR` backend: answers every request from a recording; a request it holds no
    answer to raises ReplayMiss naming the stage, the world and the directory."""

    backend = "replay"

    def __init__(self, directory: Path):
        self.recording = Recording.existing(directory)
        recorded = self.recording.generators()
        self.generators = [g for g in recorded if "parameters" in g]
        self.model = ", ".join(sorted({g["model"] for g in self.generators}))
        #: The embeddings model the recorded run deduplicated scenarios with (None: it used TF-IDF).
        self.embeddings_model: str | None = next(
            (g["embeddings_model"] for g in recorded if "embeddings_model" in g), None
        )
        self._asked: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _next(self, key: str) -> int | None:
        """The number of the recorded answer to this ask of `key` (the n-th ask gets the n-th; the last
        repeats); None when there is none."""
        count = self.recording.answer_count(key)
        if not count:
            return None
        with self._lock:
            number = self._asked[key]
            self._asked[key] += 1
        return min(number, count - 1)

    def _miss(self, what: str) -> ReplayMiss:
        return ReplayMiss(
            f"replay miss: no recorded answer to {what} in {self.recording.directory}; the replayed run asked "
            "what the recorded one did not (code, prompts or parameters changed): record the run again"
        )

    def generate(self, prompt: Prompt, spec: type[Spec]) -> Generation[Spec]:
        for generator in self.generators:
            key = request_key(generator["model"], generator["parameters"], spec, prompt)
            number = self._next(key)
            if number is not None:
                entry = self.recording.answer(key, number)
                break
        else:
            world = prompt.context.get("env_id")
            raise self._miss(f"stage {prompt.stage} of world {world}" if world else f"stage {prompt.stage}")
        usage = Usage(**entry["usage"])
        text = entry["text"]
        looks = [Look.model_validate(look) for look in entry.get("looks", [])]
        if entry["fault"] is not None:
            fault = _replayed_fault(entry["fault"], text)
            fault.usage = usage
            fault.looks = looks
            raise fault
        return Generation(decode(text, spec, usage), usage, text, looks)

    def embed(self, texts: list[str], model: str) -> list[list[float]]:
        key = embeddings_key(model, texts)
        number = self._next(key)
        if number is None:
            raise self._miss(f"the embeddings of {len(texts)} texts (model {model})")
        return self.recording.embeddings_answer(key, number)["vectors"]


def replay_directory(backend: str) -> Path | None:
    """The directory of a `replay:DIR` backend (None for any other backend)."""
    return Path(backend.removeprefix(REPLAY_PREFIX)) if backend.startswith(REPLAY_PREFIX) else None
