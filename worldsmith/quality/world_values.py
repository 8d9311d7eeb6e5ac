"""The seeded database as the deep probes' inputs (quality/deep_probes.py): each table's declared
constraints (quality/schema.py), its primary keys and each column's distinct values, in row order; and the
English of table names (`singular`, `words`) the probes match tools and parameters to tables by.
`world_values` builds them once per world content and bound in a process (every probe family of a check
reads the same world)."""

from __future__ import annotations

import re
from typing import Any

from worldsmith.bundle.sqlscript import deserialize
from worldsmith.quality.memo import SharedMemo, content_digest
from worldsmith.quality.probes import SeedValues
from worldsmith.quality.schema import Range, TableSchema, read_schema

#: Irregular plurals of table-name words, each with its singular.
IRREGULAR = {"people": "person", "children": "child", "men": "man", "women": "woman", "mice": "mouse"}
#: Singular words that end in -us (their plurals add -es: statuses); other words' final -s is a plural's.
SINGULAR_US = frozenset(
    {"status", "bus", "campus", "bonus", "virus", "census", "focus", "radius", "corpus", "syllabus", "surplus", "genus"}
)


def singular(word: str) -> str:
    """English singular of a lower-case table-name word or snake_case name, by its last word (categories ->
    category, classes -> class, statuses -> status, people -> person, order_items -> order_item); a
    singular (class, status, box) stays as it is."""
    head, underscore, last = word.rpartition("_")
    if last in IRREGULAR:
        return head + underscore + IRREGULAR[last]
    if last in SINGULAR_US:
        return word
    if last.endswith("es") and last[:-2] in SINGULAR_US:
        return word[:-2]
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if re.search(r"(ss|sh|ch|x|z)es$", word):
        return word[:-2]
    if word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def words(text: str) -> list[str]:
    """The words of a name or text, lower case and singular (`listOrderItems` -> list, order, item)."""
    return [singular(w) for w in re.findall(r"[a-z0-9]+", re.sub(r"([a-z])([A-Z])", r"\1 \2", text).lower())]


def _spread(values: list[Any], bound: int) -> list[Any]:
    """At most `bound` of `values`, first and last included, evenly spaced."""
    if len(values) <= bound:
        return list(values)
    if bound <= 1:
        return values[:bound]
    return [values[round(i * (len(values) - 1) / (bound - 1))] for i in range(bound)]


class WorldValues:
    """The seeded database as probe inputs: each table's declared constraints (quality/schema.py),
    its primary keys and each column's distinct values, in row order; its first `row_limit` rows (`rows`)."""

    def __init__(self, world: bytes, bound: int, row_limit: int = 2_000):
        self.bound = bound
        conn = deserialize(world, read_only=True)
        try:
            self.tables: dict[str, TableSchema] = {t.name: t for t in read_schema(conn)}
            self.columns: dict[tuple[str, str], list[Any]] = {}
            self.rows: dict[str, list[dict[str, Any]]] = {}
            for table in self.tables.values():
                cursor = conn.execute(f'SELECT * FROM "{table.name}" LIMIT {row_limit}')
                names = [d[0] for d in cursor.description]
                rows = cursor.fetchall()
                self.rows[table.name] = [dict(zip(names, r)) for r in rows]
                for position, name in enumerate(names):
                    seen = dict.fromkeys(r[position] for r in rows if r[position] is not None)
                    self.columns[(table.name, name)] = list(seen)
        finally:
            conn.close()
        self.seeds = SeedValues(world)

    def keys(self, table: str) -> tuple[list[Any], Any]:
        """Spread primary-key values of `table` (its single key column, else rowid-less: none), and
        a key it does not hold (None when it has no single key)."""
        schema = self.tables.get(table)
        if schema is None or len(schema.primary_key) != 1:
            return [], None
        held = self.columns.get((table, schema.primary_key[0]), [])
        numbers = [v for v in held if isinstance(v, int) and not isinstance(v, bool)]
        if numbers:
            unknown: Any = max(numbers) + 1000
        elif held:
            unknown = f"no-such-{singular(table)}"
        else:
            return [], None
        return _spread(held, self.bound), unknown

    def referenced_table(self, parameter: str) -> str | None:
        """The table an id parameter names: `<singular>_id` of a table, else the parent of a foreign
        key column of that name (`pickup_branch_id` -> branches)."""
        if not parameter.endswith("_id"):
            return None
        base = parameter[: -len("_id")]
        for name in self.tables:
            if singular(name) == base or name == base:
                return name
        for table in self.tables.values():
            for column, parent, _ in table.foreign_keys:
                if column == parameter and parent in self.tables:
                    return parent
        return None

    def holding(self, column: str, preferred: set[str]) -> list[TableSchema]:
        """Tables with a column `column`, those in `preferred` first."""
        found = [t for t in self.tables.values() if column in t.columns]
        return sorted(found, key=lambda t: t.name not in preferred)

    def enum(self, column: str, preferred: set[str]) -> tuple[list[Any], bool]:
        """The values a CHECK allows column `column` (a `preferred` table's first), and whether they
        are a `preferred` table's."""
        for table in self.holding(column, preferred):
            if column in table.enums:
                return list(table.enums[column]), table.name in preferred
        return [], False

    def range(self, column: str, preferred: set[str]) -> tuple[Range | None, bool]:
        """The range a CHECK bounds column `column` to, and whether it is a `preferred` table's."""
        for table in self.holding(column, preferred):
            if column in table.ranges:
                return table.ranges[column], table.name in preferred
        return None, False

    def column_values(self, column: str, preferred: set[str]) -> list[Any]:
        values: list[Any] = []
        for table in self.holding(column, preferred):
            values += self.columns.get((table.name, column), [])
        return _spread(list(dict.fromkeys(values)), self.bound)

    def text_values(self, tables: set[str]) -> list[Any]:
        """Identifying text of `tables` (their first text column that is not a key): what a search finds."""
        values: list[Any] = []
        for name in sorted(tables):
            table = self.tables[name]
            for column in table.columns:
                held = self.columns.get((name, column), [])
                if column not in table.primary_key and held and all(isinstance(v, str) for v in held):
                    values += _spread(held, 3)
                    break
        return values


#: The WorldValues of the latest worlds, by the digest of the world and the bound: read-only once built.
_BUILT: SharedMemo[WorldValues] = SharedMemo(16, copies=False)


def world_values(world: bytes, bound: int) -> WorldValues:
    """`WorldValues(world, bound)`, built once per world content and bound in this process (callers only
    read it)."""
    return _BUILT.get(content_digest(world, bound), lambda: WorldValues(world, bound))


def forget_world_values() -> None:
    """Forget the WorldValues built so far (bench/probes.py times a world's validation from scratch)."""
    _BUILT.clear()
