"""Planted verifier faults of procedural worlds: verifiers that judge the wrong end state, the way models
write them (issue 33), for verifier mutation testing (quality/verifier_mutations.py, verifier_ids.py) and the
answer variants (agent/answer_variants.py) to find. Each planter rewrites verifiers.py (and, for one, a task's
expected answer) and returns the ids of the tasks whose verifier it broke; faults.py registers them.

- `verifier_exact_log_compare` (too strict): a two-part task's verifier also wants the audit log's new rows
  in exactly the reference's order: the same work done in the other order is rejected;
- `verifier_case_sensitive_name`: a counting task's answer names the record, and its verifier looks for the
  name with its exact case;
- `verifier_passes_wrong_entity`: an update's verifier accepts any row of the table newly holding the value;
- `verifier_passes_half_done`: a two-part task's verifier is satisfied by either part;
- `verifier_hard_coded_id`: a create task's verifier reads the new row by the id this seed gives it next;
- `verifier_passes_untouched`: an update's verifier also accepts the row's value before the task;
- `verifier_passes_extra_insert`: a create task's verifier accepts more new rows than the task makes;
- `verifier_exact_free_text` (too strict): a task writing free text (an address, a note) has its verifier
  compare the stored text character for character: the same text in another case or spacing is rejected;
- `verifier_accepts_any_text`: an update of free text is accepted once the column holds any new value, a
  create whatever free text its row holds (another entity's address passes).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable

from worldsmith.bundle.sqlscript import build_world
from worldsmith.models.bundle import TaskSpec

Planter = Callable[[dict[str, str], list[TaskSpec]], frozenset[str]]
_FUNCTION = re.compile(r"^def verify_(\w+)\(initial, final, answer\):\n(?:(?:    [^\n]*)?\n)*", re.MULTILINE)
_UPDATE = re.compile(
    r"    value = _value\(final, ('\w+'), (\d+), ('\w+')\)\n    return _result\('complete' if _same\(value, (.+?)\) else"
)


def _rewrite(sources: dict[str, str], change: Callable[[str, str], str | None], limit: int = 1) -> frozenset[str]:
    """verifiers.py with `change(task id, function text)` applied to the first `limit` verifier functions it
    changes (None: left alone); the ids of the tasks changed. ValueError when none."""
    verifiers = sources["verifiers.py"]
    changed: list[str] = []
    parts, last = [], 0
    for match in _FUNCTION.finditer(verifiers):
        new = change(match.group(1), match.group(0)) if len(changed) < limit else None
        if new is not None and new != match.group(0):
            parts += [verifiers[last : match.start()], new]
            last = match.end()
            changed.append(match.group(1))
    if not changed:
        raise ValueError("no verifier of the shape this fault is planted in")
    sources["verifiers.py"] = "".join(parts) + verifiers[last:]
    return frozenset(changed)


def _exact_log_compare(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    def change(task: str, text: str) -> str | None:
        ids = re.findall(r"(?:first|second) = _value\(final, '\w+', (\d+),", text)
        if len(ids) != 2 or "if first and second:" not in text:
            return None
        logged = "    logged = [r['row_id'] for r in _new_rows(initial, final, 'audit_log')]\n"
        check = f"    first = first and logged == [{ids[0]}, {ids[1]}]\n"
        return text.replace("    evidence = ", logged + check + "    evidence = ", 1)

    return _rewrite(sources, change, limit=2)


def _case_sensitive_name(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    for task in tasks:
        named = re.search(r"does the ([\w ]+?) '([^']+)' have\?", task.instruction)
        if named is None or not task.answer:
            continue
        label = f"{named.group(1).capitalize()} '{named.group(2)}'"
        task.answer = f"{label}: {task.answer}"

        def change(task_id: str, text: str, task: TaskSpec = task, label: str = label) -> str | None:
            if task_id != task.id or "    said = _states_count(" not in text:
                return None
            return re.sub(
                r"(    said = _states_count\([^\n]*\n)", rf"\1    said = said and {label!r} in (answer or '')\n", text
            )

        return _rewrite(sources, change)
    raise ValueError("no counting task naming a record")


def _passes_wrong_entity(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    def change(task: str, text: str) -> str | None:
        match = _UPDATE.search(text)
        if match is None:
            return None
        table, column, value = match.group(1).strip("'"), match.group(3).strip("'"), match.group(4)
        count = f'\'SELECT COUNT(*) FROM "{table}" WHERE "{column}" = ?\', ({value},)'
        line = (
            f"    value = {value} if final.execute({count}).fetchone()[0] > "
            f"initial.execute({count}).fetchone()[0] else None\n"
        )
        return text.replace(match.group(0).split("\n")[0] + "\n", line, 1)

    return _rewrite(sources, change, limit=2)


def _passes_half_done(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    def change(task: str, text: str) -> str | None:
        return (
            text.replace("    if first and second:\n", "    if first or second:\n") if "if first and" in text else None
        )

    return _rewrite(sources, change, limit=2)


def _hard_coded_id(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    world, _ = build_world(sources["schema.sql"], sources["seed.sql"])
    assert world is not None, "a procedural world's seed builds"
    conn = sqlite3.connect(":memory:")
    conn.deserialize(world)

    def change(task: str, text: str) -> str | None:
        match = re.search(r"    rows = _new_rows\(initial, final, '(\w+)'\)\n", text)
        if match is None:
            return None
        next_id = conn.execute(f'SELECT COALESCE(MAX(id), 0) + 1 FROM "{match.group(1)}"').fetchone()[0]
        read = (
            f"    rows = [dict(r) for r in final.execute('SELECT * FROM \"{match.group(1)}\" WHERE id = {next_id}')]\n"
        )
        return text.replace(match.group(0), read, 1)

    try:
        return _rewrite(sources, change)
    finally:
        conn.close()


def _passes_untouched(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    def change(task: str, text: str) -> str | None:
        match = _UPDATE.search(text)
        if match is None:
            return None
        table, row, column, value = match.groups()
        before = f"_value(initial, {table}, {row}, {column})"
        return text.replace(f"if _same(value, {value}) else", f"if _same(value, {value}) or value == {before} else", 1)

    return _rewrite(sources, change)


def _passes_extra_insert(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    def change(task: str, text: str) -> str | None:
        old = "    if len(exact) == 1 and len(rows) == 1:\n"
        return text.replace(old, "    if exact:\n") if old in text else None

    return _rewrite(sources, change, limit=2)


_FREE_TEXT = re.compile(r"'[A-Za-z][^'\n]* [^'\n]*'")


def _exact_free_text(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    def change(task: str, text: str) -> str | None:
        update = _UPDATE.search(text)
        if update is not None and _FREE_TEXT.fullmatch(update.group(4)):
            return text.replace(f"_same(value, {update.group(4)})", f"value == {update.group(4)}", 1)
        expected = re.search(r"    expected = (\{.*\})\n", text)
        if expected is not None and _FREE_TEXT.search(expected.group(1)) and "all(_same(r.get(k), v)" in text:
            return text.replace("all(_same(r.get(k), v)", "all(r.get(k) == v", 1)
        return None

    return _rewrite(sources, change)


def _accepts_any_text(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    def change(task: str, text: str) -> str | None:
        match = _UPDATE.search(text)
        if match is not None and _FREE_TEXT.fullmatch(match.group(4)):
            table, row, column, value = match.groups()
            before = f"_value(initial, {table}, {row}, {column})"
            return text.replace(f"if _same(value, {value}) else", f"if value and value != {before} else", 1)
        expected = re.search(r"    expected = (\{.*\})\n", text)
        old = "all(_same(r.get(k), v) for k, v in expected.items())"
        if expected is None or not _FREE_TEXT.search(expected.group(1)) or old not in text:
            return None
        return text.replace(old, old[:-1] + " if not (isinstance(v, str) and ' ' in v))", 1)  # any text passes

    return _rewrite(sources, change)


#: The verifier fault classes, by name (faults.PLANTERS takes them all).
VERIFIER_PLANTERS: dict[str, Planter] = {
    "verifier_exact_log_compare": _exact_log_compare,
    "verifier_case_sensitive_name": _case_sensitive_name,
    "verifier_passes_wrong_entity": _passes_wrong_entity,
    "verifier_passes_half_done": _passes_half_done,
    "verifier_hard_coded_id": _hard_coded_id,
    "verifier_passes_untouched": _passes_untouched,
    "verifier_passes_extra_insert": _passes_extra_insert,
    "verifier_exact_free_text": _exact_free_text,
    "verifier_accepts_any_text": _accepts_any_text,
}
