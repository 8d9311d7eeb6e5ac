"""Which tables a tool may write (quality/deep_probes.py judges its writes by them): those its name or
description names, the tables linked to those, and the tables every writer may touch; and which tools
only read, by their names."""

from __future__ import annotations

import re
from collections import Counter

from worldsmith.models.bundle import ToolSchema
from worldsmith.quality.schema import TableSchema
from worldsmith.quality.world_values import singular, words

#: A tool whose name starts with one of these says it only reads.
READ_PREFIXES = ("get", "list", "find", "search", "count")
#: Tables every writer may touch: logs and ledgers (by name), besides those most writers touch.
_SHARED_NAME = re.compile(r"(^|_)(logs?|audits?|history|histories|ledgers?|activity|activities)($|_)|_events?$")


def named_tables(tool: ToolSchema, tables: dict[str, TableSchema]) -> set[str]:
    """Tables the tool's name or description names (a table's words, singular, in a row)."""
    text = f" {' '.join(words(f'{tool.name} {tool.description}'))} "
    return {name for name in tables if f" {' '.join(words(name))} " in text}


def own_tables(named: set[str], footprint: set[str], shared: set[str], tables: dict[str, TableSchema]) -> set[str]:
    """A writing tool's own tables, conservatively: those it names (else, naming none, those its
    reference-solution calls wrote: a footprint that would otherwise hide the very write in question);
    the tables linked to them by a foreign key either way, and the other parents of their children (an
    order's items, and the products those items hold: stock); and the `shared` ones (logs, or what
    most writers write)."""
    core = named or footprint
    children = {t.name for t in tables.values() for _, parent, _ in t.foreign_keys if parent in core}
    parents = {parent for t in tables.values() if t.name in core | children for _, parent, _ in t.foreign_keys}
    return core | children | parents | shared


def is_read_tool(name: str) -> bool:
    """Whether the tool's name says it only reads (get_, list_, find_, search_, count_; or camelCase)."""
    first = words(name)[:1]
    return bool(first) and (first[0] in READ_PREFIXES or singular(first[0]) in READ_PREFIXES)


def shared_tables(tables: list[str], written: dict[str, set[str]]) -> set[str]:
    """The tables of `tables` every writer may touch: logs and ledgers (by name) and, given three writing
    tools or more, those most of them wrote (`written`: the tables each tool's calls wrote)."""
    writing = [name for name, tables_written in written.items() if tables_written and not is_read_tool(name)]
    counts = Counter(table for name in writing for table in written[name])
    shared = {t for t in tables if _SHARED_NAME.search(t)}
    return shared | {t for t, n in counts.items() if len(writing) >= 3 and n * 2 > len(writing)}
