"""World models: given the state and a tool call, predict the observation and the database diff.

- `OracleWorldModel`: replays the real transition (the ceiling every score is measured against);
- `StaticWorldModel`: always "ok, nothing changed" (a deliberately wrong floor);
- `OpenAIWorldModel`: any OpenAI-compatible chat model, prompted with the state and the call and
  asked for JSON; an answer that is not that JSON is an invalid prediction (scored as wrong);
- `HFWorldModel`: a local causal LM (trained by `worldsmith/training/world_model_sft.py`), prompted alike.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from pathlib import Path
from typing import Protocol

import openai
from pydantic import BaseModel, Field, ValidationError

from worldsmith.jsonvalue import JsonObject
from worldsmith.llm.jsonrepair import parse_json_object
from worldsmith.worldmodel.config import check_world_model
from worldsmith.worldmodel.scoring import canonical
from worldsmith.worldmodel.transitions import HistoryEntry, Observation, Transition, state_text

SYSTEM = """You simulate the tools of a software environment whose state is a SQLite database.
Given the state (the task, relevant rows, recent calls) and one tool call, answer with one JSON object:
{"observation": {"status": "ok" | "tool_error" | "env_error", "value": <the tool's result when ok>, "error": <message when not ok>},
 "diff": {"<table>": {"inserted": [<row>...], "updated": [{"key": {...}, "before": {...}, "after": {...}}...], "deleted": [<row>...]}}}
Use an empty diff {} when the call changes nothing. Answer with the JSON object only."""


class Prediction(BaseModel):
    """One predicted transition; `observation` None marks an invalid answer (`raw` holds it)."""

    observation: Observation | None = None
    diff: JsonObject = Field(default_factory=dict)
    raw: str | None = None


def prediction_key(prediction: Prediction) -> str:
    """Canonical text of a prediction: equal keys, equal predictions (invalid answers are equal
    only when their text is)."""
    if prediction.observation is None:
        return canonical({"invalid": prediction.raw})
    return canonical({"observation": prediction.observation.model_dump(), "diff": prediction.diff})


def consensus(predictions: list[Prediction]) -> tuple[Prediction, float]:
    """The most common of `predictions` (the first of equals) and the share of them that agree with it."""
    counts = Counter(prediction_key(p) for p in predictions)
    best, count = counts.most_common(1)[0]
    return next(p for p in predictions if prediction_key(p) == best), count / len(predictions)


class WorldModel(Protocol):
    name: str

    def predict(self, transition: Transition, history: list[HistoryEntry], samples: int = 1) -> list[Prediction]:
        """`samples` predictions of `transition`'s call, given `history` (the real earlier calls, or the
        model's own predictions of them in k-step evaluation)."""
        ...


class OracleWorldModel:
    """Answers every call with what really happened."""

    name = "oracle"

    def predict(self, transition: Transition, history: list[HistoryEntry], samples: int = 1) -> list[Prediction]:
        if transition.observation is None:
            raise ValueError(
                "the oracle replays recorded transitions and cannot answer a query; simulate with the `code` world model"
            )
        return [Prediction(observation=transition.observation, diff=transition.diff) for _ in range(samples)]


class StaticWorldModel:
    """Answers every call with success, no value, no change."""

    name = "static"

    def predict(self, transition: Transition, history: list[HistoryEntry], samples: int = 1) -> list[Prediction]:
        return [Prediction(observation=Observation(status="ok"), diff={}) for _ in range(samples)]


def prompt(transition: Transition, history: list[HistoryEntry]) -> list[dict[str, str]]:
    """The chat messages of one prediction (also the SFT prompt of a trained world model)."""
    call = f"Tool call: {transition.action['name']}({json.dumps(transition.action['arguments'], sort_keys=True)})"
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": state_text(transition.task, transition.rows, history) + "\n" + call},
    ]


def target(transition: Transition) -> str:
    """What a perfect world model answers (the SFT completion)."""
    assert transition.observation is not None  # a recorded call, not a query
    return json.dumps(
        {"observation": transition.observation.model_dump(), "diff": transition.diff}, sort_keys=True, default=str
    )


def parse_prediction(text: str) -> Prediction:
    """A model's answer as a prediction; anything but the expected JSON is an invalid one."""
    try:
        data = parse_json_object(text)
        observation = Observation.model_validate(data.get("observation"))
        diff = data.get("diff") or {}
        if not isinstance(diff, dict):
            raise ValueError("diff is not an object")
        return Prediction(observation=observation, diff=diff, raw=text)
    except (ValueError, ValidationError, AttributeError):
        return Prediction(observation=None, raw=text)


class OpenAIWorldModel:
    """A chat model on an OpenAI-compatible endpoint as a world model."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
        max_tokens: int = 1024,
        timeout_s: float = 60.0,
    ):
        self.name = f"openai:{model}"
        self.model, self.temperature, self.max_tokens = model, temperature, max_tokens
        self.client = openai.OpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout_s, max_retries=2
        )

    def predict(self, transition: Transition, history: list[HistoryEntry], samples: int = 1) -> list[Prediction]:
        temperature = self.temperature if self.temperature is not None else (0.0 if samples == 1 else 0.7)
        out = []
        for _ in range(samples):
            response = self.client.chat.completions.create(
                model=self.model,
                temperature=temperature,
                max_tokens=self.max_tokens,
                messages=prompt(transition, history),  # type: ignore[arg-type]  # role/content dicts, as openai's types say
            )
            out.append(parse_prediction(response.choices[0].message.content or ""))
        return out


class HFWorldModel:
    """A local causal LM (a `save_pretrained` directory) as a world model: greedy for one sample.

    Safe to share between threads (episodes running at once): one prediction at a time, each
    sampled from its own generator seeded by its prompt, so the answers depend neither on thread
    timing nor on the global random state, which they leave untouched."""

    def __init__(self, path: str | Path, max_new_tokens: int = 512):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.name = f"hf:{path}"
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        if torch.cuda.is_available():
            self.model = self.model.to("cuda")  # type: ignore[arg-type]  # transformers' decorated `to` is mistyped
        self.model.eval()
        self.max_new_tokens = max_new_tokens
        self._lock = threading.Lock()

    def predict(self, transition: Transition, history: list[HistoryEntry], samples: int = 1) -> list[Prediction]:
        import torch
        from transformers import BatchEncoding

        encoded = self.tokenizer.apply_chat_template(
            prompt(transition, history),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            enable_thinking=False,
        )
        assert isinstance(encoded, BatchEncoding)  # return_dict=True
        inputs = {k: v.to(self.model.device) for k, v in encoded.items()}
        seed = int(hashlib.sha256(repr(encoded["input_ids"][0].tolist()).encode()).hexdigest()[:8], 16)
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        with self._lock, torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(seed)
            output = self.model.generate(
                **inputs,
                max_new_tokens=self.max_new_tokens,
                do_sample=samples > 1,
                num_return_sequences=samples,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        start = inputs["input_ids"].shape[1]
        return [
            # one sequence decodes to one str
            parse_prediction(self.tokenizer.decode(sequence[start:], skip_special_tokens=True))  # type: ignore[arg-type]
            for sequence in output
        ]


def world_model(spec: str, *, max_new_tokens: int = 512) -> WorldModel:
    """A world model by name: oracle | static | openai:MODEL (the WORLDSMITH_LLM_* endpoint) | hf:PATH (a local model directory)."""
    kind, _, target = check_world_model(spec).partition(":")
    if spec == "oracle":
        return OracleWorldModel()
    if spec == "static":
        return StaticWorldModel()
    if kind == "openai":
        from worldsmith.settings import get_settings

        settings = get_settings()
        return OpenAIWorldModel(
            target, base_url=settings.llm_base_url, api_key=settings.llm_key(), timeout_s=settings.llm_timeout_s
        )
    if not (Path(target) / "config.json").is_file():
        raise ValueError(f"world model {spec!r}: {target} is not a model directory")
    return HFWorldModel(target, max_new_tokens=max_new_tokens)
