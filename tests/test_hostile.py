"""Hostile worlds at the seams of the sandbox (issue 19): bundle SQL run by the trusted process,
transaction control from tool SQL, valid annotations refused, oversized errors, evidence, frames
and stderr. Each attack asserts containment: a clean error naming what was hit, other episodes
unchanged, the parent's memory bounded, a misbehaving worker replaced."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import FAST_LIMITS, with_tools

from worldsmith.bundle import sqlscript
from worldsmith.bundle.contract import Bundle, artifact_digest
from worldsmith.bundle.errors import BundleError
from worldsmith.bundle.loader import build_bundle
from worldsmith.quality.probes import check_environment
from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.errors import WorkerLost
from worldsmith.runtime.pool import StderrTail
from worldsmith.runtime.sandbox.protocol import FrameReader, ProtocolViolation, truncated

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
    started = time.monotonic()
    with pytest.raises(BundleError) as caught:
        build_bundle(sources, _manifest(golden))
    assert time.monotonic() - started < tight_budget.total_s + 2
    assert _resident() - before < tight_budget.memory_bytes + 256 * 1024 * 1024
    [issue] = [i for i in caught.value.issues if "budget" in i.problem]
    assert issue.file == "seed.sql" and issue.line == last_line, issue
    assert issue.statement and issue.statement.startswith("INSERT INTO")


def test_memory_bound_stops_a_statement_before_its_time_bound():
    budget = sqlscript.SqlBudget(statement_s=30.0, total_s=30.0, memory_bytes=64 * 1024 * 1024)
    started = time.monotonic()
    world, faults = sqlscript.build_world("CREATE TABLE t (x);", f"INSERT INTO t {BLOATING};", budget=budget)
    assert world is None
    assert "memory budget" in faults[0].problem and faults[0].line == 1
    assert time.monotonic() - started < 10


def test_schema_check_is_bounded_too():
    budget = sqlscript.SqlBudget(statement_s=0.5, total_s=2.0)
    schema = f"CREATE TABLE t AS {ENDLESS} SELECT n FROM r;"
    faults = sqlscript.check_schema(schema, budget=budget)
    assert faults and "time budget" in faults[0].problem and faults[0].file == "schema.sql"


def test_total_budget_stops_many_slow_statements():
    budget = sqlscript.SqlBudget(statement_s=0.4, total_s=1.0)
    slow = f"INSERT INTO t {ENDLESS} SELECT n FROM r WHERE n < 0;\n"  # never ends, returns nothing
    started = time.monotonic()
    _, faults = sqlscript.build_world("CREATE TABLE t (x);", slow * 10, budget=budget)
    assert time.monotonic() - started < 3
    assert len(faults) == 1 and "budget" in faults[0].problem


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
def test_transaction_control_from_tool_sql_is_refused_and_writes_of_a_failed_call_vanish(runtime, golden, swallow):
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


def test_the_runtimes_own_rollback_and_commit_still_work(runtime, golden):
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


# -- class 10: a valid world refused -------------------------------------------------------------


def test_tools_annotated_with_sqlite3_types_load_and_check_isinstance(runtime, golden):
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


def test_huge_tool_error_is_truncated_and_the_worker_goes_on(runtime, golden):
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


def test_truncated_marks_what_was_cut():
    assert truncated("abc", 5) == "abc"
    assert truncated("a" * 10, 4) == "aaaa...[truncated 6 characters]"


# -- class 3 (parent side): forged frames ---------------------------------------------------------


def _forged(header: dict, declared_length: int | None = None) -> bytes:
    data = json.dumps(header).encode()
    return struct.pack(">I", declared_length if declared_length is not None else len(data)) + data


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
            FrameReader(read, max_blobs=1 << 30).read(time.monotonic() + 2)
    finally:
        os.close(read)
        os.close(write)


def test_a_worker_sending_a_forged_frame_is_killed_and_its_episode_ends_as_env_error(runtime, golden):
    with runtime.open_episode(golden) as bystander, runtime.open_episode(golden) as culprit:
        assert bystander.call_tool("update_customer_email", {"customer_id": 2, "email": "b@example.com"}).ok
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
            worker.request({"op": "ping"}, timeout=5)
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
    tail.drain(process.stderr.fileno())
    process.wait(timeout=60)
    assert _resident() - before < 32 * 1024 * 1024
    assert tail.tail(1) == "last words"
    assert all(len(line) < 3000 for line in tail.tail(40).split(" | "))


def test_stderr_tail_marks_cut_lines():
    tail = StderrTail(lines=3, line_chars=4)
    for piece in (b"abcdef", b"gh\nshort\n", b"a\nb\nc"):
        tail.feed(piece)
    tail.feed(b"\n")
    assert tail.tail(5) == "a | b | c"
    tail = StderrTail(lines=3, line_chars=4)
    tail.feed(b"abcdefgh\n")
    assert tail.tail() == "abcd...[truncated 4 bytes]"
