"""Map a scenario to the domain whose building blocks fit it best (keyword evidence in its name,
description and categories; ties broken by a stable hash so the choice never changes), and draw the
domains a batch of new scenarios is spread over."""

from __future__ import annotations

import hashlib
import random
import re

from worldsmith.llm.procedural.blocks import DOMAINS, Domain
from worldsmith.models.bundle import Scenario


def _score(domain: Domain, name: str, text: str) -> float:
    score = 0.0
    for keyword in domain.keywords:
        pattern = r"\b" + re.escape(keyword)
        score += 3.0 * len(re.findall(pattern, name)) + len(re.findall(pattern, text))
    return score


def domain_for(scenario: Scenario) -> Domain:
    """The best-fitting domain of `scenario` (every scenario gets one)."""
    name = scenario.name.lower()
    text = " ".join([scenario.description, *scenario.categories]).lower()
    for domain in DOMAINS:
        if domain.key in [c.lower() for c in scenario.categories]:
            return domain
    scores = [(_score(d, name, text), d) for d in DOMAINS]
    best = max(score for score, _ in scores)
    tied = [d for score, d in scores if score == best]
    digest = int(hashlib.sha256(scenario.name.encode()).hexdigest(), 16)
    return tied[digest % len(tied)]


def domains_to_expand(examples: list[Scenario], rng: random.Random) -> list[Domain]:
    """The domains of `examples` (every domain when there are none) in an order drawn from `rng`: new
    scenarios taken round robin from it spread over the domains, and a run seeded otherwise (another
    night) starts from other domains."""
    keys = {domain_for(example).key for example in examples}
    domains = [d for d in DOMAINS if d.key in keys] or list(DOMAINS)
    rng.shuffle(domains)
    return domains
