"""What a world's schema declares, read from its SQLite database: per table the primary key,
NOT NULL columns, foreign keys, and CHECK constraints that bound a column to a set or a range."""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field

_IN = re.compile(r"CHECK\s*\(\s*\"?(\w+)\"?\s+IN\s*\(([^)]*)\)\s*\)", re.IGNORECASE)
_BETWEEN = re.compile(r"CHECK\s*\(\s*\"?(\w+)\"?\s+BETWEEN\s+(-?[\d.]+)\s+AND\s+(-?[\d.]+)\s*\)", re.IGNORECASE)
_COMPARE = re.compile(r"CHECK\s*\(\s*\"?(\w+)\"?\s*(>=|>|<=|<)\s*(-?[\d.]+)\s*\)", re.IGNORECASE)
_LITERAL = re.compile(r"'((?:[^']|'')*)'|(-?\d+(?:\.\d+)?)")


@dataclass
class Range:
    low: float | None = None
    high: float | None = None
    strict_low: bool = False
    strict_high: bool = False


@dataclass
class TableSchema:
    name: str
    columns: list[str]
    primary_key: list[str]
    not_null: list[str]
    foreign_keys: list[tuple[str, str, str]]  # (column, parent table, parent column)
    enums: dict[str, list[object]] = field(default_factory=dict)
    ranges: dict[str, Range] = field(default_factory=dict)
    has_rowid: bool = True


def _number(text: str) -> float | int:
    return float(text) if "." in text else int(text)


def _literals(text: str) -> list[object]:
    values: list[object] = []
    for quoted, number in _LITERAL.findall(text):
        values.append(quoted.replace("''", "'") if number == "" else _number(number))
    return values


def _checks(sql: str, table: TableSchema) -> None:
    for column, values in _IN.findall(sql):
        if column in table.columns:
            table.enums[column] = _literals(values)
    for column, low, high in _BETWEEN.findall(sql):
        if column in table.columns:
            table.ranges[column] = Range(_number(low), _number(high))
    for column, op, bound in _COMPARE.findall(sql):
        if column not in table.columns:
            continue
        current = table.ranges.setdefault(column, Range())
        if op in (">", ">="):
            current.low, current.strict_low = _number(bound), op == ">"
        else:
            current.high, current.strict_high = _number(bound), op == "<"


def read_schema(conn: sqlite3.Connection) -> list[TableSchema]:
    """Every user table of `conn` with its declared constraints."""
    tables = []
    rows = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
    ).fetchall()
    for name, sql in rows:
        info = conn.execute(f'PRAGMA table_info("{name}")').fetchall()
        columns = [r[1] for r in info]
        primary_key = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
        foreign_keys = []
        for fk in conn.execute(f'PRAGMA foreign_key_list("{name}")').fetchall():
            parent, column, parent_column = fk[2], fk[3], fk[4]
            if parent_column is None:  # references the parent's primary key
                parent_info = conn.execute(f'PRAGMA table_info("{parent}")').fetchall()
                pk = [r[1] for r in parent_info if r[5]]
                parent_column = pk[0] if pk else "rowid"
            foreign_keys.append((column, parent, parent_column))
        table = TableSchema(
            name=name,
            columns=columns,
            primary_key=primary_key,
            not_null=[r[1] for r in info if r[3]],
            foreign_keys=foreign_keys,
            has_rowid="WITHOUT ROWID" not in (sql or "").upper(),
        )
        _checks(sql or "", table)
        tables.append(table)
    return tables
