"""Hostile worlds at the seams of the sandbox (issue 19): bundle SQL run by the trusted process,
transaction control from tool SQL, valid annotations refused, oversized errors, evidence, frames
and stderr. Each attack asserts containment: a clean error naming what was hit, other episodes
unchanged, the parent's memory bounded, a misbehaving worker replaced."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from support.bundles import with_tools
from support.limits import FAST_LIMITS, ISOLATIONS, PATIENT_LIMITS, code_process, file_area, isolated
from support.paths import REPO
from support.patience import MOMENTS_S, PROCESS_S, wait_until
from support.processes import kill_worker

from worldsmith.bundle import sqlscript
from worldsmith.bundle.contract import Bundle, artifact_digest
from worldsmith.bundle.errors import BundleError
from worldsmith.bundle.loader import build_bundle
from worldsmith.quality.probes import check_environment
from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.errors import WorkerLost
from worldsmith.runtime.sandbox import kernel
from worldsmith.runtime.sandbox.protocol import FrameReader, ProtocolViolation, send_within, truncated
from worldsmith.runtime.worker_launch import WORKER_ENV, StderrTail

pytestmark = pytest.mark.sandbox

ENDLESS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r)"
#: rows of ~1 MB that UNION must all keep to deduplicate: memory grows as fast as SQLite can copy
BLOATING = (
    "WITH RECURSIVE r(n, b) AS (SELECT 1, zeroblob(1000000) "
    "UNION SELECT n + 1, zeroblob(999990) || n FROM r) SELECT count(*) FROM r"
)


def _resident() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _sources(golden: Bundle, **extra: str) -> dict[str, bytes]:
    names = ("schema.sql", "seed.sql", "tools.py", "verifiers.py", "tasks.jsonl")
    sources = {name: golden.files[name] for name in names}
    for name, text in extra.items():
        sources[name.replace("_", ".")] = sources[name.replace("_", ".")] + text.encode()
    return sources


def _manifest(golden: Bundle) -> dict:
    return {"env_id": golden.env_id, "scenario": golden.manifest.scenario.model_dump()}


@pytest.fixture()
def tight_budget(monkeypatch: pytest.MonkeyPatch) -> sqlscript.SqlBudget:
    budget = sqlscript.SqlBudget(statement_s=1.0, total_s=3.0, memory_bytes=128 * 1024 * 1024)
    monkeypatch.setattr(sqlscript, "BUILD_BUDGET", budget)
    return budget


# -- class 7: bundle SQL in the trusted process is bounded -----------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    "extra",
    [
        {"seed_sql": f"\nINSERT INTO store_settings (key, value) {ENDLESS} SELECT 'k' || n, n FROM r;\n"},
        {
            "schema_sql": f"\nCREATE TABLE hostile (x);\nCREATE TRIGGER spin AFTER INSERT ON hostile BEGIN\n"
            f"  INSERT INTO hostile {ENDLESS} SELECT count(*) FROM r;\nEND;\n",
            "seed_sql": "\nINSERT INTO hostile VALUES (1);\n",
        },
        {
            "seed_sql": "\nINSERT INTO store_settings (key, value) "
            f"{BLOATING.replace('SELECT count(*) FROM r', 'SELECT n, b FROM r')};\n"
        },
    ],
    ids=["endless_cte_in_seed", "endless_trigger_from_schema", "bloating_union_in_seed"],
)
def test_hostile_bundle_sql_is_a_clean_build_error_naming_the_statement(golden, tight_budget, extra):
    sources = _sources(golden, **extra)
    last_line = sources["seed.sql"].decode().rstrip("\n").count("\n") + 1
    before = _resident()
    with pytest.raises(BundleError) as caught:  # endless: only the budget ends it
        build_bundle(sources, _manifest(golden))
    assert _resident() - before < tight_budget.memory_bytes + 256 * 1024 * 1024
    [issue] = [i for i in caught.value.issues if "budget" in i.problem]
    assert issue.file == "seed.sql" and issue.line == last_line, issue
    assert issue.statement and issue.statement.startswith("INSERT INTO")


@pytest.mark.unit
def test_memory_bound_stops_a_statement_before_its_time_bound():
    budget = sqlscript.SqlBudget(statement_s=30.0, total_s=30.0, memory_bytes=64 * 1024 * 1024)
    world, faults = sqlscript.build_world("CREATE TABLE t (x);", f"INSERT INTO t {BLOATING};", budget=budget)
    assert world is None
    assert "memory budget" in faults[0].problem and faults[0].line == 1  # not the time budget: stopped before it


@pytest.mark.unit
def test_schema_check_is_bounded_too():
    budget = sqlscript.SqlBudget(statement_s=0.5, total_s=2.0)
    schema = f"CREATE TABLE t AS {ENDLESS} SELECT n FROM r;"
    faults = sqlscript.check_schema(schema, budget=budget)
    assert faults and "time budget" in faults[0].problem and faults[0].file == "schema.sql"


class _WorkClock:
    """A build's clock that advances one tick each time it is read (the budget meter reads it once
    per `check_every` SQLite instructions): time measured in work, the same on any machine."""

    def __init__(self, tick_s: float):
        self.now, self.tick_s = 0.0, tick_s

    def monotonic(self) -> float:
        self.now += self.tick_s
        return self.now


@pytest.mark.unit
def test_total_budget_stops_many_slow_statements(monkeypatch):
    """Statements each well within their own budget, together past the build's: the build stops there."""
    monkeypatch.setattr(sqlscript, "time", _WorkClock(tick_s=0.01))  # the build's budget: 100 clock reads
    budget = sqlscript.SqlBudget(statement_s=30.0, total_s=1.0)
    slow = (
        "INSERT INTO t WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 300) SELECT n FROM r;\n"
    )
    statements = 200
    _, faults = sqlscript.build_world("CREATE TABLE t (x);", slow * statements, budget=budget)
    [fault] = faults
    assert "time budget of 1 s" in fault.problem and "statement's" not in fault.problem, fault
    assert fault.line is not None and fault.line < statements  # stopped before the last statement ran


@pytest.mark.unit
def test_normal_worlds_build_identically_within_the_default_budget(golden):
    world, faults = sqlscript.build_world(golden.text("schema.sql"), golden.text("seed.sql"))
    assert faults == [] and world == golden.world


# -- sandbox fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    rt = Runtime(limits=FAST_LIMITS, workers=1)
    yield rt
    rt.close()


def _email(episode, customer_id: int = 1) -> str:
    return episode.call_tool("get_customer", {"customer_id": customer_id}).value["email"]


# -- class 1: shared module state ------------------------------------------------------------------

#: Environment B's witness: what allowed modules and the guard's builtins answer, read by a tool.
PROBE = textwrap.dedent("""
    import collections
    import decimal
    import json
    import random
    import sqlite3


    def probe(conn):
        random.seed(1)
        row = conn.execute("SELECT email FROM customers WHERE id = 1").fetchone()
        return {"dumps": json.dumps({"a": [1, 2]}), "random": random.random(), "len": len([1, 2, 3]),
                "decimal": str(decimal.Context().divide(decimal.Decimal(1), decimal.Decimal(7))),
                "row": isinstance(row, sqlite3.Row), "email": row["email"],
                "counter": collections.Counter("abb").most_common(1)}
""")
COMPLETE = repr('{"status": "complete", "evidence": {}}')
#: Tools of environment A that rebind what every later call of their worker shares; the name reported.
TAMPERING = {
    "json_dumps": (f"import json\n\n\ndef tamper(conn):\n    json.dumps = lambda *a, **k: {COMPLETE}\n", "json.dumps"),
    "random_seed": (
        "import random\n\n\ndef tamper(conn):\n    random.seed = lambda *a, **k: None\n    random.random = lambda: 0.0\n",
        "random.seed",
    ),
    "decimal_precision": (
        "import decimal\n\n\ndef tamper(conn):\n    decimal.DefaultContext.prec = 2\n",
        "decimal.DefaultContext",
    ),
    "guard_builtin": ("def tamper(conn):\n    __builtins__['len'] = lambda value: 0\n", "builtins.len"),
    "sqlite3_row": ("import sqlite3\n\n\ndef tamper(conn):\n    sqlite3.Row = tuple\n", "sqlite3.Row"),
    "world_clock": (
        "import datetime\n\n\ndef tamper(conn):\n    datetime.datetime.now = lambda *a: None\n",
        "datetime.datetime.now",
    ),
}


def _judged(episode) -> tuple:
    """What an untouched episode of the witness environment answers: its probe and its verdict."""
    return episode.call_tool("probe").value, episode.verify("").model_dump()


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("attack", TAMPERING, ids=TAMPERING)
def test_module_state_rebound_by_one_world_reaches_no_other_episode(golden, attack, isolation):
    source, name = TAMPERING[attack]
    culprit_env = with_tools(golden, source, ["tamper"])
    witness_env = with_tools(golden, PROBE, ["probe"])
    task = golden.tasks[0].id
    with Runtime(limits=isolated(FAST_LIMITS, isolation), workers=1) as rt:
        with rt.open_episode(witness_env, task) as witness:
            before = _judged(witness)
        with (
            rt.open_episode(witness_env, task) as other_world,
            rt.open_episode(culprit_env, task) as same_world,
            rt.open_episode(culprit_env, task) as culprit,
        ):
            assert same_world.call_tool("update_customer_email", {"customer_id": 2, "email": "b@example.com"}).ok
            assert other_world._worker is not culprit._worker  # one world's code never runs in another's worker
            assert _email(culprit) and (tampering_process := code_process(culprit))
            result = culprit.call_tool("tamper")
            assert result.status == "env_error" and result.limit == "module_state", result
            assert "modified module state" in result.error and name in result.error, result.error
            assert code_process(culprit) != tampering_process  # retired: it never runs another call
            assert _judged(other_world) == before
            # environment A goes on: its other episode kept its writes (fast: moved to a fresh worker by
            # replay; strict: its own process never met the tampering), a new one is judged as before
            assert _email(same_world, 2) == "b@example.com"
            assert same_world.relocations == (1 if isolation == "fast" else 0)
            with rt.open_episode(culprit_env, task) as fresh:
                assert fresh.verify("").model_dump() == before[1]
            assert culprit.call_tool("get_customer", {"customer_id": 1}).ok


def test_state_the_fingerprint_cannot_see_stays_in_its_own_world(golden):
    """A class attribute of an allowed module is not in the fingerprint (docs/security.md): a world that
    rebinds one changes only its own worker, never another world's episodes."""
    source = (
        "import collections\n\n\ndef tamper(conn):\n"
        "    collections.Counter.most_common = lambda self, n=None: [('forged', 99)]\n"
        "    return collections.Counter('x').most_common(1)\n"
    )
    culprit_env = with_tools(golden, source, ["tamper"])
    witness_env = with_tools(golden, PROBE, ["probe"])
    task = golden.tasks[0].id
    with Runtime(limits=FAST_LIMITS, workers=1) as rt:
        with rt.open_episode(witness_env, task) as witness:
            before = _judged(witness)
            assert before[0]["counter"] == [["b", 2]]
            with rt.open_episode(culprit_env, task) as culprit:
                assert culprit.call_tool("tamper").value == [["forged", 99]]  # its own world is its business
                assert culprit._worker is not witness._worker
                assert _judged(witness) == before
        assert len(rt.pool.workers()) == 1  # the overflow worker went with its last episode


def test_workers_are_bound_to_one_environment_within_the_pool_size(golden):
    envs = [with_tools(golden, f"def marker_{i}(conn):\n    return {i}\n", [f"marker_{i}"]) for i in range(3)]
    with Runtime(limits=FAST_LIMITS, workers=2) as rt:
        seen: dict[str, set[str]] = {}
        for env in envs * 2:
            with rt.open_episode(env) as episode:
                assert episode.call_tool(env.tools[-1].name).ok
                seen.setdefault(episode._worker.name, set()).add(env.runtime_key)
            assert len(rt.pool.workers()) <= 2
        assert all(len(keys) == 1 for keys in seen.values()), seen
        # two episodes of one environment spread over the free slots
        first, second = rt.open_episode(envs[0]), rt.open_episode(envs[0])
        assert first._worker is not second._worker
        first.close()
        second.close()


RANDOM_TOOLS = textwrap.dedent("""
    import decimal
    import random


    def set_state(conn):
        random.seed(42)
        decimal.getcontext().prec = 3


    def draw(conn):
        return {"random": random.random(), "seventh": str(decimal.Decimal(1) / decimal.Decimal(7))}


    def save_draw(conn):
        conn.execute("INSERT INTO store_settings (key, value) VALUES ('lucky', ?)", (str(random.random()),))


    def saved(conn):
        return conn.execute("SELECT value FROM store_settings WHERE key = 'lucky'").fetchone()[0]
""")


@pytest.fixture(scope="module")
def random_tools(golden: Bundle) -> Bundle:
    return with_tools(golden, RANDOM_TOOLS, ["set_state", "draw", "save_draw", "saved"])


def test_no_call_inherits_the_random_seed_or_decimal_context_another_set(runtime, random_tools):
    import random

    with runtime.open_episode(random_tools) as episode, runtime.open_episode(random_tools) as other:
        assert episode.call_tool("set_state").ok
        drawn = [episode.call_tool("draw").value, other.call_tool("draw").value, episode.call_tool("draw").value]
        assert all(d["random"] != random.Random(42).random() for d in drawn), drawn
        assert all(d["seventh"] == "0.1428571428571428571428571429" for d in drawn), drawn
        assert len({d["random"] for d in drawn}) == 3  # each call its own seed


def test_a_write_drawn_from_random_replays_exactly_on_a_fresh_worker(runtime, random_tools):
    """The seed of each call is journaled: replayed after the worker is lost, the write is the same."""
    with runtime.open_episode(random_tools) as episode:
        assert episode.call_tool("save_draw").ok
        value = episode.call_tool("saved").value
        kill_worker(episode._worker.process)
        assert episode.call_tool("saved").value == value and episode.relocations == 1


# -- class 8: transaction control from tool SQL ---------------------------------------------------

TRANSACTION_CONTROL = [
    "RELEASE ws_call",
    "ROLLBACK",
    "COMMIT",
    "END",
    "BEGIN",
    "SAVEPOINT mine",
    "ROLLBACK TO ws_call",
    "RELEASE SAVEPOINT ws_call",
]


@pytest.mark.parametrize("swallow", [False, True], ids=["raised", "swallowed"])
def test_transaction_control_from_tool_sql_is_refused_leaving_no_write_behind(runtime, golden, swallow):
    statements = json.dumps(TRANSACTION_CONTROL)
    source = textwrap.dedent(f"""
        def tx_escape(conn):
            conn.execute("UPDATE customers SET email = 'escaped@example.com' WHERE id = 1")
            for statement in {statements}:
                try:
                    conn.execute(statement)
                except Exception:
                    if not {swallow}:
                        raise
            raise ValueError("fail after the writes")
    """)
    bundle = with_tools(golden, source, ["tx_escape"])
    with runtime.open_episode(bundle) as bystander, runtime.open_episode(bundle) as culprit:
        assert bystander.call_tool("update_customer_email", {"customer_id": 2, "email": "b@example.com"}).ok
        result = culprit.call_tool("tx_escape")
        assert result.status == "env_error" and result.limit == "database", result
        assert "transaction control" in result.error
        assert _email(culprit) != "escaped@example.com"
        assert _email(bystander, 2) == "b@example.com"


def test_a_tools_rollback_then_commit_keeps_only_the_later_write(runtime, golden):
    source = textwrap.dedent("""
        def undo_then_write(conn):
            conn.execute("UPDATE customers SET email = 'undone@example.com' WHERE id = 1")
            conn.rollback()
            conn.execute("UPDATE customers SET email = 'kept@example.com' WHERE id = 2")
            conn.commit()
            return "ok"
    """)
    bundle = with_tools(golden, source, ["undo_then_write"])
    with runtime.open_episode(bundle) as episode:
        before = _email(episode)
        assert episode.call_tool("undo_then_write").ok
        assert _email(episode) == before and _email(episode, 2) == "kept@example.com"


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_sqlite3_context_manager_in_a_tool_is_the_runtimes_to_handle(golden, isolation):
    """`with db:` sends COMMIT on leaving (ROLLBACK on an exception): the runtime's commit and
    rollback instead, so a world written that way works; explicit transaction SQL stays refused."""
    source = textwrap.dedent("""
        def with_write(conn, email):
            with conn:
                conn.execute("UPDATE customers SET email = ? WHERE id = 1", (email,))
            return "ok"

        def with_failure(conn):
            conn.execute("UPDATE customers SET email = 'before@example.com' WHERE id = 2")
            try:
                with conn:
                    conn.execute("UPDATE customers SET email = 'inside@example.com' WHERE id = 1")
                    raise ValueError("undo")
            except ValueError:
                pass
            conn.execute("UPDATE customers SET email = 'after@example.com' WHERE id = 3")
            return "ok"

        def explicit_commit(conn):
            conn.execute("UPDATE customers SET email = 'explicit@example.com' WHERE id = 1")
            conn.execute("COMMIT")
    """)
    bundle = with_tools(golden, source, ["with_write", "with_failure", "explicit_commit"])
    with Runtime(limits=isolated(PATIENT_LIMITS, isolation), workers=1) as rt, rt.open_episode(bundle) as episode:
        before = {i: _email(episode, i) for i in (1, 2)}
        assert episode.call_tool("with_write", {"email": "with@example.com"}).ok
        assert episode.call_tool("with_write", {"email": "again@example.com"}).ok  # the savepoint survived
        assert _email(episode) == "again@example.com"
        assert episode.call_tool("with_failure").ok
        assert _email(episode) == "again@example.com" and _email(episode, 2) == before[2]
        assert _email(episode, 3) == "after@example.com"
        result = episode.call_tool("explicit_commit")
        assert result.status == "env_error" and "transaction control" in result.error, result


# -- class 10: a valid world refused -------------------------------------------------------------


def test_tools_annotated_with_sqlite3_types_see_real_sqlite3_objects(runtime, golden):
    source = textwrap.dedent('''
        import sqlite3


        def typed_lookup(db: sqlite3.Connection, customer_id: int) -> dict:
            """Look up a customer through annotated sqlite3 types.

            Args:
                customer_id: the customer's id.
            """
            cursor: sqlite3.Cursor = db.execute("SELECT email FROM customers WHERE id = ?", (customer_id,))
            row = cursor.fetchone()
            return {"connection": isinstance(db, sqlite3.Connection), "cursor": isinstance(cursor, sqlite3.Cursor),
                    "row": isinstance(row, sqlite3.Row), "not_a_cursor": isinstance(db, sqlite3.Cursor),
                    "email": row["email"]}
    ''')
    bundle = build_bundle(_sources(golden, tools_py=source), _manifest(golden))  # the loader's static checks pass
    with runtime.open_episode(bundle) as episode:
        result = episode.call_tool("typed_lookup", {"customer_id": 1})
    assert result.ok, result
    assert result.value == {
        "connection": True,
        "cursor": True,
        "row": True,
        "not_a_cursor": False,
        "email": _email_of(golden, 1),
    }


def _email_of(golden: Bundle, customer_id: int) -> str:
    import sqlite3

    conn = sqlite3.connect(":memory:")
    conn.deserialize(golden.world)
    try:
        return conn.execute("SELECT email FROM customers WHERE id = ?", (customer_id,)).fetchone()[0]
    finally:
        conn.close()


@pytest.mark.parametrize(
    "attempt",
    [
        "sqlite3.Connection(':memory:')",
        "sqlite3.Cursor(conn)",
        "type('Mine', (sqlite3.Connection,), {})(':memory:')",
    ],
    ids=["connection", "cursor", "subclass"],
)
def test_the_sqlite3_types_open_no_database(runtime, golden, attempt):
    source = f"import sqlite3\n\n\ndef open_other(conn):\n    return str({attempt})\n"
    bundle = with_tools(golden, source, ["open_other"])
    with runtime.open_episode(bundle) as episode:
        result = episode.call_tool("open_other")
    assert result.status == "env_error" and result.limit == "database", result


@pytest.mark.parametrize(
    "module_code",
    ["raise RuntimeError('broken at import')", "import socket", "x = [0] * (10 ** 10)"],
    ids=["raises", "refused_import", "memory"],
)
def test_a_tool_module_that_fails_to_import_is_a_failed_probe(runtime, golden, module_code):
    bundle = with_tools(golden, module_code + "\n", [])
    results = check_environment(runtime, bundle)
    [load] = [r for r in results if r.probe == "tools load"]
    assert not load.passed and load.detail
    assert all(not r.passed for r in results)


# -- class 4: oversized errors, results and evidence ---------------------------------------------


def test_a_huge_tool_error_is_truncated_without_retiring_the_worker(runtime, golden):
    source = "def loud_refusal(conn):\n    raise ToolError('x' * 70_000_000)\n"
    bundle = with_tools(golden, source, ["loud_refusal"])
    with runtime.open_episode(bundle) as bystander, runtime.open_episode(bundle) as culprit:
        assert bystander.call_tool("update_customer_email", {"customer_id": 2, "email": "b@example.com"}).ok
        pid = runtime.pool.workers()[0].pid
        result = culprit.call_tool("loud_refusal")
        assert result.status == "tool_error"
        assert len(result.error) < 100_000 and "[truncated 69" in result.error
        assert _email(bystander, 2) == "b@example.com" and runtime.pool.workers()[0].pid == pid


def test_huge_env_error_is_truncated(runtime, golden):
    source = "def loud_fault(conn):\n    raise ValueError('y' * 30_000_000)\n"
    bundle = with_tools(golden, source, ["loud_fault"])
    with runtime.open_episode(bundle) as episode:
        result = episode.call_tool("loud_fault")
    assert result.status == "env_error" and len(result.error) < 100_000 and "truncated" in result.error


def _with_verifiers(bundle: Bundle, source: str) -> Bundle:
    files = dict(bundle.files)
    files["verifiers.py"] = bundle.files["verifiers.py"] + b"\n\n" + source.encode()
    artifacts = dict(bundle.manifest.artifacts, **{"verifiers.py": artifact_digest(files["verifiers.py"])})
    return Bundle(
        manifest=bundle.manifest.model_copy(update={"artifacts": artifacts}),
        files=files,
        tasks=bundle.tasks,
        tools=bundle.tools,
    )


def test_huge_verifier_evidence_is_truncated(runtime, golden):
    task = golden.tasks[0]
    source = (
        f"def {task.verifier}(initial, final, answer):\n"
        "    return {'status': 'incomplete', 'evidence': {'dump': 'z' * 70_000_000}}\n"
    )
    bundle = _with_verifiers(golden, source)
    with runtime.open_episode(bundle, task.id) as episode:
        verdict = episode.verify("")
    assert verdict.status == "incomplete", verdict
    text = json.dumps(verdict.evidence)
    assert len(text) < 2 * 1024 * 1024 and "truncated" in text


@pytest.mark.unit
def test_truncated_marks_what_was_cut():
    assert truncated("abc", 5) == "abc"
    assert truncated("a" * 10, 4) == "aaaa...[truncated 6 characters]"


# -- class 3 (parent side): forged frames ---------------------------------------------------------


def _forged(header: dict, declared_length: int | None = None) -> bytes:
    data = json.dumps(header).encode()
    return struct.pack(">I", declared_length if declared_length is not None else len(data)) + data


@pytest.mark.unit
@pytest.mark.parametrize(
    "frame",
    [
        _forged({"status": "ok", "blobs": [2**62]}),
        _forged({"status": "ok", "blobs": [2**31] * 8}),
        _forged({"status": "ok", "blobs": "many"}),
        _forged({"status": "ok"}, declared_length=2**32 - 1),
        struct.pack(">I", 5) + b"{{{{{",
    ],
    ids=["huge_blob", "many_blobs", "bad_sizes", "huge_header", "not_json"],
)
def test_forged_frames_are_refused_before_allocating(frame):
    read, write = os.pipe()
    try:
        os.write(write, frame)
        with pytest.raises(ProtocolViolation):
            FrameReader(read, max_blobs=1 << 30).read()  # the whole frame is in the pipe: no deadline
    finally:
        os.close(read)
        os.close(write)


def test_a_worker_sending_a_forged_frame_is_killed_failing_the_call_as_a_protocol_env_error(runtime, golden):
    with runtime.open_episode(golden) as bystander, runtime.open_episode(golden) as culprit:
        assert bystander.call_tool("update_customer_email", {"customer_id": 2, "email": "b@example.com"}).ok
        culprit.reset()  # no process of its own now (nor a spare's): its next call is answered by the worker
        worker = runtime.pool.workers()[0]
        read, write = os.pipe()
        os.write(write, _forged({"status": "ok", "blobs": [2**62]}))  # what the worker's channel now carries
        worker._reader = FrameReader(read, max_blobs=FAST_LIMITS.memory_mb * 1024 * 1024)
        before = _resident()
        try:
            result = culprit.call_tool("get_customer", {"customer_id": 1})
        finally:
            os.close(read)
            os.close(write)
        assert result.status == "env_error" and result.limit == "protocol", result
        assert "invalid reply" in result.error
        assert _resident() - before < 64 * 1024 * 1024
        assert not worker.alive and worker.process.poll() is not None
        # the bystander moves to a fresh worker with its state; the culprit's episode goes on too
        assert _email(bystander, 2) == "b@example.com"
        assert culprit.call_tool("get_customer", {"customer_id": 1}).ok
        assert runtime.pool.workers()[0] is not worker


def test_request_raises_worker_lost_on_a_forged_frame(runtime, golden):
    with runtime.open_episode(golden):
        worker = runtime.pool.workers()[0]
    read, write = os.pipe()
    os.write(write, _forged({"status": "ok"}, declared_length=2**31))
    worker._reader = FrameReader(read)
    try:
        with pytest.raises(WorkerLost) as lost:
            worker.request({"op": "ping"}, timeout=MOMENTS_S)
    finally:
        os.close(read)
        os.close(write)
    assert lost.value.limit == "protocol" and not worker.alive


# -- class 5: stderr flood ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flood",
    [
        "sys.stderr.buffer.write(b'x' * (300 * 1024 * 1024))",
        "line = b'y' * 1000 + b'\\n'\nfor _ in range(300 * 1024):\n    sys.stderr.buffer.write(line)",
    ],
    ids=["one_line", "many_lines"],
)
def test_a_stderr_flood_does_not_grow_the_parent(flood):
    script = f"import sys\n{flood}\nsys.stderr.buffer.write(b'\\nlast words\\n')"
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    tail = StderrTail()
    before = _resident()
    assert process.stderr is not None
    tail.drain(process.stderr.fileno())  # to the end of its stderr: it is exiting
    process.wait()
    assert _resident() - before < 32 * 1024 * 1024
    assert tail.tail(1) == "last words"
    assert all(len(line) < 3000 for line in tail.tail(40).split(" | "))


@pytest.mark.unit
def test_stderr_tail_marks_cut_lines():
    tail = StderrTail(lines=3, line_chars=4)
    for piece in (b"abcdef", b"gh\nshort\n", b"a\nb\nc"):
        tail.feed(piece)
    tail.feed(b"\n")
    assert tail.tail(5) == "a | b | c"
    tail = StderrTail(lines=3, line_chars=4)
    tail.feed(b"abcdefgh\n")
    assert tail.tail() == "abcd...[truncated 4 bytes]"


# -- class 6: SysV IPC and POSIX message queues ---------------------------------------------------

#: Confines itself with kernel.py (all layers, or only one), then makes SysV shared memory, a message
#: queue, a semaphore set and a POSIX message queue through libc, as code past the Python guard would.
IPC_PROBE = r"""
import ctypes, errno, json, os, sys
sys.path.insert(0, sys.argv[2])
from worldsmith.runtime.sandbox import kernel
mode, key, queue = sys.argv[1], int(sys.argv[3]), sys.argv[4].encode()
if mode == "all":
    layers = kernel.confine(uid=65534, memory_bytes=1 << 30, file_bytes=1 << 20, cpu_seconds=60,
                            read_paths=[], write_paths=[])
elif mode == "ipcns":
    kernel.new_ipc_namespace()
    layers = {"ipcns": "on"}
else:
    kernel.no_new_privs()
    layers = {"seccomp": f"on ({kernel.seccomp()} syscalls denied)"}
libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT, IPC_EXCL = 0o1000, 0o2000
out = {"layers": layers}
def attempt(name, call):
    result = call()
    out[name] = "made" if result >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
attempt("shmget", lambda: libc.shmget(key, 1 << 20, IPC_CREAT | IPC_EXCL | 0o666))
attempt("msgget", lambda: libc.msgget(key, IPC_CREAT | IPC_EXCL | 0o666))
attempt("semget", lambda: libc.semget(key, 1, IPC_CREAT | IPC_EXCL | 0o666))
attempt("mq_open", lambda: libc.mq_open(queue, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666, None))
print(json.dumps(out))
"""


def _host_ipc(cuid: int = 65534) -> dict[str, list[tuple[str, str]]]:
    """The SysV IPC objects of this (the host's) IPC namespace that user `cuid` (the confined probe's)
    created, as (key, id): what other processes of the machine make or touch meanwhile (a test's
    PostgreSQL server, say, attaching its segments) is not the probe's doing."""
    objects = {}
    for kind in ("shm", "msg", "sem"):
        header, *rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        creator = header.split().index("cuid")
        objects[kind] = [(row.split()[0], row.split()[1]) for row in rows if int(row.split()[creator]) == cuid]
    return objects


def _host_has(key: int, queue: bytes) -> list[str]:
    """Which of the probe's objects exist in this IPC namespace (and remove them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    found = []
    if (shm := libc.shmget(key, 0, 0)) >= 0:
        found.append("shm")
        libc.shmctl(shm, 0, None)  # IPC_RMID
    if (msg := libc.msgget(key, 0)) >= 0:
        found.append("msg")
        libc.msgctl(msg, 0, None)
    if (sem := libc.semget(key, 0, 0)) >= 0:
        found.append("sem")
        libc.semctl(sem, 0, 0)
    if (mq := libc.mq_open(queue, os.O_RDONLY)) >= 0:
        found.append("mq")
        os.close(mq)
        libc.mq_unlink(queue)
    return found


@pytest.mark.skipif(not Path("/proc/sysvipc/shm").exists(), reason="no /proc/sysvipc")
@pytest.mark.parametrize("mode", ["all", "ipcns", "seccomp"])
def test_ipc_objects_of_a_worker_are_refused_or_die_with_it(mode):
    """Each kernel layer on its own, and all together, keeps IPC objects from reaching the host."""
    key, queue = 0x57530000 + os.getpid() % 0xFFFF, f"/worldsmith-probe-{os.getpid()}"
    before = _host_ipc()
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", IPC_PROBE, mode, str(REPO), str(key), queue],
        capture_output=True,
        text=True,
        env=WORKER_ENV,
        timeout=PROCESS_S,
    )
    leaked = _host_has(key, queue.encode())
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    layer = {"all": "seccomp", "ipcns": "ipcns", "seccomp": "seccomp"}[mode]
    if not out["layers"][layer].startswith("on"):
        pytest.skip(f"{layer} is off here: {out['layers'][layer]}")
    if mode == "ipcns":  # made, but inside the worker's own namespace, gone with it
        assert {out[op] for op in ("shmget", "msgget", "semget", "mq_open")} == {"made"}, out
    else:
        assert {out[op] for op in ("shmget", "msgget", "semget", "mq_open")} == {"EPERM"}, out
    if mode == "all":
        assert out["layers"]["ipcns"].startswith("on"), out["layers"]
    assert leaked == []
    assert _host_ipc() == before


@pytest.mark.unit
def test_the_seccomp_tables_refuse_ipc_on_both_architectures():
    ipc = {"shmget", "shmat", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop"}
    ipc |= {"semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr"}
    for machine, table in kernel._DENIED.items():
        assert ipc <= set(table), (machine, ipc - set(table))
        assert len(set(table.values())) == len(table), machine  # no number twice
        denied = {k for op, _, _, k in kernel.seccomp_program(machine) if op == kernel._BPF_JEQ_K}
        assert {table[name] for name in ipc} <= denied


# -- class 9: answers, not tracebacks, in the trusted process ---------------------------------------

#: Sources the parser or anything that walks their tree recursively cannot handle: MemoryError from
#: the parser, RecursionError from the AST constructor, a tree that parses but is too deep to walk.
PATHOLOGICAL = {
    "unary_chain": "X = " + "-" * 100_000 + "1\n",
    "attribute_chain": "X = " + "a." * 100_000 + "b\n",
    "deep_but_parseable": "X = " + "-" * 1_000 + "1\n",
}


@pytest.mark.unit
@pytest.mark.parametrize("source", PATHOLOGICAL.values(), ids=PATHOLOGICAL.keys())
def test_pathological_source_is_an_issue_naming_the_file(golden, source):
    from worldsmith.bundle import asgiapp, codepolicy, toolspec

    [(_, problem)] = codepolicy.check_source(source, "verifiers.py")
    assert "too deeply nested to parse" in problem
    _, issues = toolspec.derive_tool_schemas(source)
    assert issues and all(i.file == "tools.py" for i in issues)
    assert any("too deeply nested to parse" in i.problem for i in issues), issues
    [(_, problem)] = asgiapp.check_app_source(source)
    assert "too deeply nested to parse" in problem
    assert asgiapp.app_imports(source) == []
    for name in ("tools.py", "verifiers.py"):
        sources = _sources(golden)
        sources[name] = sources[name] + b"\n\n" + source.encode()
        with pytest.raises(BundleError) as caught:
            build_bundle(sources, _manifest(golden))
        assert any(i.file == name and "too deeply nested to parse" in i.problem for i in caught.value.issues)


@pytest.mark.unit
def test_a_pathological_string_annotation_is_an_issue_naming_the_tool():
    from worldsmith.bundle import toolspec

    for nesting in ("-" * 100_000 + "1", "a." * 100_000 + "b", "-" * 1_000 + "1"):
        source = (
            f'def f(conn, x: \'{nesting}\') -> int:\n    """F.\n\n    Args:\n        x: X.\n    """\n    return 1\n'
        )
        _, issues = toolspec.derive_tool_schemas(source)
        assert issues and all(i.file == "tools.py" for i in issues)
        assert any("'f'" in i.problem and "too deeply nested" in i.problem for i in issues), issues


@pytest.mark.unit
def test_ordinary_nesting_still_parses():
    from worldsmith.bundle import codepolicy

    assert codepolicy.check_source("X = " + "-" * 150 + "1\n", "tools.py") == []


def _bundle_dir(golden: Bundle, root: Path, name: str, tools: str, *, derive: bool = True) -> Path:
    """`golden` written to `root/name` with `tools` appended to tools.py; with `derive` False the
    manifest is only rehashed (tools.json and the checks are left to the command)."""
    from worldsmith.bundle.loader import manifest_bytes, write_bundle

    sources = _sources(golden)
    sources["tools.py"] += b"\n\n" + tools.encode()
    path = root / name
    if derive:
        return write_bundle(build_bundle(sources, _manifest(golden)), path)
    write_bundle(golden, path)
    (path / "tools.py").write_bytes(sources["tools.py"])
    artifacts = dict(golden.manifest.artifacts, **{"tools.py": artifact_digest(sources["tools.py"])})
    (path / "manifest.json").write_bytes(manifest_bytes(golden.manifest.model_copy(update={"artifacts": artifacts})))
    return path


def _nested(depth: int) -> str:
    return f'def nested(conn) -> list:\n    """A list {depth} levels deep."""\n    r = []\n    for _ in range({depth}):\n        r = [r]\n    return r\n'


@pytest.fixture()
def hostile_dirs(golden, tmp_path) -> dict[str, Path]:
    return {
        "deep_source": _bundle_dir(golden, tmp_path, "deep_source", PATHOLOGICAL["unary_chain"], derive=False),
        "deep_attrs": _bundle_dir(golden, tmp_path, "deep_attrs", PATHOLOGICAL["attribute_chain"], derive=False),
        "deep_result": _bundle_dir(golden, tmp_path, "deep_result", _nested(100_000)),
        "printable_deep_result": _bundle_dir(golden, tmp_path, "printable_deep_result", _nested(950)),
        "refused_at_import": _bundle_dir(
            golden, tmp_path, "refused_at_import", "import pathlib\n_X = pathlib.Path('/etc/passwd').read_text()\n"
        ),
    }


CLI_ATTACKS = [
    (["env", "check"], "deep_source", "too deeply nested to parse"),
    (["env", "tools"], "deep_attrs", "too deeply nested to parse"),
    (["env", "build"], "deep_source", "too deeply nested to parse"),
    (["catalog", "publish"], "deep_attrs", "too deeply nested to parse"),
    # the worker refuses a result nested deeper than jsonvalues.MAX_NESTING before encoding it
    (["env", "call", "{}", "nested"], "deep_result", "result nested deeper than"),
    (["env", "call", "{}", "nested"], "printable_deep_result", "result nested deeper than"),
    (["env", "call", "{}", "get_product", "--args", '{"sku": "KB-101"}'], "refused_at_import", "outside the episode"),
    (["env", "check"], "refused_at_import", "tools load"),
]


@pytest.mark.parametrize(("command", "bundle", "expected"), CLI_ATTACKS, ids=[f"{c[1]}-{b}" for c, b, _ in CLI_ATTACKS])
def test_cli_answers_a_hostile_bundle_without_a_traceback(hostile_dirs, home, command, bundle, expected):
    from typer.testing import CliRunner

    from worldsmith.cli import app

    path = str(hostile_dirs[bundle])
    args = [path if part == "{}" else part for part in command] if "{}" in command else [*command, path]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert any(part in result.output for part in expected.split("|")), result.output[-2000:]


def _validation_error() -> Exception:
    from pydantic import ValidationError

    from worldsmith.models.bundle import Manifest

    try:
        Manifest.model_validate({"env_id": ["not", "a", "name"]})
    except ValidationError as exc:
        return exc
    raise AssertionError("validated")


@pytest.mark.unit
@pytest.mark.parametrize(
    "exc",
    [
        RecursionError("maximum recursion depth exceeded"),
        MemoryError(),
        subprocess.TimeoutExpired(["worker", "x"], 5),
        WorkerLost("died\nbadly", in_flight=True),
        _validation_error(),
    ],
    ids=lambda e: type(e).__name__,
)
def test_the_cli_handler_turns_what_a_bundle_can_raise_into_one_line(monkeypatch, home, golden, exc):
    from typer.testing import CliRunner

    from worldsmith.cli import app, env

    def hostile(path):
        raise exc

    monkeypatch.setattr(env, "load_bundle_arg", hostile)
    result = CliRunner().invoke(app, ["env", "tools", str(golden.root)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit | None)
    assert len(result.output.strip().splitlines()) == 1, result.output


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: signal.Signals(s).name)
def test_env_serve_removes_its_scratch_directory_when_stopped(golden, tmp_path, signum):
    import socket

    temp = Path(tempfile.mkdtemp(prefix="worldsmith-serve-test-"))  # traversable by the sandbox uid
    temp.chmod(0o755)
    port = _free_port()
    env = dict(os.environ, TMPDIR=str(temp), WORLDSMITH_HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "worldsmith.cli", "env", "serve", str(golden.root), "--host", "127.0.0.1"]
        + ["--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def serving() -> bool:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=MOMENTS_S).close()
        except OSError:
            return False
        return True

    try:
        wait_until(serving, "env serve to accept connections", within_s=PROCESS_S)
        made = [p.name for p in temp.iterdir()]
        assert any(name.startswith("worldsmith-sandbox-") for name in made), made
        proc.send_signal(signum)
        proc.wait(timeout=PROCESS_S)
        assert list(temp.iterdir()) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_forged_reply_content_moves_the_episode_to_a_fresh_worker(golden, isolation):
    """Code that reaches the worker's own encoder (a class attribute of `json`, which the module
    fingerprint does not see) makes well-framed replies that break the reply contract: the call is an
    env_error, the worker is killed, and the episode moves to a fresh worker with its writes."""
    source = (
        "import json\n\n\ndef forge(conn):\n"
        '    json.JSONEncoder.encode = lambda self, o: \'{"status": 7, "result": [1]}\'\n'
        "    return 'done'\n"
    )
    forging_env = with_tools(golden, source, ["forge"])
    task = golden.tasks[0].id
    limits = isolated(FAST_LIMITS, isolation)
    with Runtime(limits=limits, workers=1) as rt, rt.open_episode(forging_env, task) as episode:
        assert episode.call_tool("update_customer_email", {"customer_id": 2, "email": "b@example.com"}).ok
        forging_process = code_process(episode)
        result = episode.call_tool("forge")
        assert result.status == "env_error" and result.limit == "protocol", result
        assert "invalid reply" in result.error
        assert code_process(episode) != forging_process
        assert _email(episode, 2) == "b@example.com"
        assert episode.verify("").status in {"complete", "partial", "incomplete"}


# -- class 8: metadata of host paths --------------------------------------------------------------

#: The routes the allowed modules give to what a path is (exists, size, times, owner, entries, link
#: target, file system), as expressions of `p`: `pathlib` directly, `os` and `os.path` reached through
#: allowed modules' attributes (`pathlib.os`, `uuid.os`), as code past the static check reaches them
#: (the module views of stdlib workers hide those attributes: such routes are then unreachable).
METADATA_ROUTES = {
    "path_exists": "pathlib.Path(p).exists()",
    "path_is_dir": "pathlib.Path(p).is_dir()",
    "path_is_file": "pathlib.Path(p).is_file()",
    "path_stat": "tuple(pathlib.Path(p).stat())",
    "path_lstat": "tuple(pathlib.Path(p).lstat())",
    "path_iterdir": "sorted(str(child) for child in pathlib.Path(p).iterdir())",
    "path_glob": "sorted(str(child) for child in pathlib.Path(p).glob('*'))",
    "path_resolve_strict": "str(pathlib.Path(p).resolve(strict=True))",
    "path_samefile": "pathlib.Path(p).samefile(p)",
    "os_stat": "tuple(pathlib.os.stat(p))",
    "os_stat_bytes": "tuple(pathlib.os.stat(p.encode()))",
    "os_stat_pathlike": "tuple(pathlib.os.stat(pathlib.PurePath(p)))",
    "os_stat_keyword": "tuple(pathlib.os.stat(path=p, follow_symlinks=False))",
    "os_listdir_cwd": "sorted(pathlib.os.listdir())",
    "os_lstat": "tuple(pathlib.os.lstat(p))",
    "os_access": "[pathlib.os.access(p, mode) for mode in (0, 2, 4)]",
    "os_readlink": "pathlib.os.readlink(p)",
    "os_statvfs": "tuple(pathlib.os.statvfs(p))",
    "os_pathconf": "pathlib.os.pathconf(p, 'PC_NAME_MAX')",
    "os_listdir": "sorted(pathlib.os.listdir(p))",
    "os_scandir": "sorted(entry.name for entry in pathlib.os.scandir(p))",
    "os_path_exists": "pathlib.os.path.exists(p)",
    "os_path_lexists": "pathlib.os.path.lexists(p)",
    "os_path_getsize": "pathlib.os.path.getsize(p)",
    "os_path_getmtime": "pathlib.os.path.getmtime(p)",
    "os_path_isdir": "pathlib.os.path.isdir(p)",
    "os_path_islink": "pathlib.os.path.islink(p)",
    "os_path_ismount": "pathlib.os.path.ismount(p)",
    "os_path_realpath": "pathlib.os.path.realpath(p) == pathlib.os.path.normpath(p)",
    "uuid_os_stat": "tuple(uuid.os.stat(p))",
    # refused outright: os.walk (audited), the host's users read by libc from /etc/passwd (`pwd`)
    "os_walk": "list(pathlib.os.walk(p))",
    "path_owner": "pathlib.Path(p).owner()",
    "path_expanduser": "str(pathlib.Path('~' + pathlib.Path(p).name).expanduser())",
}
#: Routes refused outright (the refusal retires the code's process; probed after the others).
REFUSED_ROUTES = ("os_walk", "path_owner", "path_expanduser")

METADATA_PROBE = (
    "import pathlib\nimport uuid\n\n\ndef metadata(conn, route, p):\n"
    "    try:\n"
    "        return {'value': repr(ROUTES[route](p))}\n"
    "    except OSError as exc:\n"
    "        return {'errno': exc.errno}\n\n\n"
    "ROUTES = {\n" + "".join(f"    {name!r}: lambda p: {expr},\n" for name, expr in METADATA_ROUTES.items()) + "}\n"
)


def _seen(episode, route: str, path: str) -> tuple:
    """What the route tells generated code about `path`: a refusal (its limit) or its answer."""
    result = episode.call_tool("metadata", {"route": route, "p": path})
    if result.status == "env_error" and result.limit is not None:
        return ("refused", result.limit)
    if result.status == "env_error" and "has no attribute 'os'" in (result.error or ""):
        return ("unreachable", None)  # stdlib workers hand out module views without `pathlib.os` (moduleview.py)
    assert result.ok, result
    return ("answer", result.value)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_metadata_of_host_paths_is_blind_to_generated_code(golden, isolation):
    """Every route to a path's metadata answers for a host file, a host directory, the worker's scratch
    parent and another episode's directory exactly what it answers for a path that does not exist (or is
    refused); the standard library and the episode's own directory stay visible."""
    import sysconfig

    probe_env = with_tools(golden, METADATA_PROBE, ["metadata"])
    with Runtime(limits=isolated(FAST_LIMITS, isolation), workers=1) as rt:
        with rt.open_episode(probe_env) as episode, rt.open_episode(probe_env) as other:
            # file areas have random names, made by an episode's first process under strict isolation
            # (under fast isolation by its first verification: a stand-in for the other's is made here)
            worker = episode._worker
            databases = worker.scratch / "databases"
            assert other.call_tool("metadata", {"route": "path_exists", "p": "/"}).ok
            assert episode.call_tool("metadata", {"route": "path_exists", "p": "/"}).ok
            if isolation == "strict":  # beside them: spares' directories (runtime/sandbox/processes.py)
                own, others = {Path(file_area(episode))}, {Path(file_area(other))}
            else:
                own, others = set(), set(worker.scratch.iterdir()) - {databases}
            other_dir = next(iter(others), worker.scratch / os.urandom(16).hex())
            other_dir.mkdir(exist_ok=True)
            if os.geteuid() == 0:
                os.chown(other_dir, rt.limits.uid, rt.limits.uid)
            (other_dir / "secret.db").write_bytes(b"x" * 4321)
            hidden = ["/etc/passwd", "/root", "/proc/self/exe", str(rt.pool.scratch_root), str(other_dir)]
            hidden.append(str(other_dir / "secret.db"))
            if isolation == "strict":  # the episodes' databases, its own included
                hidden += [str(databases), *(str(path) for path in databases.iterdir())]
            absent = f"/nonexistent-{os.getpid()}-{time.monotonic_ns()}"
            # what the code may see is not hidden: its own directory, and the standard library (whose
            # files the sandbox uid may not be allowed to read: then the real answer is a refusal of access)
            for own_dir in own:  # strict: its own file area
                assert _seen(episode, "path_is_dir", str(own_dir)) == ("answer", {"value": "True"})
            assert len(own) == (isolation == "strict")
            stdlib_file = os.path.join(sysconfig.get_path("stdlib"), "json", "__init__.py")
            assert _seen(episode, "path_stat", stdlib_file) != _seen(episode, "path_stat", absent)
            for route in (name for name in METADATA_ROUTES if name not in REFUSED_ROUTES):
                assert [path for path in hidden if not os.path.lexists(path)] == [], route  # what is probed is there
                control = _seen(episode, route, absent)
                for path in hidden:
                    seen = _seen(episode, route, path)
                    assert seen[0] == "refused" or seen == control, (route, path, seen, control)
            for route in REFUSED_ROUTES:
                seen = [_seen(episode, route, path) for path in [*hidden, absent]]
                assert all(outcome in {"refused", "unreachable"} for outcome, _ in seen), (route, seen)


@pytest.mark.unit
def test_the_guard_resolves_paths_without_running_generated_methods():
    """The guard resolves a path (to gate it) with the real functions and no audit: it copies
    generated code's path objects to exact strings first, so no overridden method runs then."""
    from worldsmith.runtime.sandbox.guard import _exact_path

    class Sneaky(str):
        def startswith(self, *args):
            raise AssertionError("ran while the guard trusts itself")

        def __getitem__(self, index):
            raise AssertionError("ran while the guard trusts itself")

    class SneakyBytes(bytes):
        def decode(self, *args):
            raise AssertionError("ran while the guard trusts itself")

    for path in (Sneaky("/etc/passwd"), SneakyBytes(b"/etc/passwd"), Path("/etc/passwd")):
        exact = _exact_path(path)
        assert type(exact) in (str, bytes) and os.fsdecode(exact) == "/etc/passwd"


# -- class 8: hooks of generated code in the trusted diff ------------------------------------------

#: Installs on the episode's connection (and its class) every callable SQLite or the sqlite3 module
#: calls back on reads: text and row factories, functions and an aggregate overriding built-ins the
#: diff's SQL could use, a collation, methods. Each hook records that it ran and blinds what it returns.
HOOKS = textwrap.dedent("""
    RAN = []


    def _hook(name, answer):
        def hook(*args):
            RAN.append(name)
            return answer
        return hook


    class Blind:
        def __init__(self):
            RAN.append("aggregate")

        def step(self, *values):
            pass

        def finalize(self):
            return 0


    def write_plain(conn):
        conn.execute("UPDATE customers SET email = 'hooked@example.com' WHERE id = 1")
        return "written"


    def write_and_hook(conn):
        conn.execute("UPDATE customers SET email = 'hooked@example.com' WHERE id = 1")
        conn.text_factory = _hook("text_factory", "BLINDED")
        conn.row_factory = _hook("row_factory", ())
        for name, arity in (("lower", 1), ("upper", 1), ("like", 2), ("like", 3), ("glob", 2), ("hex", 1),
                            ("length", 1), ("typeof", 1), ("quote", 1), ("coalesce", 2), ("ifnull", 2)):
            conn.create_function(name, arity, _hook(name, 1))
        for arity in (0, 1):
            conn.create_aggregate("count", arity, Blind)
        conn.create_collation("NOCASE", _hook("collation", 0))
        conn.execute = _hook("execute", None)
        conn.cursor = _hook("cursor", None)
        type(conn).executemany = _hook("class_executemany", None)
        RAN.clear()
        return "hooked"


    def hooks_ran(conn):
        return list(RAN)
""")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_hooks_installed_on_a_connection_never_run_in_the_trusted_diff(golden, isolation):
    hooked_env = with_tools(golden, HOOKS, ["write_plain", "write_and_hook", "hooks_ran"])
    task = golden.tasks[0].id
    with Runtime(limits=isolated(FAST_LIMITS, isolation), workers=1) as rt:
        with rt.open_episode(hooked_env, task) as hooked, rt.open_episode(hooked_env, task) as plain:
            start = hooked.snapshot()
            assert hooked.call_tool("write_and_hook").value == "hooked"
            assert plain.call_tool("write_plain").value == "written"
            diff = hooked.diff(start)
            assert diff.tables and diff == plain.diff(start)
            [change] = diff.tables["customers"].updated
            assert (
                change["after"]["email"] == "hooked@example.com" and change["before"]["email"] != "hooked@example.com"
            )
            assert hooked.diff(start, hooked.snapshot()) == diff
            assert hooked.verify("").model_dump() == plain.verify("").model_dump()
            assert hooked.call_tool("hooks_ran").value == []


def _odd_table_diff() -> tuple[dict, list]:
    """The diff of one insert into a table named with a quote whose virtual column is computed by a
    function of the writer's connection, and the values that function was called with meanwhile."""
    import sqlite3

    from worldsmith.runtime.sandbox import dbdiff

    ran: list = []
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.create_function("mine", 1, lambda value: ran.append(value) or value, deterministic=True)
    conn.execute('CREATE TABLE "odd""name" (id INTEGER PRIMARY KEY, a TEXT, v TEXT AS (mine(a)) VIRTUAL)')
    before = sqlite3.connect(":memory:")
    before.deserialize(conn.serialize())
    conn.execute("""INSERT INTO "odd""name" (a) VALUES ('x')""")
    ran.clear()
    return dbdiff.diff(before, conn), ran


@pytest.mark.unit
def test_the_diff_reads_a_table_named_with_quotes_as_itself():
    diff, _ = _odd_table_diff()
    assert diff == {'odd"name': {"inserted": [{"id": 1, "a": "x"}], "updated": [], "deleted": []}}


@pytest.mark.unit
def test_the_diff_runs_no_function_of_a_computed_column():
    _, ran = _odd_table_diff()
    assert ran == []


# -- class 9: results nested too deep -------------------------------------------------------------


@pytest.mark.unit
def test_nesting_is_checked_without_recursion():
    from worldsmith.bundle.jsonvalues import MAX_NESTING, TooDeep, check_nesting, json_text

    def nested(depth: int, make=lambda inner: [inner]):
        value: object = []
        for _ in range(depth - 1):
            value = make(value)
        return value

    assert json_text(nested(MAX_NESTING)).count("[") == MAX_NESTING
    for make in (lambda inner: [inner], lambda inner: {"k": inner}, lambda inner: (inner,)):
        with pytest.raises(TooDeep, match=f"result nested deeper than {MAX_NESTING} levels"):
            json_text(nested(MAX_NESTING + 1, make))
    check_nesting(frozenset({frozenset({1})}), limit=2)
    with pytest.raises(TooDeep):
        check_nesting(frozenset({frozenset({frozenset()})}), limit=2)  # sets become nested lists
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(TooDeep):
        json_text(cycle)
    with pytest.raises(TooDeep):
        json_text(nested(200_000))


@pytest.mark.parametrize("depth", [950, 100_000])
def test_a_result_nested_too_deep_is_an_env_error_that_retires_nothing(runtime, golden, depth):
    source = f"def nested(conn):\n    r = []\n    for _ in range({depth}):\n        r = [r]\n    return r\n"
    bundle = with_tools(golden, source, ["nested"])
    with runtime.open_episode(bundle) as bystander, runtime.open_episode(bundle) as culprit:
        assert bystander.call_tool("update_customer_email", {"customer_id": 2, "email": "b@example.com"}).ok
        assert _email(culprit) and (process := code_process(culprit))
        result = culprit.call_tool("nested")
        assert result.status == "env_error" and "result nested deeper than" in result.error, result
        assert result.limit is None  # not a sandbox violation: nothing is retired
        assert code_process(culprit) == process
        assert _email(bystander, 2) == "b@example.com" and culprit.call_tool("get_customer", {"customer_id": 1}).ok


# -- class 9: the MCP gateway answers a hostile world ---------------------------------------------


def _as_env(bundle: Bundle, env_id: str) -> Bundle:
    return Bundle(
        manifest=bundle.manifest.model_copy(update={"env_id": env_id}),
        files=bundle.files,
        tasks=bundle.tasks,
        tools=bundle.tools,
    )


def _mcp_session(url: str, env_id: str, calls):
    """Run `calls(session)` in one MCP session of environment `env_id` at `url`."""
    import anyio
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def run():
        async with streamable_http_client(f"{url}/envs/{env_id}/mcp") as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await calls(session)

    return anyio.run(run)


def _mcp_errors(exc: BaseException) -> list:
    """The MCP errors in `exc` (an exception group from the client's task groups, or one error)."""
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, MCPError):
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        return [e for inner in exc.exceptions for e in _mcp_errors(inner)]
    return []


def _tracebacks(records) -> list[str]:
    return [r.getMessage() for r in records if r.exc_info]


UNOPENABLE = {
    "refused_at_import": "import socket\n",
    "reads_the_host_at_import": "import pathlib\n_X = pathlib.Path('/etc/passwd').read_text()\n",
    "raises_at_import": "raise RuntimeError('broken at import')\n",
    "pathological_source": PATHOLOGICAL["unary_chain"],
}


def test_the_gateway_answers_environments_that_cannot_open_with_mcp_errors(golden, caplog):
    from mcp_types import INTERNAL_ERROR

    from worldsmith.localserver import BackgroundServer
    from worldsmith.serving.gateway import Gateway

    hostile = {name: _as_env(with_tools(golden, source, []), name) for name, source in UNOPENABLE.items()}

    async def read_one(session):
        return await session.call_tool("get_customer", {"customer_id": 1})

    with Runtime(limits=FAST_LIMITS, workers=1) as rt:
        gateway = Gateway(rt, [golden, *hostile.values()])
        with BackgroundServer(gateway.app()) as server:
            for name in hostile:
                with pytest.raises(BaseException) as caught:
                    _mcp_session(server.url, name, read_one)
                [error] = _mcp_errors(caught.value)
                assert error.error.code == INTERNAL_ERROR and f"{name}: cannot open an episode" in error.error.message
                assert "\n" not in error.error.message and "Traceback" not in error.error.message
            served = _mcp_session(server.url, golden.env_id, read_one)
            assert not served.is_error and served.structured_content["id"] == 1
    assert _tracebacks(caplog.records) == []


GATEWAY_ATTACKS = textwrap.dedent("""
    def nested(conn):
        r = []
        for _ in range(100_000):
            r = [r]
        return r


    def nested_printable(conn):
        r = []
        for _ in range(950):
            r = [r]
        return r


    def loud(conn):
        raise ToolError("x" * 70_000_000)


    def loud_fault(conn):
        raise ValueError("y" * 30_000_000)


    def unencodable(conn):
        return {"value": object()}


    def spin(conn):
        while True:
            pass
""")


def test_the_gateway_answers_each_hostile_call_with_a_tool_error_in_a_session_that_goes_on(golden, caplog):
    import threading

    from worldsmith.localserver import BackgroundServer
    from worldsmith.serving.gateway import Gateway

    names = ["nested", "nested_printable", "loud", "loud_fault", "unencodable", "spin"]
    hostile = with_tools(golden, GATEWAY_ATTACKS, names)

    def kill_the_workers_once_spinning(rt: Runtime) -> None:
        import psutil

        def cpu_s() -> float:
            tree = [
                p for w in rt.pool.workers() for p in [psutil.Process(w.pid), *psutil.Process(w.pid).children(True)]
            ]
            return sum(sum(p.cpu_times()[:2]) for p in tree)

        idle = cpu_s()
        wait_until(lambda: cpu_s() - idle > FAST_LIMITS.cpu_s / 4, "the spin call to spin")  # under its cpu limit
        for worker in rt.pool.workers():
            worker.process.kill()

    with Runtime(limits=FAST_LIMITS, workers=1) as rt:
        gateway = Gateway(rt, [hostile])
        with BackgroundServer(gateway.app()) as server:

            async def calls(session):
                answers = {}
                for name in names:
                    if name == "spin":  # the worker is killed under the call
                        threading.Thread(target=kill_the_workers_once_spinning, args=(rt,)).start()
                    answers[name] = await session.call_tool(name, {})
                answers["after"] = await session.call_tool("get_customer", {"customer_id": 1})
                return answers

            answers = _mcp_session(server.url, hostile.env_id, calls)
    for name in names:
        text = answers[name].content[0].text
        assert answers[name].is_error and len(text) < 100_000 and "Traceback" not in text, (name, text[:300])
    assert "result nested deeper than" in answers["nested"].content[0].text
    assert "result nested deeper than" in answers["nested_printable"].content[0].text
    assert not answers["after"].is_error and answers["after"].structured_content["id"] == 1
    assert _tracebacks(caplog.records) == []


@pytest.mark.parametrize(
    "failure",
    [
        RecursionError("maximum recursion depth exceeded"),
        MemoryError(),
        WorkerLost("died\nbadly", in_flight=True),
        "runtime_fault",
        "forged_deep_value",
    ],
    ids=lambda f: f if isinstance(f, str) else type(f).__name__,
)
def test_the_gateway_turns_what_a_call_can_raise_into_a_tool_error(golden, monkeypatch, caplog, failure):
    from worldsmith.localserver import BackgroundServer
    from worldsmith.models.results import ToolResult
    from worldsmith.runtime.episode import SandboxEpisode
    from worldsmith.runtime.errors import RuntimeFault
    from worldsmith.serving.gateway import Gateway

    def hostile(self, name, arguments=None):
        if failure == "forged_deep_value":  # a reply no worker's own check let through
            return ToolResult(status="ok"), b"[" * 500 + b"]" * 500
        raise RuntimeFault("sandbox workers keep dying; giving up") if failure == "runtime_fault" else failure

    async def calls(session):
        return await session.call_tool("get_customer", {"customer_id": 1}), await session.list_tools()

    monkeypatch.setattr(SandboxEpisode, "call_tool_text", hostile)  # what the gateway calls
    with Runtime(limits=FAST_LIMITS, workers=1) as rt:
        with BackgroundServer(Gateway(rt, [golden]).app()) as server:
            result, tools = _mcp_session(server.url, golden.env_id, calls)
    assert result.is_error and result.content[0].text.startswith("environment error: ")
    assert len(result.content[0].text.splitlines()) == 1 and tools.tools
    assert _tracebacks(caplog.records) == []


# -- class 7: imported worlds' SQL is bounded -----------------------------------------------------

AWM_SAMPLE = REPO / "tests" / "data" / "awm_format_sample"


@pytest.mark.parametrize(
    ("tables", "inserts", "named"),
    [
        ([{"ddl": "CREATE TABLE hostile (x);"}], [f"INSERT INTO hostile {ENDLESS} SELECT n FROM r;"], "insert"),
        (
            [
                {"ddl": "CREATE TABLE hostile (x);"},
                {
                    "ddl": f"CREATE TRIGGER spin AFTER INSERT ON hostile BEGIN INSERT INTO hostile {ENDLESS} "
                    "SELECT count(*) FROM r; END;"
                },
            ],
            ["INSERT INTO hostile VALUES (1);"],
            "insert",
        ),
        ([{"ddl": f"CREATE TABLE hostile AS {ENDLESS} SELECT n FROM r;"}], [], "schema statement"),
        (
            [{"ddl": "CREATE TABLE hostile (x);"}],
            [f"INSERT INTO hostile {BLOATING.replace('count(*)', 'n')};"],
            "insert",
        ),
    ],
    ids=["endless_cte_insert", "endless_trigger", "endless_cte_schema", "bloating_insert"],
)
def test_an_imported_world_with_endless_sql_is_a_clean_import_error_naming_the_statement(
    runtime, tight_budget, tables, inserts, named
):
    import dataclasses

    from worldsmith.interop.awm import import_scenario, read_release

    (scenario,) = read_release(AWM_SAMPLE)
    hostile = dataclasses.replace(scenario, tables=scenario.tables + tables, inserts=scenario.inserts + inserts)
    before = _resident()
    imported = import_scenario(hostile, runtime)  # endless: only the budget ends it
    assert _resident() - before < tight_budget.memory_bytes + 256 * 1024 * 1024
    assert imported.bundle is None
    [defect] = [str(d) for d in imported.defects if "budget" in str(d)]
    assert named in defect and "hostile" in defect, defect


# -- generated code never runs while the guard is off ---------------------------------------------

#: Objects whose methods spin forever. Run inside a call, the guard's timer ends them as a `timeout`
#: violation; run by the worker's own code after the call (the guard off, no timer), they would hang
#: the worker until the parent killed it.
SPINNING = textwrap.dedent("""
    class Spin:
        def __str__(self):
            while True:
                pass

        def __iter__(self):
            while True:
                pass


    def loud_fault(conn):
        raise ValueError(Spin())


    def loud_refusal(conn):
        raise ToolError(Spin())


    def plant(conn):
        conn.CALL_SAVEPOINTS = Spin()
        conn.CALL_ROW_FACTORY = Spin()
        type(conn).CALL_SAVEPOINTS = Spin()
        type(conn).total_changes = property(lambda self: Spin().__str__())
        type(conn).in_transaction = property(lambda self: Spin().__str__())
        return "planted"
""")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_generated_code_the_worker_calls_back_into_runs_under_the_guard(golden, isolation):
    bundle = with_tools(golden, SPINNING, ["loud_fault", "loud_refusal", "plant"])
    with Runtime(limits=isolated(FAST_LIMITS, isolation), workers=1) as rt, rt.open_episode(bundle) as episode:
        assert episode.call_tool("get_customer", {"customer_id": 1}).ok
        for tool in ("loud_fault", "loud_refusal"):
            result = episode.call_tool(tool)
            # the guard's own timer ended it: the call's limit, not a worker killed for silence
            assert result.status == "env_error" and result.limit in {"timeout", "cpu"}, result
            assert result.error.startswith(f"sandbox limit {result.limit}: call exceeded"), result.error
        assert episode.call_tool("plant").value == "planted"
        after = episode.call_tool("update_customer_email", {"customer_id": 2, "email": "b@example.com"})
        assert after.ok and after.changed, after  # the runtime's savepoints and change count, not the planted ones
        assert _email(episode, 2) == "b@example.com"


@pytest.mark.unit
def test_a_reader_that_goes_away_is_told_apart_from_one_too_slow():
    """What `send_within` says of a request it could not deliver (the parent's direct channels word a
    failed request by it): a process gone before it, gone while reading it, or not reading in time."""
    import threading

    def outcome(reader_action, deadline_s: float) -> str | None:
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        threading.Thread(target=reader_action, args=(read_end,)).start()
        try:
            return send_within(write_end, b"x" * (1 << 20), time.monotonic() + deadline_s)
        finally:
            os.close(write_end)

    def leaves_after_a_little(fd: int) -> None:
        os.read(fd, 10)
        os.close(fd)

    gone_read, gone_write = os.pipe()
    os.close(gone_read)
    assert send_within(gone_write, b"x", time.monotonic() + MOMENTS_S) == "gone"
    os.close(gone_write)
    assert outcome(leaves_after_a_little, MOMENTS_S) == "broken"  # it reads a little (once there is some), then goes
    slow: list[int] = []
    assert outcome(slow.append, 0.2) == "late"  # it never reads: the deadline (the subject here) passes
    os.close(slow[0])
