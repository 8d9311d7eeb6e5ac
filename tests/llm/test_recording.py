"""Record and replay of model answers: `generate --record DIR` keeps every request and answer, the
`replay:DIR` backend answers from them (offline), and the run's backend comes from configuration."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from sqlmodel import select
from support.llm_server import ProceduralLLM
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.llm.backend import Prompt
from worldsmith.llm.procedural.backend import ProceduralGenerator
from worldsmith.llm.recording import RecordingGenerator, ReplayGenerator, ReplayMiss
from worldsmith.models.bundle import Scenario
from worldsmith.models.catalog import EnvironmentVersion
from worldsmith.models.specs import TaskList
from worldsmith.settings import get_settings
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.pipeline import build_environment
from worldsmith.storage.catalog import Catalog
from worldsmith.tasks.generation_run import embedder, make_generator
from worldsmith.tasks.parameters import GenerateParameters

pytestmark = pytest.mark.unit

SHOP = Scenario(name="Corner Shop", description="A corner shop sells groceries: customers order, pay and return items.")
LIBRARY = Scenario(name="Town Library", description="A library lends books: members borrow, renew and return them.")


def _attempts(log: AttemptLog) -> list[tuple]:
    return [(a.stage, a.attempt, a.outcome, a.error_class, a.tokens_in, a.tokens_out, a.cost_usd) for a in log.attempts]


@pytest.mark.sandbox
def test_a_replay_answers_as_the_recorded_run_did(runtime, tmp_path: Path):
    # half the first attempts fail like LLM output: recorded failures must replay as the same failures
    recorded_log, replayed_log = AttemptLog("recorded"), AttemptLog("replayed")
    recorder = RecordingGenerator(ProceduralGenerator(seed=4, fault_rate=0.5), tmp_path / "night")
    recorded = build_environment(SHOP, 4, recorder, runtime, recorded_log)
    assert recorded.good, recorded.reason

    replay = ReplayGenerator(tmp_path / "night")
    replayed = build_environment(SHOP, 4, replay, runtime, replayed_log)
    assert replayed.good and replayed.bundle.key == recorded.bundle.key  # the same world
    assert _attempts(replayed_log) == _attempts(recorded_log)  # same repairs, same tokens and cost
    assert any(a.outcome == "failure" for a in recorded_log.attempts)
    generator = replayed.bundle.manifest.generator
    assert (generator.backend, generator.model) == ("replay", ProceduralGenerator.model)


def test_a_request_missing_from_the_recording_is_a_fatal_miss_naming_where_to_look(tmp_path: Path):
    recorder = RecordingGenerator(ProceduralGenerator(seed=1), tmp_path / "rec")
    context = {"scenario": SHOP.model_dump(), "seed": 1, "env_id": "corner_shop_1"}
    recorder.generate(Prompt("tasks", "Write tasks.", f"World: {SHOP.name}", context), TaskList)

    replay = ReplayGenerator(tmp_path / "rec")
    asked = {"scenario": LIBRARY.model_dump(), "seed": 1, "env_id": "town_library_1"}
    with pytest.raises(ReplayMiss) as miss:
        replay.generate(Prompt("tasks", "Write tasks.", f"World: {LIBRARY.name}", asked), TaskList)
    assert miss.value.fatal  # the run stops: replaying on would only miss again
    message = str(miss.value)
    assert "stage tasks" in message and "town_library_1" in message and str(tmp_path / "rec") in message


def test_threads_recording_at_once_keep_every_answer_whole(tmp_path: Path):
    recorder = RecordingGenerator(ProceduralGenerator(seed=2), tmp_path / "rec")
    context = {"scenario": SHOP.model_dump(), "seed": 2, "env_id": "corner_shop_2"}
    same = Prompt("tasks", "Write tasks.", "the same request from every thread", context)
    start = threading.Barrier(8)
    answers: list[str] = []

    def ask(index: int) -> None:
        start.wait()
        for _ in range(3):
            answers.append(recorder.generate(same, TaskList).raw)
            recorder.generate(Prompt("tasks", "Write tasks.", f"request of thread {index}", context), TaskList)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    files = list((tmp_path / "rec" / "answers").iterdir())
    assert len(files) == 8 * 3 * 2 and all(json.loads(f.read_text())["text"] for f in files)  # none lost, none torn
    replay = ReplayGenerator(tmp_path / "rec")
    assert sorted(replay.generate(same, TaskList).raw for _ in answers) == sorted(answers)  # each ask its own answer


def test_scenario_dedup_embeddings_replay_with_their_recorded_model(tmp_path: Path):
    from worldsmith.llm.openai_backend import OpenAIGenerator

    with ProceduralLLM().serve() as background:
        live = OpenAIGenerator(model="writer", base_url=f"{background.url}/v1", retries=0)
        recorder = RecordingGenerator(live, tmp_path / "rec")
        vectors = embedder_of(recorder, "embedder-1")(["a shop sells food", "a library lends books"])
    replay = ReplayGenerator(tmp_path / "rec")
    assert replay.embeddings_model == "embedder-1"  # dedup replays with the recorded model, whatever is configured
    assert embedder(replay)(["a shop sells food", "a library lends books"]) == vectors
    assert embedder(RecordingGenerator(ProceduralGenerator(), tmp_path / "procedural")) is None  # it has none


def embedder_of(generator, model: str):
    return lambda texts: generator.embed(texts, model)


def test_a_replay_of_a_directory_without_a_recording_is_refused_in_one_line(tmp_path: Path):
    missing = tmp_path / "no-such-night"
    result = CliRunner().invoke(app, ["generate", "--backend", f"replay:{missing}"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and f"no recording at {missing}" in lines[0], result.output
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no recorded generator"):
        GenerateParameters(backend=f"replay:{tmp_path / 'empty'}")
    with pytest.raises(ValueError, match="unknown backend"):
        GenerateParameters(backend="telepathy")


def test_an_unset_backend_is_the_configured_one(home, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    assert GenerateParameters().dated().backend == "procedural"  # no endpoint configured
    monkeypatch.setenv("WORLDSMITH_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    get_settings.cache_clear()
    assert GenerateParameters().dated().backend == "openai" and make_generator(GenerateParameters()).backend == "openai"
    assert GenerateParameters(backend="procedural").dated().backend == "procedural"  # given: kept
    RecordingGenerator(ProceduralGenerator(), tmp_path / "rec")
    replay = make_generator(GenerateParameters(backend=f"replay:{tmp_path / 'rec'}", record=str(tmp_path / "again")))
    assert replay.backend == "replay" and isinstance(replay, RecordingGenerator)  # a replay can be recorded too
    with pytest.raises(ValueError, match="another directory than the replayed one"):
        GenerateParameters(backend=f"replay:{tmp_path / 'rec'}", record=str(tmp_path / "rec"))


def _published(home: Path) -> tuple[set[tuple[str, str, str]], set[str]]:
    """The catalog at `home`: its versions' (env_id, status, content key), and their generator backends."""
    with Catalog(f"sqlite:///{home / 'catalog.db'}").session() as session:
        versions = session.exec(select(EnvironmentVersion)).all()
    return {(v.env_id, v.status, v.content_key) for v in versions}, {v.generator_backend for v in versions}


def _use_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    monkeypatch.setenv("WORLDSMITH_HOME", str(home))
    get_settings.cache_clear()


@pytest.mark.flow
def test_a_recorded_night_reruns_offline_to_the_same_catalog(prefect_api, home, monkeypatch, tmp_path: Path):
    from worldsmith.flows.generate import run_generate

    night = tmp_path / "night"
    server = ProceduralLLM(faults={"schema": ["sql_error"], "tool_plan": ["malformed_json"]}, seed=7)
    with server.serve() as background:
        monkeypatch.setenv("WORLDSMITH_LLM_BASE_URL", f"{background.url}/v1")  # an endpoint: the openai backend
        get_settings.cache_clear()
        recorded = run_generate(GenerateParameters(count=2, seed=7, concurrency=2, record=str(night)))
    assert [r.status for r in recorded] == ["good", "good"] and ("schema", "sql_error") in server.served
    original, backends = _published(home)
    assert len(original) == 2 and backends == {"openai"}

    _use_home(monkeypatch, tmp_path / "offline-home")  # a fresh catalog, the endpoint gone
    replayed = run_generate(GenerateParameters(count=2, seed=7, concurrency=2, backend=f"replay:{night}"))
    assert [r.status for r in replayed] == ["good", "good"]
    assert _published(tmp_path / "offline-home") == (original, {"replay"})
