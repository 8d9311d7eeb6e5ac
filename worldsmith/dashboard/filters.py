"""The dashboard's filters (date range, generation run, backend, category), read from query parameters and
applied in SQL: each gives WHERE clauses for the stage-attempt rollups and for published versions. The
run, backend and category filters are chosen from the values the catalog holds (`FilterChoices`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import date
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import String, cast, func, text
from sqlmodel import Session, col, select

from worldsmith.models.catalog import Environment, EnvironmentVersion, NightRollup, StageRollup

PARAMETERS = ("date_from", "date_to", "run", "backend", "category")


def night_of(session: Session, column: Any) -> Any:
    """SQL: the UTC date of a timestamp column (SQLite stores UTC; PostgreSQL's timestamptz is converted
    to UTC first, whatever the session's time zone)."""
    if session.get_bind().dialect.name == "postgresql":
        return func.date(func.timezone("UTC", column))
    return func.date(column)


def parse_night(text: str) -> date:
    """A night as `YYYY-MM-DD`; ValueError naming the expected form otherwise."""
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a date: use YYYY-MM-DD") from None


@dataclass(frozen=True)
class Filters:
    """What the operator narrowed the dashboard to; None is no restriction. Dates are inclusive UTC nights;
    `backend` is a version's generator backend; `category` one of its environment's categories. Worlds
    never published (no version) have neither, so they drop out when either is set."""

    date_from: date | None = None
    date_to: date | None = None
    run: str | None = None
    backend: str | None = None
    category: str | None = None

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> Filters:
        """The filters in query parameters (empty values ignored); ValueError for a malformed date."""
        values = {key: (params.get(key) or "").strip() or None for key in PARAMETERS}
        return cls(
            date_from=parse_night(values["date_from"]) if values["date_from"] else None,
            date_to=parse_night(values["date_to"]) if values["date_to"] else None,
            run=values["run"],
            backend=values["backend"],
            category=values["category"],
        )

    @property
    def active(self) -> bool:
        return any(value is not None for value in asdict(self).values())

    def params(self) -> dict[str, str]:
        """The set filters as query parameters."""
        return {key: str(value) for key, value in asdict(self).items() if value is not None}

    def query(self, **extra: Any) -> str:
        """`?…` carrying these filters and `extra` (None values left out), or '' when there is nothing."""
        params = {**self.params(), **{key: str(value) for key, value in extra.items() if value is not None}}
        return f"?{urlencode(params)}" if params else ""

    def without_dates(self) -> Filters:
        return replace(self, date_from=None, date_to=None)

    def _dates(self, night: Any) -> list[Any]:
        clauses = []
        if self.date_from is not None:
            clauses.append(night >= self.date_from)
        if self.date_to is not None:
            clauses.append(night <= self.date_to)
        return clauses

    def _category_envs(self) -> Any:
        # JSON lists are stored as text on SQLite and cast to text on PostgreSQL: match the quoted name
        needle = json.dumps(self.category)
        return select(Environment.env_id).where(cast(Environment.categories, String).contains(needle, autoescape=True))

    @property
    def by_world(self) -> bool:
        """Whether these filters narrow by world (backend, category): only rollups keyed by world apply them."""
        return self.backend is not None or self.category is not None

    @property
    def by_night_or_run(self) -> bool:
        """Whether these filters narrow by night or run: only rollups keyed by night and run apply them."""
        return self.date_from is not None or self.date_to is not None or self.run is not None

    def rollups(self, table: Any) -> list[Any]:
        """WHERE clauses selecting the rows of a stage-attempt rollup (models/catalog.py) these filters keep: its
        night, run and world are the attempts' own. The table must have the keys the set filters need
        (`by_world`, `by_night_or_run`)."""
        clauses = self._dates(table.night) if self.date_from is not None or self.date_to is not None else []
        if self.run is not None:
            clauses.append(table.run_id == self.run)
        if self.backend is not None:
            backend_envs = select(EnvironmentVersion.env_id).where(EnvironmentVersion.generator_backend == self.backend)
            clauses.append(table.env_id.in_(backend_envs))
        if self.category is not None:
            clauses.append(table.env_id.in_(self._category_envs()))
        return clauses

    def versions(self, session: Session) -> list[Any]:
        """WHERE clauses selecting the published versions these filters keep (`run`: worlds the run attempted)."""
        clauses = self._dates(night_of(session, EnvironmentVersion.created_at))
        if self.run is not None:
            clauses.append(
                col(EnvironmentVersion.env_id).in_(select(StageRollup.env_id).where(StageRollup.run_id == self.run))
            )
        if self.backend is not None:
            clauses.append(EnvironmentVersion.generator_backend == self.backend)
        if self.category is not None:
            clauses.append(col(EnvironmentVersion.env_id).in_(self._category_envs()))
        return clauses


def backend_choices(session: Session) -> list[str]:
    """The generator backends of published versions (the backend filter's choices)."""
    return [
        b
        for b in session.exec(
            select(EnvironmentVersion.generator_backend).distinct().order_by(EnvironmentVersion.generator_backend)
        ).all()
        if b
    ]


#: The most runs the run filter offers (the newest).
RUN_CHOICES = 200


@dataclass(frozen=True)
class RunChoice:
    """A run the run filter offers: its id, and a label with its first night."""

    run_id: str
    label: str


@dataclass(frozen=True)
class FilterChoices:
    """The values the run, backend and category filters offer: what the catalog holds, so a filter is picked
    from a list, never typed (a typo would show an empty dashboard)."""

    runs: list[RunChoice]
    backends: list[str]
    categories: list[str]


def run_choices(session: Session, limit: int = RUN_CHOICES) -> list[RunChoice]:
    """The generation runs with stage attempts, newest first (by their first night), at most `limit`."""
    first = func.min(NightRollup.night)
    rows = session.exec(
        select(NightRollup.run_id, first).group_by(col(NightRollup.run_id)).order_by(first.desc()).limit(limit)
    ).all()
    return [RunChoice(run_id, f"{night} {run_id}") for run_id, night in rows]


def category_choices(session: Session) -> list[str]:
    """The categories of the environments in the catalog, in order (distinct in SQL, from the JSON lists)."""
    if session.get_bind().dialect.name == "postgresql":
        query = "SELECT DISTINCT json_array_elements_text(categories) AS c FROM environments ORDER BY c"
    else:
        query = "SELECT DISTINCT j.value AS c FROM environments, json_each(environments.categories) AS j ORDER BY c"
    return [str(c) for (c,) in session.connection().execute(text(query)).all() if c]


def filter_choices(session: Session) -> FilterChoices:
    return FilterChoices(
        runs=run_choices(session), backends=backend_choices(session), categories=category_choices(session)
    )
