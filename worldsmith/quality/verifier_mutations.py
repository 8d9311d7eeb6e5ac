"""Verifier mutation testing: each task's verifier judged on end states built from its reference solution,
some that must pass and some that must fail. Every end state is made by calling the world's tools in an
episode (never by editing the database); the verifier alone judges it (the side-effect guard,
agent/footprint.py, is not asked), so a verdict the guard would rescue is still the verifier's fault.

Must fail (a verifier judging one `complete` is too lenient):
- `half done`: the reference's calls up to the second half of its writes (two writes or more);
- `wrong entity`: the reference with the row one of its writes acts on swapped for another row of the same
  table, found in the seed (everywhere that value appears in the solution);
- `extra side effect`: the reference plus its inserting write made once more, as it was or for another
  row (a second booking: an argument the instruction does not name swapped, so the extra stays within what
  the task is about, e.g. the same patient), else with its text arguments renamed (past a unique name), where the rows are of a table the verifier names: a task that creates rows must count them;
  other rows' updates, and rows a tool logs on the side, are the guard's to catch;
- `answer of another task`: the reference's end state with the answer of another task that says otherwise,
  where the verifier reads the answer (it rejects that end state with no answer at all);
- `another entity's text`: a free-text value the instruction names (quality/text_values.py), written by the
  reference, swapped for another seed row's text of that column (another customer's address; `reason`:
  a column `..._reason`).

Must pass (a verifier rejecting one is too strict): `calls reordered`, the reference's writes, each with the
reads before it, in reverse order, when every call still succeeds and the end state is the reference's up
to the ids of inserted rows; `free text written otherwise`, such a free-text value in another case, with
other spacing or end punctuation (where the tool stores it so), unless the instruction quotes it: quoted
text is to be written verbatim. The answer worded and formatted otherwise (12 h and 24 h times and ranges,
numbers in words, currencies, case) is agent/answer_variants.py's, judged in the verifiers stage.

A mutation is tried only where it makes an end state other than the reference's (and, for must-fail ones,
other than the untouched one); a task whose reference is not accepted is left to `Probe.REFERENCE_ACCEPTED`.
A failure's detail is the failing end state (its calls, answer and changes) and the verdict, for the
verifiers stage to repair.
"""

from __future__ import annotations

import ast
import json
import re
import sqlite3
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from worldsmith.bundle.codepolicy import parse_source
from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.results import DbDiff
from worldsmith.quality.concurrently import each_on_pool
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.quality.probes import SolutionReplay
from worldsmith.quality.text_values import is_free_text, quoted, text_variants
from worldsmith.quality.world_values import singular
from worldsmith.runtime.episode import Runtime, SandboxEpisode

Call = tuple[str, JsonObject]
#: How many other rows a wrong-entity or extra-side-effect mutation tries before giving up on a task.
TRIES = 12
_EXCERPT = 600


class Mutation(StrEnum):
    """An end state built from a reference solution, by what was changed."""

    HALF_DONE = "half done"
    WRONG_ENTITY = "wrong entity"
    EXTRA_SIDE_EFFECT = "extra side effect"
    OTHER_ANSWER = "answer of another task"
    REORDERED = "calls reordered"
    TEXT_VARIANT = "free text written otherwise"
    OTHER_TEXT = "another entity's text"

    @property
    def must_pass(self) -> bool:
        return self in (Mutation.REORDERED, Mutation.TEXT_VARIANT)

    @property
    def failure(self) -> ProbeFailure:
        """What a wrong verdict on this end state is."""
        return _FAILURE[self]


_FAILURE = {
    Mutation.HALF_DONE: ProbeFailure.HALF_DONE_ACCEPTED,
    Mutation.WRONG_ENTITY: ProbeFailure.WRONG_ENTITY_ACCEPTED,
    Mutation.EXTRA_SIDE_EFFECT: ProbeFailure.EXTRA_SIDE_EFFECT_ACCEPTED,
    Mutation.OTHER_ANSWER: ProbeFailure.OTHER_ANSWER_ACCEPTED,
    Mutation.REORDERED: ProbeFailure.REORDERED_REJECTED,
    Mutation.TEXT_VARIANT: ProbeFailure.TEXT_VARIANT_REJECTED,
    Mutation.OTHER_TEXT: ProbeFailure.OTHER_TEXT_ACCEPTED,
}


@dataclass(frozen=True)
class EndState:
    """A mutated end state: the calls that made it from the untouched world and the final answer."""

    mutation: Mutation
    calls: tuple[Call, ...]
    answer: str

    def shown(self, changes: DbDiff) -> str:
        """The end state in words, for a repair: its calls, its answer and the rows it changed."""
        calls = "; ".join(f"{tool}({json.dumps(args, sort_keys=True, default=str)})" for tool, args in self.calls)
        return f"calls: {calls or 'none'}; answer: {self.answer!r}; changes: {changed_rows(changes)}"


def changed_rows(changes: DbDiff) -> str:
    """The rows `changes` inserts, updates and deletes per table, cut to a readable length."""
    parts = []
    for table, rows in changes.tables.items():
        parts += [f"{table} inserted {json.dumps(r, sort_keys=True, default=str)}" for r in rows.inserted]
        for update in rows.updated:
            before, after = update.get("before") or {}, update.get("after") or {}
            moved = {c: after.get(c) for c in after if before.get(c) != after.get(c)}
            parts.append(f"{table} row {update.get('key')} set {json.dumps(moved, sort_keys=True, default=str)}")
        parts += [f"{table} deleted {json.dumps(r, sort_keys=True, default=str)}" for r in rows.deleted]
    text = "; ".join(parts) or "none"
    return text if len(text) <= _EXCERPT else text[: _EXCERPT - 3] + "..."


class SeedKeys:
    """The seed's values by column name (every row of every table), and each table's ids under the names
    an argument gives them (`id` of `appointments` is also `appointment_id`)."""

    def __init__(self, world: bytes):
        conn = sqlite3.connect(":memory:")
        conn.deserialize(world)
        self.values: dict[str, list[JsonValue]] = {}
        for table in self.tables(world):
            cursor = conn.execute(f'SELECT * FROM "{table}"')
            names = [d[0] for d in cursor.description]
            for row in cursor.fetchall():
                for name, value in zip(names, row):
                    if value is not None and not isinstance(value, bytes):
                        for key in [name] + ([f"{s}_id" for s in singulars(table)] if name == "id" else []):
                            column = self.values.setdefault(key, [])
                            if value not in column:
                                column.append(value)
        conn.close()

    @staticmethod
    def tables(world: bytes) -> list[str]:
        """The tables of `world`."""
        conn = sqlite3.connect(":memory:")
        conn.deserialize(world)
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        conn.close()
        return [n for n in names if not n.startswith("sqlite_")]

    def others(self, name: str, value: JsonValue) -> list[JsonValue]:
        """Other seed values of argument `name` than `value`, of its type (a row id for `x_id`, first the
        ids of a table named like x), in seed order; [] when `value` is not one of them."""
        known = self.values.get(name, [])
        if value not in known or isinstance(value, bool):
            return []
        return [v for v in known if v != value and type(v) is type(value)]


def singulars(table: str) -> list[str]:
    """What an argument calls one row of `table`: `availability_slots` gives `availability_slot` and `slot`."""
    one = singular(table)
    return list(dict.fromkeys([one, one.split("_")[-1]]))


def _replaced(calls: list[Call], name: str, old: JsonValue, new: JsonValue) -> list[Call]:
    return [(tool, {k: (new if k == name and v == old else v) for k, v in args.items()}) for tool, args in calls]


def _identifying(args: JsonObject) -> list[str]:
    """The arguments of a write that may name the row it acts on: ids first, then the others."""
    return sorted(args, key=lambda name: not (name == "id" or name.endswith("_id")))


def wrong_entities(calls: list[Call], writes: list[int], keys: SeedKeys) -> Iterator[list[Call]]:
    """The solution `calls` with the row a write (`writes`: their indices) acts on swapped for another
    seed row, everywhere the swapped value appears; the first write's arguments first."""
    for index in writes:
        args = calls[index][1]
        for name in _identifying(args):
            for other in keys.others(name, args[name])[:TRIES]:
                yield _replaced(calls, name, args[name], other)


def _said(text: str, value: JsonValue) -> bool:
    """Whether `text` names `value` (a number as a whole number, a string anywhere, case aside)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return False
    if isinstance(value, str):
        return value.lower() in text.lower()
    return re.search(rf"(?<![\d.]){re.escape(str(value))}(?!\d)", text) is not None


def other_answer(task: TaskSpec, tasks: Sequence[TaskSpec]) -> str | None:
    """The answer of another task least like `task`'s (fewest shared words and numbers); None when
    `task` expects no answer or every other answer says what it says."""
    if not task.answer:
        return None
    own = _tokens(task.answer)
    answers = [t.answer for t in tasks if t.id != task.id and t.answer and _tokens(t.answer) != own]
    candidates = [a for a in answers if not own <= _tokens(a)]
    return min(candidates, key=lambda a: (len(own & _tokens(a)), a), default=None)


def _tokens(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+|\d+", text.lower()))


def equivalent(a: DbDiff, b: DbDiff) -> bool:
    """Whether two diffs from the same world make the same changes up to the ids of inserted rows."""
    if set(a.tables) != set(b.tables):
        return False
    for name, rows in a.tables.items():
        other = b.tables[name]
        if _bag(rows.updated) != _bag(other.updated) or _bag(rows.deleted) != _bag(other.deleted):
            return False
        if _bag([{k: v for k, v in r.items() if k != "id"} for r in rows.inserted]) != _bag(
            [{k: v for k, v in r.items() if k != "id"} for r in other.inserted]
        ):
            return False
    return True


def _bag(rows: Sequence[object]) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in rows)


def verifier_text(bundle: Bundle, task: TaskSpec) -> str:
    """The source of `task`'s verifier function and of the module's functions it calls by name ("" when
    verifiers.py does not parse or lacks it)."""
    try:
        source = bundle.files["verifiers.py"].decode()
        functions = {n.name: n for n in parse_source(source, "verifiers.py").body if isinstance(n, ast.FunctionDef)}
    except (KeyError, SyntaxError, ValueError, UnicodeDecodeError):
        return ""
    verifier = functions.get(task.verifier)
    if verifier is None:
        return ""
    called = {n.func.id for n in ast.walk(verifier) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return "\n".join(
        ast.get_source_segment(source, functions[name]) or ""
        for name in [task.verifier, *called & set(functions) - {task.verifier}]
    )


class _TaskEpisode:
    """One episode of a task, replaying call lists from the untouched world and judging what they leave;
    `tables_read`: the tables its verifier's code names; `reference_diff`: what the reference solution
    changes (from the untouched world), once known."""

    def __init__(self, episode: SandboxEpisode, bundle: Bundle, task: TaskSpec):
        self.episode, self.bundle, self.task = episode, bundle, task
        text = verifier_text(bundle, task)
        self.tables_read = {t for t in SeedKeys.tables(bundle.world) if re.search(rf"\b{re.escape(t)}\b", text)}
        self.reference_diff = DbDiff()
        self._untouched = True  # nothing called since the episode opened on the untouched world

    def play(self, calls: list[Call], start: bytes | None = None) -> list[bool] | None:
        """Play `calls` from `start` (None: the untouched world); which changed the database, or None when
        one did not succeed."""
        if start is not None or not self._untouched:
            self.episode.restore(start)
        self._untouched = False
        changed = []
        for tool, args in calls:
            result = self.episode.call_tool(tool, args)
            if not result.ok:
                return None
            changed.append(result.changed)
        return changed

    def sees(self, changes: DbDiff) -> bool:
        """Whether `changes` touch a table the verifier reads (any table when its code names none)."""
        return not changes.empty and (not self.tables_read or bool(self.tables_read & set(changes.tables)))

    def judged(self, state: EndState, changes: DbDiff | None = None) -> ProbeResult | None:
        """The verdict on the current database (`changes`: its diff from the untouched world, when known) with
        `state.answer`, as a probe result; None when the current database is the reference's own (the same
        changes from the untouched world: the same rows) or, for a must-fail mutation of the calls, changes
        no table the verifier reads: nothing it can see was mutated."""
        changes = self.episode.diff(self.bundle.world) if changes is None else changes
        if changes == self.reference_diff and state.mutation is not Mutation.OTHER_ANSWER:
            return None
        calls_mutated = not state.mutation.must_pass and state.mutation is not Mutation.OTHER_ANSWER
        if calls_mutated and not self.sees(changes):
            return None  # nothing changed that the verifier reads (a row already so, a log line)
        verdict = self.episode.verify(state.answer)
        status = str(getattr(verdict.status, "value", verdict.status))
        right = (status == "complete") == state.mutation.must_pass
        probe = Probe.EQUIVALENT_END_STATE_ACCEPTED if state.mutation.must_pass else Probe.WRONG_END_STATE_REJECTED
        if right:
            return ProbeResult.passing(probe, self.task.id, f"{state.mutation}: {status}")
        said = f"verifier {self.task.verifier} judged {status} ({state.mutation}: must be "
        said += "complete" if state.mutation.must_pass else "rejected"
        evidence = json.dumps(verdict.evidence, sort_keys=True, default=str)[:300]
        detail = f"{said}); evidence {evidence}; the end state: {state.shown(changes)}"
        return ProbeResult.failing(state.mutation.failure, self.task.id, detail, cause=str(state.mutation))


def task_mutations(
    runtime: Runtime, bundle: Bundle, task: TaskSpec, keys: SeedKeys, replay: SolutionReplay | None = None
) -> list[ProbeResult]:
    """Every mutation of `task` that applies, judged ([] when its reference is not accepted). `replay`: the
    reference solution already run from the untouched world in an episode of this runtime (probe_tasks'
    first replay), whose end state and verdict serve here instead of running it again."""
    calls: list[Call] = [(step.tool, step.arguments) for step in task.solution]
    answer = task.answer or "Done."
    results: list[ProbeResult | None] = []
    with runtime.open_episode(bundle, task) as episode:
        run = _TaskEpisode(episode, bundle, task)
        reused = _reference(run, replay, answer)
        if reused is None:
            return []
        changed, reference = reused
        run.reference_diff = reference_diff = episode.diff(bundle.world, reference)
        writes = [i for i, did in enumerate(changed) if did]
        if len(writes) >= 2:
            cut = writes[len(writes) // 2]  # the reads and the first half of the writes
            half = EndState(Mutation.HALF_DONE, tuple(calls[:cut]), answer)
            results.append(run.judged(half) if run.play(calls[:cut]) is not None else None)
            results.append(_reordered(run, calls, writes, answer, reference_diff))
        results.append(_wrong_entity(run, calls, writes, answer, keys))
        results.append(_extra_insert(run, calls, writes, answer, reference, reference_diff, keys))
        results += _free_text(run, calls, writes, answer, keys)
        said = other_answer(task, bundle.tasks)
        if said is not None:
            run.play([], reference)
            if str(getattr(episode.verify("").status, "value", "")) != "complete":
                results.append(run.judged(EndState(Mutation.OTHER_ANSWER, tuple(calls), said), reference_diff))
    return [r for r in results if r is not None]


def _reference(run: _TaskEpisode, replay: SolutionReplay | None, answer: str) -> tuple[list[bool], bytes] | None:
    """Which of the reference's calls changed the database, and its end state, judged complete with `answer`:
    `replay`'s (judged again where it was judged with another answer), else played here. None when a call
    fails or the verifier does not judge it complete (`Probe.REFERENCE_ACCEPTED` reports it)."""
    if replay is not None:
        if replay.rejection is not None:
            return None
        changed, reference = [outcome.changed for outcome, _ in replay.steps], replay.final
        if replay.answer == answer:
            return changed, reference
        run.play([], reference)
    else:
        played = run.play([(step.tool, step.arguments) for step in run.task.solution])
        if played is None:
            return None
        changed, reference = played, run.episode.snapshot()
    return (changed, reference) if str(getattr(run.episode.verify(answer).status, "value", "")) == "complete" else None


def _wrong_entity(
    run: _TaskEpisode, calls: list[Call], writes: list[int], answer: str, keys: SeedKeys
) -> ProbeResult | None:
    for tries, mutated in enumerate(wrong_entities(calls, writes, keys)):
        if tries >= TRIES:
            break
        if run.play(mutated) is not None:
            judged = run.judged(EndState(Mutation.WRONG_ENTITY, tuple(mutated), answer))
            if judged is not None:
                return judged
    return None


def _extra_insert(
    run: _TaskEpisode,
    calls: list[Call],
    writes: list[int],
    answer: str,
    reference: bytes,
    reference_diff: DbDiff,
    keys: SeedKeys,
) -> ProbeResult | None:
    """The reference plus one of its inserting writes once more: as it was (a duplicate), else for another
    row (another slot booked by the same call)."""
    creating = {t for t, rows in reference_diff.tables.items() if rows.inserted and t in run.tables_read}
    if not creating:
        return None
    for index in reversed(writes):
        tool, args = calls[index]
        free = [n for n in _identifying(args) if not _said(run.task.instruction, args[n])]  # the task's own stay
        extras = [_replaced([(tool, args)], n, args[n], o)[0] for n in free for o in keys.others(n, args[n])]
        renamed = {k: f"{v} 2" if isinstance(v, str) and re.search("[A-Za-z]", v) else v for k, v in args.items()}
        for extra in [(tool, args), *extras[:TRIES], (tool, renamed)]:  # renamed: past a unique name
            if run.play([extra], reference) is None:
                continue
            added = run.episode.diff(reference)
            if any(added.tables.get(t) is not None and added.tables[t].inserted for t in creating):
                return run.judged(EndState(Mutation.EXTRA_SIDE_EFFECT, (*calls, extra), answer))
    return None


def _free_text(
    run: _TaskEpisode, calls: list[Call], writes: list[int], answer: str, keys: SeedKeys
) -> list[ProbeResult | None]:
    """The free-text values the instruction names, in the reference's writes, written otherwise (must pass)
    and swapped for another seed row's text of the column (must fail): the first wrong verdict of each kind,
    else the first verdict."""
    texts = [
        (name, value)
        for index in writes
        for name, value in calls[index][1].items()
        if is_free_text(value) and _said(run.task.instruction, value)
    ]
    found: dict[Mutation, ProbeResult] = {}

    def judge(mutation: Mutation, mutated: list[Call]) -> None:
        if not (mutation in found and not found[mutation].passed) and run.play(mutated) is not None:
            judged = run.judged(EndState(mutation, tuple(mutated), answer))
            if judged is not None and (mutation not in found or not judged.passed):
                found[mutation] = judged

    for name, value in texts:
        assert isinstance(value, str)
        for variant in [] if quoted(run.task.instruction, value) else text_variants(value):
            judge(Mutation.TEXT_VARIANT, _replaced(calls, name, value, variant))
        held = keys.values.get(name) or [v for c, vs in keys.values.items() if c.endswith(f"_{name}") for v in vs]
        others = [
            v for v in held if isinstance(v, str) and v.strip() and v != value and not _said(run.task.instruction, v)
        ]
        others = sorted(others, key=lambda v: not is_free_text(v))[:4]  # free text first, then any text
        for other in others + [f"{o} 2" for o in others[:2]]:  # renamed: past a unique name
            judge(Mutation.OTHER_TEXT, _replaced(calls, name, value, other))
    return list(found.values())


def _reordered(
    run: _TaskEpisode, calls: list[Call], writes: list[int], answer: str, reference_diff: DbDiff
) -> ProbeResult | None:
    """The writes (each with the reads before it) in reverse order, judged when they commute."""
    starts = [0] + [w + 1 for w in writes[:-1]]
    groups = [calls[start : w + 1] for start, w in zip(starts, writes)]
    reordered = [call for group in reversed(groups) for call in group] + calls[writes[-1] + 1 :]
    if reordered == calls or run.play(reordered) is None:
        return None
    changes = run.episode.diff(run.bundle.world)
    if not equivalent(reference_diff, changes):
        return None  # the writes do not commute
    return run.judged(EndState(Mutation.REORDERED, tuple(reordered), answer), changes)


def verifier_mutations(
    runtime: Runtime, bundle: Bundle, replays: Mapping[str, SolutionReplay] | None = None
) -> list[ProbeResult]:
    """Every task's verifier judged on its mutated end states (tasks with a reference solution; several at
    once on the runtime's pool), and the row ids its code names that only this seed has
    (quality/verifier_ids.py). `replays`: reference solutions already run, by task id (`task_probes`). [] for
    verifiers a release brought (an imported world's: written to the release's conventions, such as the acting
    user being row 1, and never repaired by the verifiers stage)."""
    from worldsmith.quality.verifier_ids import seed_id_results  # the static half: no runtime

    if bundle.verifiers_kind.name is not None:
        return []

    keys = SeedKeys(bundle.world)
    replays = replays or {}
    tasks = [task for task in bundle.tasks if task.solution]
    mutated = each_on_pool(
        runtime, tasks, lambda task: task_mutations(runtime, bundle, task, keys, replays.get(task.id))
    )
    return seed_id_results(bundle) + [result for results in mutated for result in results]
