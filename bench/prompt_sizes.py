"""Characters of each generation step's prompt and answer, measured on procedural worlds.

    .venv/bin/python bench/prompt_sizes.py [--worlds 4] [--seed 7]

Builds `worlds` environments with the procedural backend through the same stages and prompts as the
openai backend, and measures per step the request an endpoint would get (system and user messages
plus the spec's JSON Schema sent as response_format) and the answer. Prints a Markdown table (mean
characters, and tokens at about 4 characters per token); the last line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worldsmith.llm.backend import Generation, Generator, Prompt  # noqa: E402
from worldsmith.llm.procedural.backend import ProceduralGenerator  # noqa: E402
from worldsmith.models.bundle import Scenario  # noqa: E402
from worldsmith.runtime.episode import Runtime  # noqa: E402
from worldsmith.stages.attempts import AttemptLog  # noqa: E402
from worldsmith.stages.pipeline import build_environment  # noqa: E402

SCENARIOS = [
    "Pet clinic booking",
    "Neighbourhood library",
    "Freight brokerage",
    "Online bookstore",
    "Gym membership desk",
    "City bike rental",
    "Conference ticketing",
    "Home insurance claims",
]
CHARS_PER_TOKEN = 4


class MeasuredGenerator:
    """A generator that records the size of every request it forwards and of the answer."""

    def __init__(self, inner: Generator):
        self.inner, self.backend, self.model = inner, inner.backend, inner.model
        self.sizes: dict[str, dict[str, list[int]]] = defaultdict(lambda: {"prompt": [], "answer": []})

    def generate(self, prompt: Prompt, spec: Any) -> Generation:
        generation = self.inner.generate(prompt, spec)
        request = len(prompt.system) + len(prompt.user) + len(json.dumps(spec.model_json_schema()))
        self.sizes[prompt.stage]["prompt"].append(request)
        self.sizes[prompt.stage]["answer"].append(len(generation.raw or generation.spec.model_dump_json()))
        return generation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    measured = MeasuredGenerator(ProceduralGenerator(seed=args.seed))
    with Runtime() as runtime:
        for name in (SCENARIOS * (args.worlds // len(SCENARIOS) + 1))[: args.worlds]:
            scenario = Scenario(name=name, description=f"The {name.lower()} application and its users.")
            result = build_environment(scenario, args.seed, measured, runtime, AttemptLog("prompt-sizes"))
            if not result.good:
                raise SystemExit(f"{name}: {result.reason}")
    rows = {
        stage: {kind: round(statistics.mean(values)) for kind, values in sizes.items()}
        for stage, sizes in measured.sizes.items()
    }
    print("| step | prompt chars | answer chars | prompt tokens | answer tokens |")
    print("| --- | --- | --- | --- | --- |")
    for stage, size in rows.items():
        print(
            f"| {stage} | {size['prompt']:,} | {size['answer']:,} | "
            f"~{size['prompt'] // CHARS_PER_TOKEN:,} | ~{size['answer'] // CHARS_PER_TOKEN:,} |"
        )
    total = {kind: sum(size[kind] for size in rows.values()) for kind in ("prompt", "answer")}
    print(
        f"| per world | {total['prompt']:,} | {total['answer']:,} | ~{total['prompt'] // CHARS_PER_TOKEN:,} | "
        f"~{total['answer'] // CHARS_PER_TOKEN:,} |"
    )
    print(json.dumps({"worlds": args.worlds, "steps": rows, "per_world": total}))


if __name__ == "__main__":
    main()
