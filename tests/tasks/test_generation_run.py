"""A generation run's parameters as its tasks see them: validation, the backend a run uses, the dated
form a nightly run takes, and the content key that decides what a rerun may reuse."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from worldsmith.settings import get_settings
from worldsmith.tasks.generation_run import sandbox_workers
from worldsmith.tasks.parameters import GenerateParameters, configured_backend

pytestmark = pytest.mark.unit


@pytest.fixture()
def no_endpoint(monkeypatch: pytest.MonkeyPatch):
    for name in ("WORLDSMITH_LLM_BASE_URL", "WORLDSMITH_LLM_API_KEY", "WORLDSMITH_LLM_API_KEY_BLOCK"):
        monkeypatch.delenv(name, raising=False)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_an_unknown_backend_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValidationError, match="unknown backend 'gpt'.*procedural, openai or replay:DIR"):
        GenerateParameters(backend="gpt")


def test_a_missing_scenario_file_is_refused_before_any_stage_runs(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="scenario file .* not found"):
        GenerateParameters(scenario_file=str(tmp_path / "absent.jsonl"))


def test_the_record_directory_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert GenerateParameters(record="rec").record == str(tmp_path / "rec")


def test_the_backend_defaults_to_procedural_without_an_endpoint(no_endpoint) -> None:
    assert configured_backend(get_settings()) == "procedural"
    assert GenerateParameters().resolved_backend() == "procedural"
    assert GenerateParameters(backend="openai").resolved_backend() == "openai"


def test_the_backend_is_openai_once_an_endpoint_is_configured(no_endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLDSMITH_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    get_settings.cache_clear()
    assert GenerateParameters().resolved_backend() == "openai"


def test_dated_fills_an_unset_seed_with_todays_utc_date(no_endpoint) -> None:
    dated = GenerateParameters(seed=None).dated()
    assert dated.seed == int(datetime.now(UTC).strftime("%Y%m%d")) and dated.backend == "procedural"


def test_dated_keeps_a_given_seed() -> None:
    given = GenerateParameters(seed=7, backend="procedural")
    assert given.dated() is given


def test_the_seed_a_run_uses_is_the_given_one_else_todays_utc_date() -> None:
    assert GenerateParameters(seed=0).resolved_seed() == 0
    assert GenerateParameters(seed=None).resolved_seed() == int(datetime.now(UTC).strftime("%Y%m%d"))


def test_the_key_changes_with_what_is_made_only() -> None:
    base = GenerateParameters(seed=1)
    assert base.key() == GenerateParameters(seed=1, count=99, concurrency=16, min_good_share=0.9).key()
    assert base.key() != GenerateParameters(seed=2).key()
    assert base.key() != GenerateParameters(seed=1, fault_rate=0.5).key()


def test_a_run_sizes_its_sandbox_pool_to_the_worlds_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLDSMITH_SANDBOX_WORKERS", "2")
    get_settings.cache_clear()
    try:
        assert sandbox_workers(GenerateParameters(concurrency=1)) == 2  # never fewer than configured
        assert sandbox_workers(GenerateParameters(concurrency=8)) == 8
        assert sandbox_workers(GenerateParameters(concurrency=256)) == 64  # capped
    finally:
        get_settings.cache_clear()
