"""Every run has a status in `runs ls --json` and on the dashboard: running, completed, failed (a run that
died in the scenario stage says so; a run refused at its endpoint check has a page naming the failure),
cancelled (a real `generate` stopped by Ctrl-C) and crashed (a real `generate` killed with SIGKILL, or
a run whose recorded process is gone: pid and start time, so a reused pid is no alibi)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from support.llm_server import ProceduralLLM
from support.paths import REPO
from support.processes import killed_after, signalled_after
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.dashboard.app import dashboard_app
from worldsmith.settings import get_settings
from worldsmith.storage.catalog import Catalog

runner = CliRunner()


def listed(*args: str) -> list[dict]:
    result = runner.invoke(app, ["runs", "ls", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.unit
def test_every_status_of_evaluation_training_and_curation_runs_is_listed(home):
    from worldsmith.flows.interruption import Interrupted
    from worldsmith.flows.records import failed_on_error
    from worldsmith.models.catalog import EvaluationRun, RunRecord, TrainingRun
    from worldsmith.models.runs import RunKind, RunStatus
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.run_records import add_run, finish_run, open_record, update_run

    done = add_run(TrainingRun(config={"model": "tiny"}))
    finish_run(TrainingRun, done, RunStatus.COMPLETED, {"steps": 1})
    broken = add_run(EvaluationRun(policy="reference"))
    with pytest.raises(RuntimeError), failed_on_error(EvaluationRun, broken):
        raise RuntimeError("boom")
    stopped = add_run(EvaluationRun(policy="reference"))
    with pytest.raises(Interrupted), failed_on_error(EvaluationRun, stopped):
        raise Interrupted("stopped by SIGINT")
    alive = add_run(TrainingRun(config={"model": "tiny"}))  # this process: running
    gone = add_run(TrainingRun(config={"model": "tiny"}))
    no_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has it, ever
    update_run(TrainingRun, gone, {"process": {**_owner(), "pid": no_pid}})  # a process that has ended
    reused = add_run(TrainingRun(config={"model": "tiny"}))  # its pid lives, but started later: another process
    update_run(TrainingRun, reused, {"process": {**_owner(), "started": _owner()["started"] - 60}})
    open_record(RunKind.CURATE, "curation-1", "set nightly", None)
    finish_run(RunRecord, "curation-1", RunStatus.COMPLETED, {"members": 3})

    status = {(r["kind"], r["id"]): r["status"] for r in listed()}
    assert status == {
        ("train", str(done)): "completed",
        ("evaluate", str(broken)): "failed",
        ("evaluate", str(stopped)): "cancelled",
        ("train", str(alive)): "running",
        ("train", str(gone)): "crashed",
        ("train", str(reused)): "crashed",
        ("curate", "curation-1"): "completed",
    }
    with open_catalog().session() as session:
        assert session.get(TrainingRun, gone).status == "running"  # as recorded: `crashed` is what is read
    assert [r["id"] for r in listed("--kind", "curate")] == ["curation-1"]
    page = TestClient(dashboard_app(open_catalog())).get("/runs", params={"status": "crashed"}).text
    assert f'data-run="{gone}"' in page and f'data-run="{reused}"' in page and f'data-run="{alive}"' not in page


def _owner() -> dict:
    from worldsmith.storage.run_owner import this_process

    return this_process()


@pytest.mark.unit
def test_a_run_refused_at_its_endpoint_check_is_failed_with_a_page(home, monkeypatch):
    from worldsmith.localserver import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    monkeypatch.setenv("WORLDSMITH_LLM_BASE_URL", url)
    monkeypatch.setenv("WORLDSMITH_LLM_API_KEY", "sk-test")
    get_settings.cache_clear()
    refused = runner.invoke(app, ["generate", "--backend", "openai", "--count", "1"])
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    [run] = listed()
    assert run["kind"] == "generate" and run["status"] == "failed" and url in run["error"], run
    page = TestClient(dashboard_app(Catalog(f"sqlite:///{home / 'catalog.db'}"))).get(f"/runs/generate/{run['id']}")
    assert page.status_code == 200 and 'data-status="failed"' in page.text and url in page.text


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kind", "args", "words"),
    [
        ("cotrain", ["cotrain", "--set", "no-such-set"], "no environment set 'no-such-set'"),
        ("cotrain", ["cotrain", "--set", "x", "--model", "/no/such/model"], "--model /no/such/model: does not exist"),
        ("world-model", ["wm", "train", "{empty}"], "no transitions in the train split"),
    ],
    ids=["cotrain-set", "cotrain-model", "world-model-empty"],
)
def test_a_cotrain_or_world_model_run_refused_is_failed_with_a_page(home, tmp_path, kind, args, words):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    refused = runner.invoke(app, [a.format(empty=empty) for a in args])
    lines = refused.output.strip().splitlines()
    assert refused.exit_code == 2 and len(lines) == 1 and words in lines[0], refused.output
    [run] = listed("--kind", kind)
    assert run["status"] == "failed" and words in run["error"] and run["error"] == lines[0], run
    page = TestClient(dashboard_app(Catalog(f"sqlite:///{home / 'catalog.db'}"))).get(f"/runs/{kind}/{run['id']}")
    assert page.status_code == 200 and 'data-status="failed"' in page.text


@pytest.mark.flow
def test_a_run_that_died_in_the_scenario_stage_is_failed_there_never_succeeded(prefect_api, home, monkeypatch):
    llm = ProceduralLLM(faults={"scenario": ["malformed_json"]})
    with llm.serve() as background:
        monkeypatch.setenv("WORLDSMITH_LLM_BASE_URL", f"{background.url}/v1")
        monkeypatch.setenv("WORLDSMITH_LLM_API_KEY", "sk-test")
        get_settings.cache_clear()
        result = runner.invoke(
            app, ["generate", "--backend", "openai", "--count", "1", "--concurrency", "1", "--max-attempts", "1"]
        )
    assert result.exit_code == 1, result.output
    [run] = listed()
    assert (run["kind"], run["status"], run["failed_stage"]) == ("generate", "failed", "scenario"), run
    assert run["error"].startswith("the scenario stage failed") and run["flow_run_id"] == run["id"]

    client = TestClient(dashboard_app(Catalog(f"sqlite:///{home / 'catalog.db'}")))
    page = client.get(f"/runs/generate/{run['id']}").text
    assert 'data-status="failed"' in page and 'id="failed-stage"' in page and "the scenario stage failed" in page
    stage = client.get(f"/nights/{run['started_at'][:10]}/stages/scenario").text
    row = stage.split(f'data-run="{run["id"]}"')[1].split("</tr>")[0]
    assert ">failed<" in row and ">succeeded<" not in row, row


#: Worlds asked for (one at a time); seeds no other test's run uses.
COUNT, SEED = 3, 35135


@pytest.mark.e2e
@pytest.mark.timeout(600)  # one run of `worldsmith generate` up to its first world: about 15 s on 2 idle cores
@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGINT, "cancelled"), (signal.SIGKILL, "crashed")], ids=["sigint", "sigkill"]
)
def test_a_generate_stopped_or_killed_reads_cancelled_or_crashed(prefect_api, tmp_path: Path, signum, status):
    from prefect.settings import PREFECT_API_URL  # the session's test server (a settings context, not os.environ)

    home = tmp_path / "home"
    stop = killed_after if signum == signal.SIGKILL else lambda call: signalled_after(call, signum)
    env = dict(
        os.environ,
        WORLDSMITH_HOME=str(home),
        WORLDSMITH_SANDBOX_WORKERS="1",
        PREFECT_API_URL=PREFECT_API_URL.value(),
        **stop("worldsmith.storage.publish:publish"),
    )
    args = ["generate", "--count", str(COUNT), "--seed", str(SEED + signum), "--fault-rate", "0", "--concurrency", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "worldsmith.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
        start_new_session=True,  # SIGKILL takes its sandbox workers with it (its process group)
    )
    assert done.returncode in (128 + signum, -signum), done.stdout + done.stderr
    listing = subprocess.run(
        [sys.executable, "-m", "worldsmith.cli", "runs", "ls", "--json"],
        cwd=REPO,
        env={k: v for k, v in env.items() if not k.startswith("WORLDSMITH_TEST_KILL")},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    [run] = json.loads(listing.stdout)
    assert (run["kind"], run["status"]) == ("generate", status), run
    assert run["metrics"]["good"] >= 1  # the world published before the stop is the run's
    page = TestClient(dashboard_app(Catalog(f"sqlite:///{home / 'catalog.db'}"))).get("/runs").text
    assert f'data-run="{run["id"]}"' in page and f">{status}<" in page


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_ctrl_c_stops_eval_cancelled_in_one_line(prefect_api, home, golden):
    """A real `worldsmith eval` sent SIGINT after its first episode: exit 130 with one line, the
    evaluation run `cancelled`, its Prefect flow run Cancelled, no traceback."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    from worldsmith.models.sets import SetQuery
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.objectstore import open_store
    from worldsmith.storage.publish import publish
    from worldsmith.storage.sets import create_set

    store, catalog = open_store(get_settings().resolved_store_url()), open_catalog()
    publish(golden, store, catalog)
    create_set(catalog, "stopset", SetQuery(validation_fraction=0.0))
    env = dict(
        os.environ,
        PREFECT_API_URL=PREFECT_API_URL.value(),
        **signalled_after("worldsmith.agent.loop:run_episode", signal.SIGINT),
    )
    args = ["eval", "--set", "stopset", "--policy", "reference", "--concurrency", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "worldsmith.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=500
    )
    output = done.stdout + done.stderr
    assert done.returncode == 128 + signal.SIGINT, output
    assert "Traceback" not in output and len(output.splitlines()) < 20, output
    [line] = [line for line in done.stderr.splitlines() if line.startswith("interrupted by SIGINT: ")]
    assert "cancelled" in line, line
    [run] = listed("--kind", "evaluate")
    assert run["status"] == "cancelled", run
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run["flow_run_id"]).state_name == "Cancelled"


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_ctrl_c_stops_curate_before_its_set_is_made(prefect_api, home, golden):
    """A real `worldsmith curate` sent SIGINT once its run is recorded: exit 130 with one line saying the
    set was not made, no set, the curation run `cancelled`, its Prefect flow run Cancelled."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    from worldsmith.models.quality import QualityCheck
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.objectstore import open_store
    from worldsmith.storage.publish import publish

    passed = [QualityCheck(kind, True) for kind in ("expectations", "probes")]  # what the default query asks
    publish(golden, open_store(get_settings().resolved_store_url()), open_catalog(), passed)
    env = dict(
        os.environ,
        PREFECT_API_URL=PREFECT_API_URL.value(),
        **signalled_after("worldsmith.storage.run_records:open_record", signal.SIGINT),
    )
    done = subprocess.run(
        [sys.executable, "-m", "worldsmith.cli", "curate", "--name", "stopped"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 128 + signal.SIGINT, output
    assert "Traceback" not in output and len(output.splitlines()) < 10, output
    [line] = [line for line in done.stderr.splitlines() if line.startswith("interrupted by SIGINT: ")]
    assert "set stopped was not made" in line, line
    assert json.loads(runner.invoke(app, ["sets", "ls", "--json"]).output) == []
    [run] = listed("--kind", "curate")
    assert run["status"] == "cancelled", run
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run["flow_run_id"]).state_name == "Cancelled"
