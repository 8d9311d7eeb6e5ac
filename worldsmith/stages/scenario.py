"""Stage `scenario`: expand seed scenarios (by default the ones in worldsmith/data/) into new ones.
Near-duplicates (of the seeds, of each other, of already accepted ones) are rejected by cosine
similarity: of embeddings when an embeddings endpoint is configured, of TF-IDF vectors otherwise; so is
a seed's or this run's name. The prompt lists the names taken (this run's first, then those of the
catalog's worlds, which a new world had better not reuse, then the seeds'; at most TAKEN_SHOWN).
Asks again until `count` are accepted or the attempts run out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sqlmodel import col, select

from worldsmith.llm.backend import Generator, Prompt, PromptContext
from worldsmith.llm.prompts import render
from worldsmith.models.bundle import Scenario
from worldsmith.models.catalog import Environment
from worldsmith.models.jsonlines import read_models
from worldsmith.models.specs import ScenarioBatch
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.order import Stage
from worldsmith.stages.repair import CheckFailed, run_with_repair
from worldsmith.storage.catalog import Catalog

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

DUPLICATE_COSINE = 0.85
EXAMPLES = 8
#: The most taken names a scenario prompt lists.
TAKEN_SHOWN = 300

Embed = Callable[[list[str]], list[list[float]]]

#: The 100 seed scenarios shipped with worldsmith (real products; the AWM paper's seed set).
DEFAULT_SCENARIOS = Path(__file__).resolve().parents[1] / "data" / "seed_scenarios.jsonl"


def load_scenarios(path: str | Path | None) -> list[Scenario]:
    """The seed scenarios in `path` (JSON lines), or the shipped ones when `path` is None."""
    file = Path(path) if path else DEFAULT_SCENARIOS
    if not file.is_file():
        raise FileNotFoundError(f"scenario file {file} not found")
    return read_models(Scenario, file, "a scenario")


def _text(scenario: Scenario) -> str:
    return f"{scenario.name}. {scenario.description}"


def similarity(texts: list[str], embed: Embed | None = None) -> NDArray[np.float64]:
    """Pairwise cosine similarity matrix of `texts`."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics.pairwise import cosine_similarity

    vectors = (
        embed(texts)
        if embed is not None
        else TfidfVectorizer(stop_words="english", sublinear_tf=True).fit_transform(texts)
    )
    matrix: NDArray[np.float64] = cosine_similarity(vectors)  # sklearn is untyped
    return matrix


def catalog_names(catalog: Catalog | None) -> list[str]:
    """The scenario names of the catalog's worlds, newest first (none without a catalog)."""
    if catalog is None:
        return []
    with catalog.session() as session:
        rows = session.exec(select(Environment.scenario_name).order_by(col(Environment.created_at).desc()))
        return list(dict.fromkeys(rows))


def taken_lines(names: Sequence[str], limit: int = TAKEN_SHOWN) -> str:
    """The taken `names` as the scenario prompt lists them: one a line, at most `limit`, the rest counted."""
    shown = "\n".join(f"- {name}" for name in names[:limit])
    hidden = len(names) - limit
    return shown + (f"\n(and {hidden} more, not shown)" if hidden > 0 else "") if names else "- (none)"


def novel(
    candidates: list[Scenario], known: list[Scenario], threshold: float = DUPLICATE_COSINE, embed: Embed | None = None
) -> tuple[list[Scenario], list[str]]:
    """The candidates that are not near-duplicates of `known` or of each other, and why the others were dropped."""
    if not candidates:
        return [], []
    texts = [_text(s) for s in known + candidates]
    matrix = similarity(texts, embed)
    accepted: list[int] = []
    dropped: list[str] = []
    names = {s.name.lower() for s in known}
    for offset, scenario in enumerate(candidates):
        index = len(known) + offset
        if scenario.name.lower() in names:
            dropped.append(f"{scenario.name!r} repeats a name")
            continue
        rivals = list(range(len(known))) + [len(known) + a for a in accepted]
        closest = max(rivals, key=lambda j: matrix[index][j], default=None)
        if closest is not None and matrix[index][closest] >= threshold:
            dropped.append(
                f"{scenario.name!r} is a near-duplicate of {texts[closest].split('.')[0]!r} (cosine {matrix[index][closest]:.2f})"
            )
            continue
        accepted.append(offset)
        names.add(scenario.name.lower())
    return [candidates[i] for i in accepted], dropped


def expand_scenarios(
    seeds: list[Scenario],
    count: int,
    generator: Generator,
    log: AttemptLog,
    *,
    max_attempts: int = 5,
    embed: Embed | None = None,
    taken: Sequence[str] = (),
) -> list[Scenario]:
    """`count` new scenarios in the spirit of `seeds`, none a near-duplicate of another or of a seed; the
    prompt lists the `taken` names (the catalog's worlds') with the seeds' and this run's."""
    accepted: list[Scenario] = []
    for round_number in range(max_attempts):
        missing = count - len(accepted)
        if missing <= 0:
            break
        examples = seeds[round_number * EXAMPLES % max(len(seeds), 1) :][:EXAMPLES] or seeds[:EXAMPLES]

        names = list(dict.fromkeys([s.name for s in accepted] + list(taken) + [s.name for s in seeds]))

        def prompt(extra: str | None) -> Prompt:
            listing = "\n".join(f"- {s.name}: {s.description}" for s in examples)
            system, user = render(
                "scenario", examples=listing, count=missing, taken=taken_lines(names), feedback=extra or ""
            )
            context: PromptContext = {
                "examples": [s.model_dump() for s in seeds],
                "count": missing,
                "round": round_number,
                "taken": names[:TAKEN_SHOWN],
                "feedback": extra,
            }
            return Prompt("scenario", system, user, context)

        def check(batch: ScenarioBatch) -> list[Scenario]:
            fresh, dropped = novel(batch.scenarios, seeds + accepted, embed=embed)
            if not fresh:
                raise CheckFailed(
                    "duplicates", "every proposed scenario was a near-duplicate: " + "; ".join(dropped[:10])
                )
            return fresh

        fresh = run_with_repair(
            stage=Stage.SCENARIO.value,
            env_id=None,
            generator=generator,
            prompt=prompt,
            spec=ScenarioBatch,
            check=check,
            log=log,
            max_attempts=max_attempts,
        )
        accepted += balanced(fresh, accepted, missing)
    return accepted


def _category(scenario: Scenario) -> str:
    return scenario.categories[0].lower() if scenario.categories else "uncategorised"


def balanced(candidates: list[Scenario], accepted: list[Scenario], take: int) -> list[Scenario]:
    """Up to `take` candidates, each time from the category least represented so far."""
    counts: dict[str, int] = {}
    for scenario in accepted:
        counts[_category(scenario)] = counts.get(_category(scenario), 0) + 1
    pool = list(candidates)
    chosen: list[Scenario] = []
    while pool and len(chosen) < take:
        best = min(pool, key=lambda s: (counts.get(_category(s), 0), pool.index(s)))
        pool.remove(best)
        chosen.append(best)
        counts[_category(best)] = counts.get(_category(best), 0) + 1
    return chosen
