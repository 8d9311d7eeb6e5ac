"""The operator's listings and look-ups as a user runs them, against a real catalog and Prefect API:
`sets ls`, `tasks ls`, `runs ls` (each with --json), `models fetch`, `curate` and `status`; missing
references answered in one line."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import GOLDEN, REPO
from support.patience import PROCESS_S, wait_until
from typer.testing import CliRunner

from worldsmith.bundle.contract import Bundle
from worldsmith.cli import app
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.localserver import free_port

runner = CliRunner()
pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("tables_at_a_fixed_width")]


def run(*args: str, code: int = 0) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result.output


def one_line_error(*args: str, code: int = 2) -> str:
    """The error of a refused command: exactly one line, no traceback."""
    out = run(*args, code=code).strip()
    assert "\n" not in out and "Traceback" not in out, out
    return out


def _publish(bundles: list[Bundle], passed: tuple[str, ...] = ()) -> None:
    """Publish `bundles`, each with the outcome of the quality checks `passed` (passed; running the
    checks themselves is what tests/quality/test_quality.py does)."""
    from worldsmith.models.quality import QualityCheck
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.objectstore import configured_store
    from worldsmith.storage.publish import publish

    for bundle in bundles:
        publish(bundle, configured_store(), open_catalog(), [QualityCheck(kind, True) for kind in passed])


@pytest.fixture()
def worlds(home: Path, golden: Bundle) -> list[Bundle]:
    """The golden bundle and two procedural worlds, published into a fresh catalog."""
    bundles = [golden, procedural_bundle("retail", 1), procedural_bundle("clinic", 1)]
    _publish(bundles)
    return bundles


def test_sets_ls_lists_every_set_with_its_splits(worlds):
    assert json.loads(run("sets", "ls", "--json")) == []
    run("sets", "create", "all", "--validation-fraction", "0.4")
    run("sets", "create", "two", "--count", "2", "--validation-fraction", "0")
    listed = {s["name"]: s for s in json.loads(run("sets", "ls", "--json"))}
    assert set(listed) == {"all", "two"}
    assert listed["all"]["members"] == len(worlds) and listed["all"]["validation"] >= 1
    assert listed["two"] == {**listed["two"], "members": 2, "train": 2, "validation": 0}
    assert all(s["train"] + s["validation"] == s["members"] for s in listed.values())
    table = run("sets", "ls")
    assert "2 environment sets" in table and "all" in table and "two" in table


def test_tasks_ls_lists_the_same_tasks_from_a_directory_or_a_reference(worlds, golden):
    expected = [(t.id, t.verifier, bool(t.solution)) for t in golden.tasks]
    from_dir = json.loads(run("tasks", "ls", str(GOLDEN), "--json"))
    assert [(t["id"], t["verifier"], t["reference_solution"]) for t in from_dir] == expected
    assert all(t["instruction"] for t in from_dir)
    assert json.loads(run("tasks", "ls", f"{golden.env_id}@1", "--json")) == from_dir
    assert json.loads(run("tasks", "ls", golden.env_id, "--json")) == from_dir  # the latest good version
    world = worlds[1]
    assert [t["id"] for t in json.loads(run("tasks", "ls", world.env_id, "--json"))] == [t.id for t in world.tasks]
    table = run("tasks", "ls", f"{golden.env_id}@1")
    assert f"{golden.env_id}@1: {len(expected)} tasks" in table and golden.tasks[0].id in table

    assert "no environment version 'nope'" in one_line_error("tasks", "ls", "nope")
    assert "no environment version 'retail_store@9'" in one_line_error("tasks", "ls", "retail_store@9")
    assert "bad reference" in one_line_error("tasks", "ls", "retail_store@x")


def test_tasks_ls_refuses_a_failed_world_without_a_bundle(home, golden):
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.objectstore import configured_store
    from worldsmith.storage.publish import publish_failed

    manifest = golden.manifest.model_copy(update={"env_id": "half_world"})
    files = {"schema.sql": golden.files["schema.sql"]}
    publish_failed(manifest, files, "tools", "ran out of attempts", configured_store(), open_catalog())
    assert "stopped at stage tools" in one_line_error("tasks", "ls", "half_world@1")


def _generation_run(worlds: list[Bundle], failing: str) -> str:
    """Stage attempts of one generation run over `worlds` and a world `failing` that published as failed."""
    from worldsmith.stages.attempts import AttemptLog
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.objectstore import configured_store
    from worldsmith.storage.publish import publish_failed

    run_id = str(uuid.uuid4())
    log = AttemptLog(run_id, open_catalog())
    for bundle in worlds:
        log.record(env_id=bundle.env_id, stage="tasks", attempt=1, outcome="success")
    log.record(env_id=failing, stage="tools", attempt=1, outcome="failure", error_text="no")
    log.record(env_id=failing, stage="tools", attempt=2, outcome="failure", error_text="still no")
    manifest = worlds[0].manifest.model_copy(update={"env_id": failing})
    publish_failed(manifest, {}, "tools", "ran out of attempts", configured_store(), open_catalog())
    return run_id


def _training_run(kind: str | None, steps: list[dict], final: Path | None, status: str = "completed") -> int:
    """A training run recorded as the flows record one: its row, step rows, and a final model in the store."""
    from worldsmith.models.catalog import TrainingRun
    from worldsmith.storage.run_records import add_run, finish_run, record_step
    from worldsmith.training.checkpoints import save_checkpoint

    config = {"model": "tiny", "set_name": "all"} if kind is None else {"kind": kind, "policy": {"model": "tiny"}}
    run_id = add_run(TrainingRun(config=config, flow_run_id=str(uuid.uuid4())))
    for number, metrics in enumerate(steps, start=1):
        record_step(run_id, number, metrics)
    if final is not None:
        save_checkpoint(run_id, final, len(steps), {"final": True})
    finish_run(TrainingRun, run_id, status, {"steps": len(steps)} if status == "completed" else {"error": "boom"})
    return run_id


def _in_the_next_second() -> None:
    """Return once the clock shows a later whole second than now: start times are listed to the second."""
    now = int(time.time())
    wait_until(lambda: int(time.time()) > now, "the clock's next second")


def test_runs_ls_lists_every_kind_newest_first(worlds, tmp_path):
    from worldsmith.models.catalog import EvaluationRun
    from worldsmith.storage.run_records import add_run, finish_run

    assert json.loads(run("runs", "ls", "--json")) == []
    generation = _generation_run(worlds, "broken_world")
    _in_the_next_second()
    evaluation = add_run(EvaluationRun(policy="reference", samples=2, flow_run_id=str(uuid.uuid4())))
    overall = {
        "episodes": 4,
        "tasks": 2,
        "pass@1": 1.0,
        "pass@2": 1.0,
        "mean_reward": 1.0,
        "mean_turns": 2.0,
        "env_error_rate": 0.0,
        "agent_error_rate": 0.0,
        "format_error_rate": 0.0,
    }
    finish_run(EvaluationRun, evaluation, "completed", {"overall": overall})
    _in_the_next_second()
    trained = _training_run(None, [{"reward": 0.1, "success_rate": 0.0}, {"reward": 0.5, "success_rate": 0.5}], None)
    _in_the_next_second()
    cotrained = _training_run("cotrain", [{"real_success_rate": 0.25}], None, status="failed")

    rows = json.loads(run("runs", "ls", "--json"))
    assert [(r["kind"], r["id"]) for r in rows] == [
        ("cotrain", str(cotrained)),
        ("train", str(trained)),
        ("evaluate", str(evaluation)),
        ("generate", generation),
    ]
    by_kind = {r["kind"]: r for r in rows}
    assert by_kind["generate"]["flow_run_id"] == generation and by_kind["generate"]["status"] is None
    assert (
        by_kind["generate"]["metrics"] | {"worlds": 4, "good": 3, "failed": 1, "attempts": 5}
        == by_kind["generate"]["metrics"]
    )
    assert by_kind["evaluate"]["status"] == "completed" and by_kind["evaluate"]["metrics"]["pass@2"] == 1.0
    assert by_kind["train"]["metrics"]["reward"] == 0.5 and by_kind["train"]["metrics"]["steps"] == 2
    assert by_kind["cotrain"]["status"] == "failed" and by_kind["cotrain"]["error"] == "boom"
    assert all(r["started_at"] for r in rows) and by_kind["train"]["flow_run_id"]

    assert [r["id"] for r in json.loads(run("runs", "ls", "--kind", "evaluate", "--json"))] == [str(evaluation)]
    assert [r["kind"] for r in json.loads(run("runs", "ls", "--limit", "2", "--json"))] == ["cotrain", "train"]
    table = run("runs", "ls")
    assert "4 runs, newest first" in table and "cotrain" in table and "boom" in table
    assert "invalid value" in one_line_error("runs", "ls", "--kind", "nightly").lower()


def test_models_fetch_writes_the_final_model_or_a_step(home, tmp_path):
    from worldsmith.training.checkpoints import save_checkpoint

    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text('{"layers": 2}')
    (model / "sub" / "weights.bin").write_bytes(os.urandom(256))
    run_id = _training_run(None, [{"reward": 0.2}, {"reward": 0.3}], model)
    save_checkpoint(run_id, model, 1, {"reward": 0.2})  # a trainer checkpoint of step 1

    out = run("models", "fetch", str(run_id), str(tmp_path / "copy"))
    assert f"final model of training run {run_id}" in out
    for name in ("config.json", "sub/weights.bin"):
        assert (tmp_path / "copy" / name).read_bytes() == (model / name).read_bytes()
    run("models", "fetch", str(run_id), str(tmp_path / "step1"), "--step", "1")
    assert (tmp_path / "step1" / "config.json").is_file()

    assert "not an empty directory" in one_line_error("models", "fetch", str(run_id), str(tmp_path / "copy"))
    assert "no training run 999" in one_line_error("models", "fetch", "999", str(tmp_path / "x"))
    assert "steps 1" in one_line_error("models", "fetch", str(run_id), str(tmp_path / "x"), "--step", "7")
    unfinished = _training_run(None, [{"reward": 0.1}], None, status="failed")
    save_checkpoint(unfinished, model, 1, {})
    refused = one_line_error("models", "fetch", str(unfinished), str(tmp_path / "x"), code=1)
    assert "stored no final model" in refused and "--step" in refused
    assert not (tmp_path / "x").exists()


@pytest.mark.flow
def test_curate_makes_each_named_set_once(home, golden, prefect_api):
    clinic = procedural_bundle("clinic", 2)
    _publish([golden], passed=("expectations", "probes"))
    _publish([clinic], passed=("expectations",))
    _publish([procedural_bundle("retail", 2)])  # no check passed: never curated
    daily = json.loads(run("curate", "--json"))  # as the deployment: expectations and probes passed
    assert daily["name"].startswith("curated-") and [m["ref"] for m in daily["members"]] == [f"{golden.env_id}@1"]
    made = json.loads(run("curate", "--name", "picked", "--require-passed", "expectations", "--json"))
    assert made["created"] and {m["ref"] for m in made["members"]} == {f"{golden.env_id}@1", f"{clinic.env_id}@1"}
    assert {s["name"]: s["members"] for s in json.loads(run("sets", "ls", "--json"))} == {daily["name"]: 1, "picked": 2}
    again = run("curate", "--name", "picked", "--require-passed", "expectations")
    assert f"set exists from the same query: picked: {len(made['members'])} environment versions" in again

    other = one_line_error("curate", "--name", "picked", "--require-passed", "expectations", "--count", "1")
    assert "already exists with another query" in other


def test_curate_refuses_what_cannot_be_made_before_any_flow_runs(home):
    """Unit tier: a refusal that started Prefect (a process) would fail here."""
    assert "no good environment version matches" in one_line_error("curate", "--name", "x", "--category", "nope")
    assert "validation_fraction" in one_line_error("curate", "--validation-fraction", "1.5")


def _status_process(home: Path, **env: str) -> subprocess.CompletedProcess:
    """`worldsmith status` as a user runs it on a machine where nothing runs."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    return subprocess.run(
        [sys.executable, "-m", "worldsmith.cli", "status"],
        cwd=REPO,
        env={**clean, "WORLDSMITH_HOME": str(home), "PREFECT_HOME": str(home / "prefect"), **env},
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
    )


@contextlib.contextmanager
def _hanging_up_api() -> Iterator[tuple[str, list[int]]]:
    """A Prefect API URL on loopback whose server closes every connection unanswered, and a count (one
    cell) of the connections it took."""
    server = socket.create_server(("127.0.0.1", 0))
    taken = [0]

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            taken[0] += 1
            connection.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/api", taken
    finally:
        server.close()


@pytest.mark.sandbox
def test_status_when_nothing_runs_exits_0_saying_so(tmp_path):
    done = _status_process(tmp_path / "home")
    assert done.returncode == 0, done.stderr
    assert "not running; `worldsmith up` starts it" in done.stdout and "no API configured" in done.stdout
    api = f"http://127.0.0.1:{free_port()}/api"  # nothing listens: refused
    done = _status_process(tmp_path / "home", PREFECT_API_URL=api)
    assert done.returncode == 0, done.stderr
    assert f"Prefect API {api}: not reachable" in done.stdout
    with _hanging_up_api() as (api, taken):  # an API that never answers costs one health check, no retries
        done = _status_process(tmp_path / "home", PREFECT_API_URL=api)
    assert done.returncode == 0 and f"Prefect API {api}: not reachable" in done.stdout, done.stderr
    assert taken == [1]


@pytest.mark.flow
def test_status_names_each_deployment_whose_pool_has_no_live_worker(home, prefect_api):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL  # the session's test server (a settings context, not os.environ)

    served, idle = f"served-{uuid.uuid4().hex[:6]}", f"idle-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        for pool in (served, idle):
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        client.send_worker_heartbeat(served, "worker-1", heartbeat_interval_seconds=int(PROCESS_S))  # live throughout
        flow_id = client.create_flow_from_name(f"train-{idle}")
        waiting = client.create_deployment(flow_id, "train", work_pool_name=idle)
        client.create_deployment(flow_id, "served", work_pool_name=served)
        stuck = client.create_flow_run_from_deployment(waiting)

    report = json.loads(run("status", "--json"))
    assert report["prefect"]["reachable"] and report["prefect"]["api_url"] == PREFECT_API_URL.value()
    pools = {p["name"]: p for p in report["prefect"]["pools"]}
    assert [(w["name"], w["live"]) for w in pools[served]["workers"]] == [("worker-1", True)]
    assert pools[idle]["workers"] == []
    deployments = {d["name"]: d for d in report["prefect"]["deployments"]}
    problem = deployments[f"train-{idle}/train"]["problem"]
    assert f"pool {idle} has no live worker" in problem and f"prefect worker start --pool {idle}" in problem
    assert deployments[f"train-{idle}/served"]["problem"] is None
    assert deployments[f"train-{idle}/served"]["live_workers"] == 1
    listed = {r["id"]: r for r in report["prefect"]["flow_runs"]}
    assert str(stuck.id) in listed and f"pool {idle} has no live worker" in listed[str(stuck.id)]["problem"]

    text = run("status")
    assert f"pool {served} (process" in text and "1 live worker(s): worker-1" in text
    assert f"train-{idle}/train: pool {idle} has no live worker" in text and stuck.name in text
