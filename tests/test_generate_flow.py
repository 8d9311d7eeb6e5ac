"""The `generate` flow on a real (test-harness) Prefect server: published, checked environments,
attempt records, artifacts, resuming after a kill without duplicates."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, killed_after
from sqlmodel import select
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.flows.generate import run_generate
from worldsmith.models.catalog import EnvironmentVersion, StageAttempt
from worldsmith.settings import get_settings
from worldsmith.storage.catalog import Catalog
from worldsmith.tasks.generation_run import GenerateParameters


def catalog_at(home: Path) -> Catalog:
    return Catalog(f"sqlite:///{home / 'catalog.db'}")


def test_generate_flow_publishes_environments_that_pass_env_check(prefect_api, home):
    params = GenerateParameters(count=3, seed=3, fault_rate=0.5, concurrency=2)
    seen: list[dict] = []
    results = run_generate(params, on_progress=seen.append)
    assert [r["status"] for r in results] == ["good"] * 3 and len(seen) == 3
    catalog = catalog_at(home)
    with catalog.session() as session:
        versions = session.exec(select(EnvironmentVersion)).all()
        attempts = session.exec(select(StageAttempt)).all()
    assert len(versions) == 3 and all(v.status == "good" and v.generator_backend == "procedural" for v in versions)
    assert {a.stage for a in attempts} >= {
        "scenario",
        "tasks",
        "database:schema",
        "database:seed",
        "tools:spec",
        "tools:code",
        "verifiers",
        "validate",
    }
    repaired = [a for a in attempts if a.outcome == "failure"]
    assert repaired and all(a.error_text for a in repaired)

    runner = CliRunner()
    fetched = runner.invoke(app, ["catalog", "fetch", versions[0].ref, str(home.parent / "copy")])
    assert fetched.exit_code == 0, fetched.output
    check = runner.invoke(app, ["env", "check", str(home.parent / "copy")])
    assert check.exit_code == 0 and ", 0 failed" in check.output

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["generation-stages"]))
        )
    stages = {row["stage"]: row for row in artifacts[0].data} if isinstance(artifacts[0].data, list) else None
    if stages is None:
        import json

        stages = {row["stage"]: row for row in json.loads(artifacts[0].data)}
    assert set(stages) >= {"tasks", "validate"} and {
        "first_attempt_success",
        "repair_rate",
        "failure_rate",
        "mean_attempts",
        "tokens_in",
        "cost_usd",
    } <= set(stages["tasks"])

    again = run_generate(params)  # everything cached: same environments, nothing new
    assert [r["ref"] for r in again] == [r["ref"] for r in results]
    with catalog.session() as session:
        assert len(session.exec(select(EnvironmentVersion)).all()) == 3
        assert len(session.exec(select(StageAttempt)).all()) == len(attempts)


def _generate_process(home: Path, count: int, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """`worldsmith generate` in its own session (`extra_env` added to its environment); its output
    goes to HOME.log (see `_log`)."""
    env = dict(os.environ, WORLDSMITH_HOME=str(home), WORLDSMITH_SANDBOX_WORKERS="1", **(extra_env or {}))
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{home}.log", "ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "worldsmith.cli",
                "generate",
                "--count",
                str(count),
                "--seed",
                "8",
                "--fault-rate",
                "0.5",
                "--concurrency",
                "1",
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _log(home: Path) -> str:
    """The last lines the generate processes of HOME printed (for assertion messages)."""
    return "\n".join(Path(f"{home}.log").read_text(errors="replace").splitlines()[-40:])


def _content(home: Path) -> set[tuple[str, int, str]]:
    with catalog_at(home).session() as session:
        return {(v.env_id, v.version, v.content_key) for v in session.exec(select(EnvironmentVersion)).all()}


@pytest.mark.slow
@pytest.mark.timeout(900)  # three runs of `worldsmith generate`: about 50 s on 2 idle cores
def test_killed_run_resumes_to_the_same_catalog(prefect_api, tmp_path):
    interrupted, clean = tmp_path / "interrupted", tmp_path / "clean"
    killed = _generate_process(interrupted, 6, killed_after("worldsmith.storage.publish:publish")).wait(timeout=300)
    assert killed == -signal.SIGKILL, _log(interrupted)  # SIGKILLed as soon as its first environment was published
    partial = _content(interrupted)
    assert len(partial) == 1, partial

    assert _generate_process(interrupted, 6).wait(timeout=300) == 0, _log(interrupted)
    assert _generate_process(clean, 6).wait(timeout=300) == 0, _log(clean)
    resumed = _content(interrupted)
    assert resumed == _content(clean) and len(resumed) == 6, (
        resumed ^ _content(clean),
        _log(interrupted),
    )  # same environments, none twice
    assert partial <= resumed


def test_an_environment_whose_stage_runs_out_of_attempts_is_recorded_as_failed(prefect_api, home):
    # seed 21: the scenario stage's first attempt is clean at this fault rate, the environment's stages are not
    results = run_generate(GenerateParameters(count=1, seed=21, fault_rate=0.9, max_attempts=1, concurrency=1))
    assert results[0]["status"] == "failed" and "failed after 1 attempts" in results[0]["reason"]
    with catalog_at(home).session() as session:
        assert session.exec(select(EnvironmentVersion)).all() == []  # nothing failed is published as good
        marks = session.exec(select(StageAttempt).where(StageAttempt.stage == "environment")).all()
    assert len(marks) == 1 and marks[0].env_id == results[0]["env_id"] and marks[0].error_class.endswith("_exhausted")


@pytest.mark.slow
def test_generate_fans_out_on_a_dask_cluster(prefect_api, home, monkeypatch):
    monkeypatch.setenv("WORLDSMITH_TASK_RUNNER", "dask")
    monkeypatch.setenv("WORLDSMITH_DASK_WORKERS", "1")
    monkeypatch.setenv("WORLDSMITH_SANDBOX_WORKERS", "1")
    get_settings.cache_clear()
    results = run_generate(GenerateParameters(count=2, seed=6, concurrency=2))
    assert [r["status"] for r in results] == ["good", "good"]
    assert all(not r["built_by"].endswith(f":{os.getpid()}") for r in results)  # built in a Dask worker process
    with catalog_at(home).session() as session:
        assert len(session.exec(select(EnvironmentVersion)).all()) == 2
