"""The dashboard and the catalog listings at fleet size: synthetic catalogs of 100 / 1,000 / 10,000 worlds
(about 100 stage attempts per world over 30 nights) built through the catalog's own models' tables with bulk
inserts (executemany: the database's own trigger keeps the attempt rollups as it would for attempts recorded
one by one), then the time and the memory of every dashboard page and API answer and of the CLI listings
(`catalog ls`, `sets create`) at each size, with the growth from the smallest size to the largest.

    .venv/bin/python bench/scale.py [--sizes 100,1000,10000] [--db sqlite | --db postgresql://USER@HOST/DB]
                                    [--attempts-per-world 100] [--nights 30] [--repeat 3] [--workdir DIR]

`--db sqlite` builds each catalog in a file under the work directory; a PostgreSQL URL names a server whose
user may create databases: each size gets a database of its own (dropped afterwards). Time: the best of
`--repeat` requests (in-process, through the ASGI app). Memory: the peak of the Python heap during one more
request (tracemalloc) and the peak growth of the resident set over it (sampled every millisecond; a
database driver's buffers show there). A CLI listing runs as its own process: wall time, and its peak
resident set (start-up included). The last line is a JSON object of every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine, func, insert, select, text
from starlette.testclient import TestClient

from worldsmith.dashboard.app import dashboard_app
from worldsmith.models.catalog import (
    Environment,
    EnvironmentSet,
    EnvironmentSetMember,
    EnvironmentVersion,
    EvaluationRun,
    QualityReport,
    StageAttempt,
    TrainingRun,
    TrainingStep,
)
from worldsmith.models.evaluation import EvaluationScores
from worldsmith.storage.catalog import Catalog

#: The recorded stage names a world's generation goes through, in order (validation sends it back round).
STAGES = ("tasks", "database:schema", "database:seed", "tools:spec", "tools:code", "verifiers", "validate", "review")
ERROR_CLASSES = ("SchemaError", "SeedError", "TaskFormatError", "ToolCodeError", "VerifierError", "ProbeFailed")
CATEGORIES = ("retail", "travel", "finance", "health", "logistics", "education")
BACKENDS = (("openai", "big-model"), ("openai", "small-model"), ("procedural", "procedural-v1"))
RUNS_PER_NIGHT = 3
FIRST_NIGHT = datetime(2026, 10, 1, 1, 0, tzinfo=UTC)
BATCH = 20_000
PAGE_SIZE = 4096


def _rows_in_batches(rows: Iterator[dict[str, Any]], size: int = BATCH) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _attempts(env_id: str, run_id: str, start: datetime, count: int, rng: random.Random) -> Iterator[dict[str, Any]]:
    """`count` stage attempts of one world: rounds of its stages, each invocation a repair loop of 1-3 attempts."""
    made, moment = 0, start
    while made < count:
        for stage in STAGES:
            tries = min(rng.choice((1, 1, 1, 2, 2, 3)), count - made)
            for attempt in range(1, tries + 1):
                ok = attempt == tries and rng.random() < 0.8
                error = None if ok else rng.choice(ERROR_CLASSES)
                moment += timedelta(seconds=rng.randint(2, 40))
                yield {
                    "run_id": run_id,
                    "env_id": env_id,
                    "stage": stage,
                    "attempt": attempt,
                    "outcome": "success" if ok else ("transient" if rng.random() < 0.1 else "failure"),
                    "error_class": error,
                    "error_text": None if ok else f"{error}: line {rng.randint(1, 400)}: " + "x" * rng.randint(40, 400),
                    "tokens_in": rng.randint(500, 6000),
                    "tokens_out": rng.randint(100, 3000),
                    "cost_usd": rng.random() * 0.05,
                    "seconds": rng.random() * 30,
                    "created_at": moment,
                }
            made += tries
            if made >= count:
                return


def world(i: int, nights: int) -> tuple[str, str, datetime]:
    """World `i`'s env_id, the run that made it and when its generation started (one night of `nights`)."""
    night, slot = i % nights, (i // nights) % RUNS_PER_NIGHT
    run = str(uuid.UUID(int=night * RUNS_PER_NIGHT + slot + 1)) if slot else f"night-{night:02d}"
    start = FIRST_NIGHT + timedelta(days=night, minutes=slot * 20 + (i // nights // RUNS_PER_NIGHT) % 200)
    return f"world_{i:06d}_{CATEGORIES[i % len(CATEGORIES)]}", run, start


def build(catalog: Catalog, worlds: int, attempts_per_world: int, nights: int, seed: int = 0) -> dict[str, Any]:
    """Fill an empty `catalog`: `worlds` environments, one version each (about 15% failed) with two quality
    reports, their stage attempts, a set of the good ones, evaluation runs and training runs with steps."""
    rng = random.Random(seed)
    started = time.perf_counter()
    with catalog.session() as s:
        for batch in _rows_in_batches(
            {
                "env_id": world(i, nights)[0],
                "scenario_name": f"scenario {i}",
                "description": "a synthetic world",
                "categories": [CATEGORIES[i % len(CATEGORIES)]],
                "created_at": world(i, nights)[2],
            }
            for i in range(worlds)
        ):
            s.connection().execute(insert(Environment.__table__), batch)

        def version(i: int) -> dict[str, Any]:
            env_id, _, start = world(i, nights)
            failed = rng.random() < 0.15
            backend, model = BACKENDS[i % len(BACKENDS)]
            stage = rng.choice(STAGES)
            return {
                "env_id": env_id,
                "version": 1,
                "content_key": uuid.UUID(int=rng.getrandbits(128)).hex + uuid.UUID(int=i).hex,
                "manifest_digest": f"sha256:{i:064x}",
                "status": "failed" if failed else "good",
                "failure_reason": f"{stage}: {rng.choice(ERROR_CLASSES)} after 3 attempts" if failed else None,
                "failed_stage": stage if failed else None,
                "generator_backend": backend,
                "generator_model": model,
                "stats": {"tables": rng.randint(3, 12), "tools": rng.randint(5, 30), "tasks": rng.randint(5, 40)},
                "quality": {"expectations": {"passed": True}, "probes": {"passed": not failed}},
                "created_at": start + timedelta(hours=2),
            }

        for batch in _rows_in_batches(version(i) for i in range(worlds)):
            s.connection().execute(insert(EnvironmentVersion.__table__), batch)
        ids = s.execute(select(EnvironmentVersion.id, EnvironmentVersion.status)).all()
        reports = (
            {
                "version_id": vid,
                "kind": kind,
                "passed": kind == "expectations" or status == "good",
                "summary": {},
                "created_at": FIRST_NIGHT,
                "details": [],
            }
            for vid, status in ids
            for kind in ("expectations", "probes")
        )
        for batch in _rows_in_batches(reports):
            s.connection().execute(insert(QualityReport.__table__), batch)
    attempts = 0
    for chunk in range(0, worlds, 100):
        rows = (
            row
            for i in range(chunk, min(chunk + 100, worlds))
            for row in _attempts(*world(i, nights), attempts_per_world, rng)
        )
        with catalog.session() as s:
            for batch in _rows_in_batches(rows):
                s.connection().execute(insert(StageAttempt.__table__), batch)
                attempts += len(batch)
    with catalog.session() as s:
        good = [vid for vid, status in ids if status == "good"]
        for n, members in enumerate((good, good[: len(good) // 10])):
            env_set = EnvironmentSet(name=f"fleet-{n}", query={})
            s.add(env_set)
            s.flush()
            for batch in _rows_in_batches(
                {"set_id": env_set.id, "version_id": vid, "split": "validation" if k % 10 == 0 else "train"}
                for k, vid in enumerate(members)
            ):
                s.connection().execute(insert(EnvironmentSetMember.__table__), batch)
        for n in range(20):
            overall = EvaluationScores(
                episodes=400,
                tasks=100,
                k=4,
                pass_at_1=rng.random(),
                pass_at_k=rng.random(),
                mean_reward=0.5,
                mean_turns=4.0,
                env_error_rate=0.0,
                agent_error_rate=0.0,
                format_error_rate=0.0,
            ).model_dump()
            s.add(
                EvaluationRun(
                    set_id=env_set.id, policy=f"policy-{n}", samples=4, status="done", metrics={"overall": overall}
                )
            )
        for n in range(6):
            kind = ("grpo", "cotrain", "world_model")[n % 3]
            run = TrainingRun(set_id=env_set.id, config={"kind": kind, "model": "m"}, status="done")
            s.add(run)
            s.flush()
            steps = (
                {"training_run_id": run.id, "step": k, "metrics": {"reward": rng.random()}, "created_at": FIRST_NIGHT}
                for k in range(200)
            )
            s.connection().execute(insert(TrainingStep.__table__), list(steps))
    return {"worlds": worlds, "attempts": attempts, "build_s": round(time.perf_counter() - started, 1)}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_SIZE


@contextmanager
def rss_peak() -> Iterator[dict[str, int]]:
    """While the block runs, sample the resident set every millisecond; `growth`: its peak minus its start."""
    found = {"start": _rss(), "peak": _rss()}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.001):
            found["peak"] = max(found["peak"], _rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield found
    finally:
        done.set()
        sampler.join()
        found["peak"] = max(found["peak"], _rss())
        found["growth"] = found["peak"] - found["start"]


def targets(catalog: Catalog) -> dict[str, str]:
    """Every dashboard page and API answer, with arguments taken from the catalog (a middle night, a world,
    an attempt)."""
    with catalog.session() as s:
        night = s.execute(select(EnvironmentVersion.created_at).order_by(EnvironmentVersion.id).limit(1)).scalar_one()
        env_id = s.execute(select(Environment.env_id).order_by(Environment.env_id).limit(1)).scalar_one()
        attempt_id = s.execute(select(StageAttempt.id).where(StageAttempt.env_id == env_id).limit(1)).scalar_one()
    day = night.date().isoformat()
    return {
        "page /": "/",
        "page / (filter: category)": "/?category=travel",
        "page /nights/N": f"/nights/{day}",
        "page /nights/N/stages/S": f"/nights/{day}/stages/tasks",
        "page /nights/N/stages/S?error_class": f"/nights/{day}/stages/tasks?error_class=SchemaError",
        "page /worlds": "/worlds",
        "page /worlds (last page)": "/worlds?offset=1000000",
        "page /worlds?status=failed": "/worlds?status=failed",
        "page /failed-worlds": "/failed-worlds",
        "page /worlds/ENV": f"/worlds/{env_id}",
        "page /attempts/ID": f"/attempts/{attempt_id}",
        "api /api/summary": "/api/summary",
        "api /api/summary (filter: run)": "/api/summary?run=night-00",
        "api /api/summary (filter: dates)": f"/api/summary?date_from={day}&date_to={day}",
        "api /healthz": "/healthz",
    }


def measure(call: Callable[[], Any], repeat: int) -> dict[str, float]:
    """Best wall time and best CPU time of this process (all its threads) of `repeat` calls; peak Python heap
    (tracemalloc) and resident-set growth of one more. CPU time is the figure a loaded machine bends least (a
    PostgreSQL server's own work is not in it)."""
    times, cpu = [], []
    for _ in range(repeat):
        started, used = time.perf_counter(), time.process_time()
        call()
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - used)
    tracemalloc.start()
    with rss_peak() as rss:
        call()
    heap = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "s": round(min(times), 4),
        "cpu_s": round(min(cpu), 4),
        "heap_mb": round(heap / 2**20, 1),
        "rss_mb": round(rss["growth"] / 2**20, 1),
    }


def run_cli(url: str, home: Path, *args: str) -> dict[str, float]:
    """One `worldsmith` command as its own process: wall time, CPU time and peak resident set (read by
    /usr/bin/time, whose small process starts it: a child forked from this benchmark would count this
    process's own memory as its peak); raises if it fails."""
    env = {**os.environ, "WORLDSMITH_CATALOG_URL": url, "WORLDSMITH_HOME": str(home), "COLUMNS": "160"}
    figures = home / "time.txt"
    started = time.perf_counter()
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%M %U %S", "-o", str(figures), sys.executable, "-m", "worldsmith.cli", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=home,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"worldsmith {' '.join(args)} failed: {proc.stderr.decode()[-2000:]}")
    peak_kb, user, system = figures.read_text().split()[-3:]
    return {
        "s": round(elapsed, 3),
        "cpu_s": round(float(user) + float(system), 3),
        "rss_mb": round(int(peak_kb) / 1024, 1),
    }


def measure_cli(url: str, home: Path, repeat: int) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {}
    commands = {
        "cli catalog ls": ("catalog", "ls"),
        "cli catalog ls --json": ("catalog", "ls", "--json"),
        "cli sets ls": ("sets", "ls"),
    }
    for name, args in commands.items():
        runs = [run_cli(url, home, *args) for _ in range(repeat)]
        figures[name] = min(runs, key=lambda r: r["s"])
    runs = [run_cli(url, home, "sets", "create", f"bench-{uuid.uuid4().hex[:8]}") for _ in range(repeat)]
    figures["cli sets create"] = min(runs, key=lambda r: r["s"])
    return figures


@contextmanager
def database(db: str, workdir: Path, size: int, reuse: bool = False) -> Iterator[str]:
    """A fresh, empty database for one size: a SQLite file (`reuse`: the one a previous run left, if any), or a
    new database on the PostgreSQL server."""
    if db == "sqlite":
        path = workdir / f"catalog-{size}.db"
        if not reuse:
            for stale in workdir.glob(f"catalog-{size}.db*"):
                stale.unlink()
        yield f"sqlite:///{path}"
        return
    name = f"ws_scale_{size}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(db.replace("postgresql://", "postgresql+psycopg://"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield db.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000,10000", help="worlds per catalog, comma-separated")
    parser.add_argument("--db", default="sqlite", help="sqlite, or a PostgreSQL server URL (one database per size)")
    parser.add_argument("--attempts-per-world", type=int, default=100)
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3, help="requests timed per page (the best is kept)")
    parser.add_argument("--no-cli", action="store_true", help="skip the CLI listings")
    parser.add_argument("--workdir", type=Path, default=None, help="where SQLite catalogs go (default: a temp dir)")
    parser.add_argument(
        "--reuse", action="store_true", help="SQLite: measure the catalogs a previous run left in --workdir"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ws-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    results: dict[int, dict[str, Any]] = {}
    for size in sizes:
        with database(args.db, workdir, size, args.reuse) as url:
            catalog = Catalog(url)
            with catalog.session() as s:
                present = s.execute(select(func.count()).select_from(Environment)).scalar_one()
            if present == size:
                with catalog.session() as s:
                    attempts = s.execute(select(func.count()).select_from(StageAttempt)).scalar_one()
                built = {"worlds": size, "attempts": attempts, "build_s": None}
            else:
                built = build(catalog, size, args.attempts_per_world, args.nights)
            console.print(f"built {built['worlds']} worlds, {built['attempts']} attempts in {built['build_s']} s")
            client = TestClient(dashboard_app(catalog))
            figures: dict[str, Any] = {}
            for name, path in targets(catalog).items():

                def get(path: str = path) -> None:
                    answer = client.get(path)
                    if answer.status_code != 200:
                        raise RuntimeError(f"GET {path}: {answer.status_code} {answer.text[:500]}")

                figures[name] = measure(get, args.repeat)
                console.print(f"  {size:>6} {name:<42} {figures[name]}")
            if not args.no_cli:
                home = workdir / f"home-{size}"
                home.mkdir(exist_ok=True)
                for name, found in measure_cli(url, home, max(1, args.repeat - 1)).items():
                    figures[name] = found
                    console.print(f"  {size:>6} {name:<42} {found}")
            catalog.close()
            results[size] = {"build": built, "figures": figures}
    report(results, sizes, args.db)


def report(results: dict[int, dict[str, Any]], sizes: list[int], db: str) -> None:
    table = Table(title=f"dashboard and listings by catalog size ({'sqlite' if db == 'sqlite' else 'postgresql'})")
    table.add_column("page / answer / listing")
    for size in sizes:
        table.add_column(f"{size} worlds: s, cpu s, heap MB, rss MB", justify="right")
    if len(sizes) > 1:
        table.add_column(f"s, cpu s x ({sizes[0]} -> {sizes[-1]})", justify="right")
    for name in results[sizes[0]]["figures"]:
        cells = []
        for size in sizes:
            f = results[size]["figures"][name]
            cells.append(f"{f['s']:.3f} / {f['cpu_s']:.3f} / {f.get('heap_mb', '-')} / {f['rss_mb']}")
        if len(sizes) > 1:
            first, last = results[sizes[0]]["figures"][name], results[sizes[-1]]["figures"][name]
            cells.append(" / ".join(f"{last[k] / first[k]:.1f}" if first[k] else "-" for k in ("s", "cpu_s")))
        table.add_row(name, *cells)
    Console(width=200).print(table)
    print(json.dumps({"db": "sqlite" if db == "sqlite" else "postgresql", "sizes": results}))


if __name__ == "__main__":
    main()
