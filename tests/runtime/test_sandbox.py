"""Hostile generated code: each attempt is contained with an env_error naming the limit, the
worker that ran it is replaced, and other episodes go on untouched."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from support.bundles import with_tools
from support.limits import FAST_LIMITS, ISOLATIONS, PATIENT_LIMITS, code_process, isolated
from support.paths import REPO
from support.patience import PROCESS_S
from support.processes import kill_worker

from worldsmith.bundle.contract import artifact_digest
from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.worker_launch import WORKER_ENV

pytestmark = pytest.mark.sandbox

SECRET = "sk-planted-secret-0123456789"

# Each hostile tool, the limit its env_error must name, and a word its message must contain.
HOSTILE = {
    "read_passwd": ("def read_passwd(conn):\n    return open('/etc/passwd').read()\n", "filesystem", "/etc/passwd"),
    "write_outside": (
        "def write_outside(conn):\n    with open('/tmp/worldsmith-escape.txt', 'w') as f:\n        f.write('x')\n",
        "filesystem",
        "worldsmith-escape",
    ),
    "socket_connect": (
        "def socket_connect(conn):\n    import socket\n    s = socket.create_connection(('127.0.0.1', 22))\n",
        "import",
        "socket",
    ),
    "subprocess_run": (
        "def subprocess_run(conn):\n    import subprocess\n    return subprocess.check_output(['id']).decode()\n",
        "import",
        "subprocess",
    ),
    "os_system": ("def os_system(conn):\n    import os\n    return os.system('touch /tmp/pwned')\n", "import", "'os'"),
    "fork": ("def fork(conn):\n    import os\n    return os.fork()\n", "import", "'os'"),
    "infinite_loop": ("def infinite_loop(conn):\n    while True:\n        pass\n", "cpu", "CPU seconds"),
    "sleep_forever": ("def sleep_forever(conn):\n    import time\n    time.sleep(3600)\n", "timeout", "wall-clock"),
    "stuck_in_c": ("def stuck_in_c(conn):\n    return sum(range(10 ** 14))\n", "timeout", "killed and replaced"),
    "endless_sql": (
        (
            "def endless_sql(conn):\n"
            "    return conn.execute('WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c').fetchone()[0]\n"
        ),
        "cpu",
        "CPU seconds",
    ),
    "memory_bomb": (
        "def memory_bomb(conn):\n    blocks = []\n    while True:\n        blocks.append(bytes(64 * 1024 * 1024))\n",
        "memory",
        "memory limit",
    ),
    "deep_recursion": (
        "def deep_recursion(conn):\n    def down(n):\n        return down(n + 1) + 1\n    return down(0)\n",
        "recursion",
        "recursion depth",
    ),
    "ctypes_load": (
        "def ctypes_load(conn):\n    import ctypes\n    return ctypes.CDLL(None).getpid()\n",
        "import",
        "ctypes",
    ),
    "read_environ": ("def read_environ(conn):\n    import os\n    return dict(os.environ)\n", "import", "'os'"),
    "import_via_builtins": (
        "def import_via_builtins(conn):\n    return __builtins__['__import__']('os').getcwd()\n",
        "import",
        "'os'",
    ),
    "eval_trick": (
        "def eval_trick(conn):\n    return eval(\"__import__('os').getcwd()\")\n",
        "forbidden_builtin",
        "eval",
    ),
    "globals_trick": (
        (
            "def globals_trick(conn):\n"
            "    for cls in ().__class__.__base__.__subclasses__():\n"
            "        if cls.__name__ == '_wrap_close':\n"
            "            return cls.__init__.__globals__['system']('id')\n"
        ),
        "subprocess",
        "os.system",  # __globals__ is not audited by CPython; the call itself is
    ),
    "builtin_importer_trick": (
        (
            "def builtin_importer_trick(conn):\n"
            "    importer = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'BuiltinImporter'][0]\n"
            "    posix = importer.load_module('posix')\n"
            "    return posix.system('id')\n"
        ),
        "subprocess",
        "os.system",
    ),
    "frame_walk": (
        (
            "def frame_walk(conn):\n"
            "    try:\n"
            "        raise ValueError\n"
            "    except ValueError as exc:\n"
            "        return list(exc.__traceback__.tb_frame.f_back.f_globals)\n"
        ),
        "introspection",
        "tb_frame",
    ),
    "attach_file": (
        "def attach_file(conn):\n    conn.setlimit(10, 5)\n    conn.execute(\"ATTACH DATABASE '/etc/passwd' AS p\")\n",
        "database",
        "settings",
    ),
    "new_connection": (
        "def new_connection(conn):\n    import sqlite3\n    return sqlite3.connect('/tmp/x.db')\n",
        "database",
        "sqlite3.connect",
    ),
    "swallow_violation": (
        (
            "def swallow_violation(conn):\n"
            "    try:\n"
            "        import socket\n"
            "    except BaseException:\n"
            "        pass\n"
            "    return 'got away with it'\n"
        ),
        "import",
        "socket",
    ),
}


@pytest.fixture(scope="module")
def planted_secret() -> str:
    os.environ["OPENAI_API_KEY"] = SECRET  # planted in the parent: must never reach a worker
    yield SECRET
    os.environ.pop("OPENAI_API_KEY", None)


@pytest.fixture(scope="module")
def runtimes(planted_secret):
    """One runtime per isolation mode and limits, made on first use: `runtimes(mode, cpu_bound)`.
    `cpu_bound`: a wall-clock limit far above the CPU limit, so that on a busy machine, where a CPU
    second takes more than a second, a busy loop still trips the CPU limit first."""
    made: dict[tuple[str, bool], Runtime] = {}

    def runtime(mode: str, cpu_bound: bool = False) -> Runtime:
        if (mode, cpu_bound) not in made:
            patient_clock = dataclasses.replace(FAST_LIMITS, call_timeout_s=PATIENT_LIMITS.call_timeout_s)
            limits = patient_clock if cpu_bound else FAST_LIMITS
            made[mode, cpu_bound] = Runtime(limits=isolated(limits, mode), workers=1)
        return made[mode, cpu_bound]

    yield runtime
    for rt in made.values():
        rt.close()


@pytest.fixture(scope="module", params=ISOLATIONS)
def hostile_runtime(runtimes, request) -> Runtime:
    return runtimes(request.param)


@pytest.fixture(scope="module")
def hostile_bundle(golden):
    return with_tools(golden, "\n\n".join(src for src, _, _ in HOSTILE.values()), list(HOSTILE))


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("tool", list(HOSTILE))
def test_a_hostile_tool_is_contained_by_replacing_its_process(runtimes, hostile_bundle, tool, isolation):
    _, limit, words = HOSTILE[tool]
    hostile_runtime = runtimes(isolation, limit == "cpu")
    bystander = hostile_runtime.open_episode(hostile_bundle)  # shares the single worker
    culprit = hostile_runtime.open_episode(hostile_bundle)
    try:
        assert bystander.call_tool("update_customer_email", {"customer_id": 2, "email": "bystander@example.com"}).ok
        assert culprit.call_tool("get_customer", {"customer_id": 2}).ok
        culprit_process = code_process(culprit)

        result = culprit.call_tool(tool)

        assert result.status == "env_error", result
        assert result.limit == limit, result
        assert words in result.error, result.error
        assert SECRET not in (result.error + json.dumps(result.value))
        # the process that ran the code is gone; the bystander goes on with its own state
        assert code_process(culprit) != culprit_process
        assert bystander.call_tool("get_customer", {"customer_id": 2}).value["email"] == "bystander@example.com"
        # and the culprit's episode itself is still usable
        assert culprit.call_tool("get_customer", {"customer_id": 2}).value["email"] == "james.chen@example.com"
    finally:
        bystander.close()
        culprit.close()
    assert not Path("/tmp/worldsmith-escape.txt").exists()
    assert not Path("/tmp/pwned").exists()


def test_worker_environment_is_scrubbed(hostile_runtime, hostile_bundle):
    with hostile_runtime.open_episode(hostile_bundle) as episode:
        assert episode.call_tool("get_customer", {"customer_id": 1}).ok
        pid = hostile_runtime.pool.workers()[0].pid
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    names = {item.split(b"=", 1)[0].decode() for item in environ if item}
    assert names == set(WORKER_ENV)
    assert SECRET.encode() not in b"".join(environ)


def test_worker_runs_unprivileged_without_network(hostile_runtime, hostile_bundle):
    with hostile_runtime.open_episode(hostile_bundle) as episode:
        assert episode.call_tool("get_customer", {"customer_id": 1}).ok
        worker = hostile_runtime.pool.workers()[0]
        status = Path(f"/proc/{worker.pid}/status").read_text()
    if os.geteuid() == 0:
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1:] == [str(FAST_LIMITS.uid)] * 4
        assert worker.layers["unprivileged_uid"].startswith("on")
    assert "NoNewPrivs:\t1" in status
    assert worker.layers["seccomp"].startswith("on") == ("Seccomp:\t2" in status)


def test_other_episodes_survive_a_killed_worker(hostile_runtime, hostile_bundle):
    episodes = [hostile_runtime.open_episode(hostile_bundle) for _ in range(5)]
    try:
        for i, episode in enumerate(episodes):
            assert episode.call_tool("update_customer_email", {"customer_id": 3, "email": f"s{i}@example.com"}).ok
        kill_worker(hostile_runtime.pool.workers()[0].process)  # e.g. the OOM killer
        for i, episode in enumerate(episodes):
            assert episode.call_tool("get_customer", {"customer_id": 3}).value["email"] == f"s{i}@example.com"
            assert episode.relocations == 1
    finally:
        for episode in episodes:
            episode.close()


def test_a_relative_path_is_refused_as_outside_the_episode(hostile_runtime, golden):
    bundle = with_tools(
        golden,
        textwrap.dedent("""
        def scratch_file(conn):
            import json
            with open("notes.json", "w") as f:
                json.dump({"a": 1}, f)
            return "ok"
    """),
        ["scratch_file"],
    )
    with hostile_runtime.open_episode(bundle) as episode:
        result = episode.call_tool("scratch_file")
        # relative paths resolve against "/", outside the episode: refused like any other
        assert result.status == "env_error" and result.limit == "filesystem"


KERNEL_PROBE = r"""
import errno, json, os, socket, sys
sys.path.insert(0, sys.argv[2])
from worldsmith.runtime.sandbox import kernel
scratch = sys.argv[1]
layers = kernel.confine(uid=65534, memory_bytes=1 << 30, file_bytes=1 << 20, cpu_seconds=60,
                        read_paths=[], write_paths=[scratch])
out = {"layers": layers}
def attempt(name, fn):
    try:
        fn()
        out[name] = "allowed"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
attempt("read_passwd", lambda: open("/etc/passwd").read())
attempt("write_tmp", lambda: open("/tmp/worldsmith-kernel-escape", "w").write("x"))
attempt("write_scratch", lambda: open(os.path.join(scratch, "ok"), "w").write("x"))
attempt("socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
attempt("fork", lambda: os.waitpid(os.fork(), 0) if True else None)
attempt("exec", lambda: os.execv("/bin/true", ["true"]))
attempt("setuid_root", lambda: os.setuid(0))
print(json.dumps(out))
"""


def test_kernel_layers_hold_without_the_python_guard():
    """The layers below Python: what a full escape from the interpreter-level guard still meets."""
    scratch = Path(tempfile.mkdtemp(prefix="worldsmith-kernel-test-"))  # traversable by the sandbox uid
    if os.geteuid() == 0:
        os.chown(scratch, 65534, 65534)
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", KERNEL_PROBE, str(scratch), str(REPO)],
        capture_output=True,
        text=True,
        env=WORKER_ENV,
        timeout=PROCESS_S,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    layers = out["layers"]
    if layers["landlock"].startswith("on"):
        assert out["read_passwd"] == "EACCES"
        assert out["write_tmp"] == "EACCES"
    assert out["write_scratch"] == "allowed"
    if layers["seccomp"].startswith("on"):
        assert out["socket"] == "EPERM"
        assert out["fork"] in ("EPERM", "EAGAIN")
        assert out["exec"] == "EPERM"
        assert out["setuid_root"] == "EPERM"
    assert not Path("/tmp/worldsmith-kernel-escape").exists()


# -- the world's clock ------------------------------------------------------------------------------

WORLD_CLOCK = "2024-05-06T10:11:12"
#: Tools that read the clock every way generated code does; `stamp` writes what they read.
CLOCK_TOOLS = textwrap.dedent("""
    import datetime as dt
    import time
    from datetime import date, datetime, timedelta, timezone
    from worldsmith.runtime import now


    def clock_reads(conn):
        moment = datetime.now()
        sql = conn.execute(
            "SELECT datetime('now'), date(), strftime('%s', 'now'), unixepoch(), CURRENT_TIMESTAMP, CURRENT_DATE, "
            "datetime('now', '+1 day'), date('2020-02-03 10:00')"
        ).fetchone()
        return {
            "now": moment.isoformat(), "real_type": isinstance(moment, dt.datetime) and type(moment) == datetime,
            "tomorrow": (moment + timedelta(days=1)).isoformat(), "utcnow": datetime.utcnow().isoformat(),
            "aware": datetime.now(timezone.utc).isoformat(), "today": date.today().isoformat(),
            "module_today": dt.date.today().isoformat(), "time": time.time(), "time_ns": time.time_ns(),
            "localtime": list(time.localtime())[:6], "strftime": time.strftime("%Y-%m-%d %H:%M:%S"),
            "runtime_now": now().isoformat(), "from_time": datetime.fromtimestamp(time.time()).isoformat(),
            "made": datetime(2024, 1, 1).isoformat(), "sql": list(sql),
        }


    def stamp(conn):
        for key, value in [("py", datetime.now()), ("date", date.today()), ("time", time.time()), ("now", now())]:
            conn.execute("INSERT INTO store_settings (key, value) VALUES (?, ?)", ("stamp_" + key, str(value)))
        conn.execute("INSERT INTO store_settings (key, value) VALUES ('stamp_sql', datetime('now'))")
        conn.execute("INSERT INTO store_settings (key, value) VALUES ('stamp_kw', CURRENT_TIMESTAMP)")
""")


def clocked(bundle, clock: str | None):
    return dataclasses.replace(bundle, manifest=bundle.manifest.model_copy(update={"clock": clock}))


@pytest.fixture(scope="module")
def clock_tools(golden):
    return clocked(with_tools(golden, CLOCK_TOOLS, ["clock_reads", "stamp"]), WORLD_CLOCK)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_native_tools_read_the_worlds_clock(runtimes, clock_tools, isolation):
    from datetime import UTC, datetime, timedelta

    instant = datetime.fromisoformat(WORLD_CLOCK)
    epoch = instant.replace(tzinfo=UTC).timestamp()
    rt = runtimes(isolation)
    with rt.open_episode(clock_tools) as first, rt.open_episode(clock_tools, clock_skew_s=90_061.5) as later:
        reads = first.call_tool("clock_reads").value
        assert reads == later.call_tool("clock_reads").value  # another real clock, the same answers
        assert reads["now"] == reads["utcnow"] == reads["runtime_now"] == reads["from_time"] == instant.isoformat()
        assert reads["real_type"] and reads["tomorrow"] == (instant + timedelta(days=1)).isoformat()
        assert reads["aware"] == instant.replace(tzinfo=UTC).isoformat()
        assert reads["today"] == reads["module_today"] == instant.date().isoformat()
        assert reads["time"] == epoch and reads["time_ns"] == int(epoch) * 10**9
        assert reads["localtime"] == list(instant.timetuple())[:6]
        assert reads["strftime"] == instant.strftime("%Y-%m-%d %H:%M:%S")
        assert reads["made"] == "2024-01-01T00:00:00"
        spaced = instant.isoformat(" ")
        assert reads["sql"] == [
            spaced,
            instant.date().isoformat(),
            str(int(epoch)),
            int(epoch),
            spaced,
            instant.date().isoformat(),
            (instant + timedelta(days=1)).isoformat(" "),
            "2020-02-03",  # a date that is not 'now' is the built-in's answer
        ]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_writes_of_the_time_replay_to_the_same_database_at_any_real_time(runtimes, clock_tools, isolation):
    rt = runtimes(isolation)
    with rt.open_episode(clock_tools) as first, rt.open_episode(clock_tools, clock_skew_s=90_061.5) as later:
        assert first.call_tool("stamp").ok and later.call_tool("stamp").ok
        assert first.diff(later.snapshot()).empty  # two runs at different real times: the same database


def test_a_world_without_a_clock_keeps_the_real_time(runtimes, golden):
    import time

    bundle = clocked(with_tools(golden, CLOCK_TOOLS, ["clock_reads"]), None)
    with runtimes("fast").open_episode(bundle) as episode:
        before = time.time()
        reads = episode.call_tool("clock_reads").value
        after = time.time()
    assert before <= reads["time"] <= after  # read during the call, whatever the call took


def test_verifiers_read_the_worlds_clock(runtimes, golden):
    source = (
        "import datetime\n\n\ndef verify_clock(initial, final, answer):\n"
        "    sql = final.execute(\"SELECT datetime('now')\").fetchone()[0]\n"
        "    return {'status': 'complete', 'evidence': {'now': datetime.datetime.now().isoformat(), 'sql': sql}}\n"
    )
    files = dict(golden.files, **{"verifiers.py": golden.files["verifiers.py"] + b"\n\n" + source.encode()})
    artifacts = dict(golden.manifest.artifacts, **{"verifiers.py": artifact_digest(files["verifiers.py"])})
    task = golden.tasks[0].model_copy(update={"verifier": "verify_clock"})
    manifest = golden.manifest.model_copy(update={"artifacts": artifacts, "clock": WORLD_CLOCK})
    bundle = dataclasses.replace(golden, manifest=manifest, files=files, tasks=(task,))
    with runtimes("strict").open_episode(bundle, task) as episode:
        evidence = episode.verify("").evidence
    assert evidence == {"now": WORLD_CLOCK, "sql": WORLD_CLOCK.replace("T", " ")}


@pytest.mark.unit
def test_tools_may_import_the_worlds_clock():
    from worldsmith.bundle.codepolicy import check_source

    assert check_source("from worldsmith.runtime import ToolError, now\n", "tools.py") == []
    assert check_source("from worldsmith.runtime import Runtime\n", "tools.py")
