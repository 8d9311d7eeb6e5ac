"""Pages of long lists: the dashboard asks SQL for one page (LIMIT/OFFSET) and the total, never every row."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlalchemy import func
from sqlmodel import Session, select

#: Rows per page of a list page, the most a request may ask for, and the rows of a front-page top-N table.
PAGE_SIZE, MAX_PAGE_SIZE, TOP_N = 50, 500, 10

Row = TypeVar("Row")


@dataclass(frozen=True)
class PageRequest:
    """Which rows to show: `limit` rows from `offset`."""

    limit: int = PAGE_SIZE
    offset: int = 0

    @classmethod
    def from_query(cls, params: Mapping[str, str], limit: int = PAGE_SIZE) -> PageRequest:
        """`limit` and `offset` from query parameters, clamped to 1..MAX_PAGE_SIZE and >= 0; ValueError
        when one is not a number."""
        try:
            wanted, offset = int(params.get("limit") or limit), int(params.get("offset") or 0)
        except ValueError:
            raise ValueError("limit and offset are whole numbers") from None
        return cls(limit=min(max(wanted, 1), MAX_PAGE_SIZE), offset=max(offset, 0))

    def apply(self, query: Any) -> Any:
        return query.limit(self.limit).offset(self.offset)


@dataclass(frozen=True)
class Page(Generic[Row]):
    """One page of a list: its rows, how many rows the whole list has, and where this page is in it."""

    rows: list[Row]
    total: int
    request: PageRequest = field(default_factory=PageRequest)

    @property
    def next_offset(self) -> int | None:
        after = self.request.offset + self.request.limit
        return after if after < self.total else None

    @property
    def previous_offset(self) -> int | None:
        return max(self.request.offset - self.request.limit, 0) if self.request.offset > 0 else None

    @property
    def more(self) -> int:
        """Rows after this page."""
        return max(self.total - self.request.offset - len(self.rows), 0)


def count_rows(session: Session, query: Any) -> int:
    """SQL: how many rows `query` returns (grouped queries included)."""
    return session.exec(select(func.count()).select_from(query.order_by(None).subquery())).one()
