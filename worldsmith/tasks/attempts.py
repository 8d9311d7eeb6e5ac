"""The record of every stage attempt: kept in memory for the run's summary and written to the
catalog's stage-attempt table as it happens."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from worldsmith.llm.backend import Usage
from worldsmith.models.catalog import StageAttempt
from worldsmith.storage.catalog import Catalog


@dataclass
class AttemptLog:
    """Attempts of one generation run (`run_id`); `catalog` None keeps them in memory only."""

    run_id: str
    catalog: Catalog | None = None
    attempts: list[StageAttempt] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, *, env_id: str | None, stage: str, attempt: int, outcome: str, usage: Usage | None = None,
               error_class: str | None = None, error_text: str | None = None) -> StageAttempt:
        usage = usage or Usage()
        row = StageAttempt(run_id=self.run_id, env_id=env_id, stage=stage, attempt=attempt, outcome=outcome,
                           error_class=error_class, error_text=(error_text or None) and error_text[:8000],
                           tokens_in=usage.tokens_in, tokens_out=usage.tokens_out, cost_usd=usage.cost_usd, seconds=usage.seconds)
        if self.catalog is not None:
            with self.catalog.session() as session:
                session.add(row)
        with self._lock:
            self.attempts.append(row)
        return row
