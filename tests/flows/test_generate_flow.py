"""The `generate` flow on a real (test-harness) Prefect server: published, checked environments,
attempt records, artifacts, resuming after a kill without duplicates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import pytest
from sqlmodel import select
from support.paths import REPO
from support.patience import PROCESS_S
from support.processes import killed_after
from typer.testing import CliRunner

from worldsmith.bundle.kinds import NATIVE_TOOLS
from worldsmith.bundle.loader import build_bundle, load_bundle
from worldsmith.cli import app
from worldsmith.flows.generate import run_generate
from worldsmith.llm.errors import OutputFault
from worldsmith.models.catalog import EnvironmentVersion, StageAttempt
from worldsmith.models.generation import WorldOutcome
from worldsmith.settings import get_settings
from worldsmith.storage.catalog import Catalog, open_catalog
from worldsmith.storage.objectstore import configured_store
from worldsmith.storage.publish import publish
from worldsmith.tasks.parameters import GenerateParameters

pytestmark = pytest.mark.flow


def catalog_at(home: Path) -> Catalog:
    return Catalog(f"sqlite:///{home / 'catalog.db'}")


def _content(home: Path) -> set[tuple[str, int, str]]:
    with catalog_at(home).session() as session:
        return {(v.env_id, v.version, v.content_key) for v in session.exec(select(EnvironmentVersion)).all()}


#: The run of `generated`, which the killed run of `worldsmith generate` repeats.
REFERENCE = GenerateParameters(count=2, seed=3, fault_rate=0.5, concurrency=2)


@dataclass
class Generated:
    """One uninterrupted run of REFERENCE: its home, results, progress reports and catalog content."""

    home: Path
    results: list[WorldOutcome]
    seen: list[WorldOutcome]
    content: set[tuple[str, int, str]]
    run_id: str  # the Prefect flow run's id, which its attempts and artifacts carry


def _run_ids(home: Path) -> set[str]:
    with catalog_at(home).session() as session:
        return {a.run_id for a in session.exec(select(StageAttempt)).all()}


@pytest.fixture(scope="module")
def generated(prefect_api, tmp_path_factory: pytest.TempPathFactory) -> Generated:
    """REFERENCE run once, its worlds built on a local Dask cluster of one worker process, in a home
    of its own, for the tests that check what it made (the catalog's content as it was right after
    the run, whatever those tests do in that home later)."""
    home = tmp_path_factory.mktemp("generated") / "home"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORLDSMITH_HOME", str(home))
        patch.setenv("WORLDSMITH_SANDBOX_WORKERS", "2")
        patch.setenv("WORLDSMITH_TASK_RUNNER", "dask")
        patch.setenv("WORLDSMITH_DASK_WORKERS", "1")
        get_settings.cache_clear()
        seen: list[WorldOutcome] = []
        results = run_generate(REFERENCE, on_progress=seen.append)
    get_settings.cache_clear()
    (run_id,) = _run_ids(home)
    return Generated(home, results, seen, _content(home), run_id)


@pytest.fixture()
def generated_home(generated: Generated, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`generated`'s home as WORLDSMITH_HOME for one test."""
    monkeypatch.setenv("WORLDSMITH_HOME", str(generated.home))
    monkeypatch.setenv("WORLDSMITH_SANDBOX_WORKERS", "2")
    get_settings.cache_clear()
    yield generated.home
    get_settings.cache_clear()


def test_generate_flow_publishes_environments_that_pass_env_check(generated, generated_home, monkeypatch):
    home, params, results, seen = generated_home, REFERENCE, generated.results, generated.seen
    assert [r.status for r in results] == ["good"] * params.count and len(seen) == params.count
    catalog = catalog_at(home)
    with catalog.session() as session:
        versions = session.exec(select(EnvironmentVersion)).all()
        attempts = session.exec(select(StageAttempt)).all()
    assert len(versions) == params.count and all(
        v.status == "good" and v.generator_backend == "procedural" for v in versions
    )
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
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:  # this run's table: other tests' runs share the server
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["generation-stages"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(generated.run_id)]),
            )
        )
    assert len(artifacts) == 1
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
    assert [r.ref for r in again] == [r.ref for r in results]
    with catalog.session() as session:
        assert len(session.exec(select(EnvironmentVersion)).all()) == params.count
        assert len(session.exec(select(StageAttempt)).all()) == len(attempts)

    # A catalog that already holds the first world's very artifacts under another env_id: the (cached)
    # run makes that world again, byte for byte, and does not publish it a second time.
    fetched = load_bundle(home.parent / "copy")
    twin = build_bundle(
        {n: fetched.files[n] for n in NATIVE_TOOLS.source_files + NATIVE_TOOLS.optional_files if n in fetched.files},
        fetched.manifest.model_copy(update={"env_id": "twin_world", "version": None}),
    )
    monkeypatch.setenv("WORLDSMITH_CATALOG_URL", f"sqlite:///{home.parent / 'twins.db'}")
    get_settings.cache_clear()
    assert publish(twin, configured_store(), open_catalog(), dedupe=True).created
    third = run_generate(params)
    outcome = {r.env_id: (r.status, r.ref) for r in third}
    assert outcome.pop(fetched.env_id) == ("duplicate", "twin_world@1")
    assert [status for status, _ in outcome.values()] == ["good"] * (params.count - 1)
    with open_catalog().session() as session:
        published = sorted(v.env_id for v in session.exec(select(EnvironmentVersion)).all())
    assert published == sorted([*outcome, "twin_world"])


def _generate_process(home: Path, extra_env: dict[str, str]) -> subprocess.Popen:
    """`worldsmith generate` of REFERENCE's worlds, one at a time, in its own session against the
    session's Prefect server (`extra_env` added to its environment); its output goes to HOME.log (see `_log`)."""
    from prefect.settings import PREFECT_API_URL  # the session's test server (a settings context, not os.environ)

    env = dict(
        os.environ,
        WORLDSMITH_HOME=str(home),
        WORLDSMITH_SANDBOX_WORKERS="1",
        PREFECT_API_URL=PREFECT_API_URL.value(),
        **extra_env,
    )
    home.parent.mkdir(parents=True, exist_ok=True)
    args = ["--count", str(REFERENCE.count), "--seed", str(REFERENCE.seed), "--fault-rate", str(REFERENCE.fault_rate)]
    with open(f"{home}.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "worldsmith.cli", "generate", *args, "--concurrency", "1"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _log(home: Path) -> str:
    """The last lines the generate processes of HOME printed (for assertion messages)."""
    return "\n".join(Path(f"{home}.log").read_text(errors="replace").splitlines()[-40:])


@pytest.mark.e2e
def test_killed_run_resumes_to_the_same_catalog(generated, tmp_path):
    """SIGKILLed once its first world is published, then run again: the catalog an uninterrupted run
    of the same parameters made (`generated`), each world once."""
    interrupted = tmp_path / "interrupted"
    killed = _generate_process(interrupted, killed_after("worldsmith.storage.publish:publish")).wait(timeout=PROCESS_S)
    assert killed == -signal.SIGKILL, _log(interrupted)  # SIGKILLed as soon as its first environment was published
    partial = _content(interrupted)
    assert len(partial) == 1, partial

    assert _generate_process(interrupted, {}).wait(timeout=PROCESS_S) == 0, _log(interrupted)
    resumed = _content(interrupted)
    assert resumed == generated.content and len(resumed) == REFERENCE.count, (
        resumed ^ generated.content,
        _log(interrupted),
    )  # same environments, none twice
    assert partial <= resumed


class Unusable:
    """A model whose every answer is unusable: the repair loop of the stage that asks it runs out of attempts."""

    def __init__(self, model):
        self.backend, self.model = model.backend, model.model

    def generate(self, prompt, spec):
        raise OutputFault("no JSON object in the answer", text="I cannot help with that.")


def for_the_first_world(original, fail):
    """Stage function `original`, except for the first world that reaches it: `fail(original, work, *args)`;
    that world's env_id is in the returned function's `chosen`."""
    chosen: list[str] = []
    lock = threading.Lock()

    def stage(work, *args):
        with lock:
            chosen[:] = chosen or [work.env_id]
        return fail(original, work, *args) if work.env_id == chosen[0] else original(work, *args)

    stage.chosen = chosen
    return stage


def _crash(original, work, *args):
    raise IndexError("list index out of range")  # a bug anywhere below the stage (a backend, a check)


def test_a_run_below_its_good_share_ends_failed_publishing_its_failed_worlds_as_failed(
    prefect_api, home, monkeypatch, tables_at_a_fixed_width
):
    from worldsmith.dashboard.data import quality
    from worldsmith.storage.publish import version_record
    from worldsmith.tasks import generation

    exhausting = for_the_first_world(
        generation.run_database_stage, lambda original, work, model, *rest: original(work, Unusable(model), *rest)
    )
    crashing = for_the_first_world(generation.run_tools_stage, _crash)
    monkeypatch.setattr(generation, "run_database_stage", exhausting)
    monkeypatch.setattr(generation, "run_tools_stage", crashing)
    runner = CliRunner()
    args = ["--count", "3", "--seed", "4", "--concurrency", "2", "--max-attempts", "2", "--backend", "procedural"]
    result = runner.invoke(app, ["generate", *args, "--min-good-share", "0.75"])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines()[-1] == "1 of 3 worlds good (33%), below min_good_share 75%"
    assert "Traceback" not in result.output
    exhausted, crashed = exhausting.chosen[0], crashing.chosen[0]
    for env, stage in ((exhausted, "database"), (crashed, "tools")):  # the run's table: each failed world, its stage
        assert [line for line in result.output.splitlines() if env in line and "failed" in line and stage in line]

    listed = runner.invoke(app, ["catalog", "ls", "--status", "failed", "--json"])
    failed = {row["ref"].split("@")[0]: row for row in json.loads(listed.output)}
    assert set(failed) == {exhausted, crashed} and all(row["status"] == "failed" for row in failed.values())
    assert failed[exhausted]["failed_stage"].startswith("database")
    assert "failed after 2 attempts" in failed[exhausted]["failure_reason"]
    assert failed[crashed]["failed_stage"] == "tools"
    assert "IndexError: list index out of range" in failed[crashed]["failure_reason"]
    good = json.loads(runner.invoke(app, ["catalog", "ls", "--status", "good", "--json"]).output)
    assert len(good) == 1 and not {row["ref"].split("@")[0] for row in good} & {exhausted, crashed}

    with catalog_at(home).session() as session:
        versions = {v.env_id: v for v in session.exec(select(EnvironmentVersion)).all()}
        artifacts = {env: set(version_record(session, v)["artifacts"]) for env, v in versions.items()}
        attempts = session.exec(select(StageAttempt)).all()
        by_status = quality(session)["versions"]
    assert artifacts[crashed] >= {"schema.sql", "seed.sql", "work.json", "manifest.json", "FAILED.md"}  # what it got to
    assert "tools.py" not in artifacts[crashed] and "failed_attempt/error.txt" in artifacts[crashed]
    assert artifacts[exhausted] == {  # its tasks, then the schema's last attempt: prompt, answer, error
        "work.json",
        "manifest.json",
        "task_list.json",
        "FAILED.md",
        "failed_attempt/messages.json",
        "failed_attempt/answer.txt",
        "failed_attempt/error.txt",
    }
    assert by_status == {"failed": 2, "good": 1}  # what the dashboard counts
    crash_rows = [a for a in attempts if a.error_class == "IndexError"]
    assert [(a.env_id, a.stage, a.outcome) for a in crash_rows] == [(crashed, "tools", "failure")]
    assert "list index out of range" in crash_rows[0].error_text
    assert not [a for a in attempts if a.stage == "environment"]

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        table = client.read_artifacts(  # this run's: the newest
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["generation-environments"])),
            sort=ArtifactSort.CREATED_DESC,
        )[0]
        run = client.read_flow_run(table.flow_run_id)
    rows = table.data if isinstance(table.data, list) else json.loads(table.data)
    listed_failed = {row["env_id"]: row for row in rows if row["status"] == "failed"}
    assert set(listed_failed) == {exhausted, crashed} and all(row["reason"] for row in listed_failed.values())
    assert run.state.type.value == "FAILED" and run.state.message == result.output.strip().splitlines()[-1]


def test_generate_fans_out_on_a_dask_cluster(generated):
    assert [r.status for r in generated.results] == ["good"] * REFERENCE.count
    assert all(not r.built_by.endswith(f":{os.getpid()}") for r in generated.results)  # built in a Dask worker
    assert len(generated.content) == REFERENCE.count


class RunWide(Exception):
    """A fault of the whole run (wrong endpoint settings): marked `fatal` as the generator's faults are."""

    fatal = True


@pytest.mark.unit
def test_only_a_fatal_fault_stops_the_run():
    from worldsmith.flows.world_builds import fails_world_only
    from worldsmith.llm.errors import TransientFault

    assert fails_world_only(IndexError("list index out of range")) and fails_world_only(KeyError("tools"))
    assert fails_world_only(TransientFault("HTTP 503 after 3 retries"))  # outside a task: no retries left
    assert not fails_world_only(RunWide("the endpoint refused the API key: set WORLDSMITH_LLM_API_KEY"))


@pytest.mark.unit
def test_the_cli_answers_a_fatal_fault_in_one_line(monkeypatch):
    from worldsmith.flows import generate as generate_flow

    def stopped(params, on_progress=None):
        raise RunWide("the endpoint refused the API key: set WORLDSMITH_LLM_API_KEY")

    monkeypatch.setattr(generate_flow, "run_generate", stopped)
    result = CliRunner().invoke(app, ["generate", "--count", "1", "--backend", "procedural"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1] == "the endpoint refused the API key: set WORLDSMITH_LLM_API_KEY"
