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
from conftest import FAST_LIMITS, REPO, with_tools

from worldsmith.bundle import sqlscript
from worldsmith.bundle.contract import Bundle, artifact_digest
from worldsmith.bundle.errors import BundleError
from worldsmith.bundle.loader import build_bundle
from worldsmith.quality.probes import check_environment
from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.errors import WorkerLost
from worldsmith.runtime.pool import WORKER_ENV, StderrTail
from worldsmith.runtime.sandbox import kernel
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
}


def _judged(episode) -> tuple:
    """What an untouched episode of the witness environment answers: its probe and its verdict."""
    return episode.call_tool("probe").value, episode.verify("").model_dump()


@pytest.mark.parametrize("attack", TAMPERING, ids=TAMPERING)
def test_module_state_rebound_by_one_world_reaches_no_other_episode(golden, attack):
    source, name = TAMPERING[attack]
    culprit_env = with_tools(golden, source, ["tamper"])
    witness_env = with_tools(golden, PROBE, ["probe"])
    task = golden.tasks[0].id
    with Runtime(limits=FAST_LIMITS, workers=1) as rt:
        with rt.open_episode(witness_env, task) as witness:
            before = _judged(witness)
        with (
            rt.open_episode(witness_env, task) as other_world,
            rt.open_episode(culprit_env, task) as same_world,
            rt.open_episode(culprit_env, task) as culprit,
        ):
            assert same_world.call_tool("update_customer_email", {"customer_id": 2, "email": "b@example.com"}).ok
            assert other_world._worker is not culprit._worker  # one world's code never runs in another's worker
            worker = culprit._worker
            result = culprit.call_tool("tamper")
            assert result.status == "env_error" and result.limit == "module_state", result
            assert "modified module state" in result.error and name in result.error, result.error
            assert not worker.alive  # retired: it never runs another call
            assert _judged(other_world) == before
            # environment A goes on, on a fresh worker: its other episode kept its writes, a new one is judged as before
            assert _email(same_world, 2) == "b@example.com" and same_world.relocations == 1
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


def test_random_and_decimal_state_is_not_carried_between_calls(runtime, golden):
    import random

    bundle = with_tools(golden, RANDOM_TOOLS, ["set_state", "draw", "save_draw", "saved"])
    with runtime.open_episode(bundle) as episode, runtime.open_episode(bundle) as other:
        assert episode.call_tool("set_state").ok
        drawn = [episode.call_tool("draw").value, other.call_tool("draw").value, episode.call_tool("draw").value]
        assert all(d["random"] != random.Random(42).random() for d in drawn), drawn
        assert all(d["seventh"] == "0.1428571428571428571428571429" for d in drawn), drawn
        assert len({d["random"] for d in drawn}) == 3  # each call its own seed
        # a write that depends on random replays exactly after the worker is lost: the seed is journaled
        assert episode.call_tool("save_draw").ok
        value = episode.call_tool("saved").value
        episode._worker.process.kill()
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


def _host_ipc() -> dict[str, list[str]]:
    """The SysV IPC objects of this (the host's) IPC namespace."""
    return {kind: Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:] for kind in ("shm", "msg", "sem")}


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
        timeout=60,
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


def test_a_pathological_string_annotation_is_an_issue_naming_the_tool():
    from worldsmith.bundle import toolspec

    for nesting in ("-" * 100_000 + "1", "a." * 100_000 + "b", "-" * 1_000 + "1"):
        source = (
            f'def f(conn, x: \'{nesting}\') -> int:\n    """F.\n\n    Args:\n        x: X.\n    """\n    return 1\n'
        )
        _, issues = toolspec.derive_tool_schemas(source)
        assert issues and all(i.file == "tools.py" for i in issues)
        assert any("'f'" in i.problem and "too deeply nested" in i.problem for i in issues), issues


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
    (["env", "call", "{}", "nested"], "deep_result", '"limit": "recursion"'),
    # the parent decodes it (and cannot print it) or, on a deeper stack, refuses the frame: either way an answer
    (["env", "call", "{}", "nested"], "printable_deep_result", "cannot print the result|limit"),
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
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "env serve did not start serving"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        made = [p.name for p in temp.iterdir()]
        assert any(name.startswith("worldsmith-sandbox-") for name in made), made
        proc.send_signal(signum)
        proc.wait(timeout=30)
        assert list(temp.iterdir()) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


def test_a_forged_reply_content_retires_the_worker_and_the_episode_goes_on(golden):
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
    with Runtime(limits=FAST_LIMITS, workers=1) as rt, rt.open_episode(forging_env, task) as episode:
        assert episode.call_tool("update_customer_email", {"customer_id": 2, "email": "b@example.com"}).ok
        worker = episode._worker
        result = episode.call_tool("forge")
        assert result.status == "env_error" and result.limit == "protocol", result
        assert "invalid reply" in result.error
        assert not worker.alive and episode._worker is not worker
        assert _email(episode, 2) == "b@example.com"
        assert episode.verify("").status in {"complete", "partial", "incomplete"}
