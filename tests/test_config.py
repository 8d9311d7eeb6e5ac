"""Configuration that travels (worldsmith/settings.py, `worldsmith config`): a worldsmith.toml found in
the working directory or the user's config directory, its profiles, environment variables over it, each
value's source in `config show`, misspelt variables and keys refused in one line, secrets masked, the
model key in a Prefect Secret block, and a new default home announced."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support.paths import REPO as REPO
from support.patience import PROCESS_S
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.failures import UserFixable
from worldsmith.settings import NOT_SETTINGS, NOT_SETTINGS_PREFIXES, ConfigFile, Settings, env_name, get_settings

pytestmark = pytest.mark.unit
#: The misspelling the docs show being refused.
MISSPELT = "WORLDSMITH_LLM_MODLE"

CONFIG = """
home = "state"
llm_model = "top-model"
llm_temperature = 0.1
dashboard_port = 8000

[profiles.gpu]
llm_model = "gpu-model"
dashboard_port = 9000

[profiles.cpu]
llm_model = "cpu-model"
"""


@pytest.fixture()
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory of its own (returned) and an empty user config directory; no config file or
    profile named, Prefect's home kept out of the way of the CLI's callback."""
    work, user = tmp_path / "work", tmp_path / "xdg"
    work.mkdir()
    user.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(user))
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    for variable in ("WORLDSMITH_CONFIG", "WORLDSMITH_PROFILE", "WORLDSMITH_LLM_API_KEY", "WORLDSMITH_CATALOG_URL"):
        monkeypatch.delenv(variable, raising=False)
    get_settings.cache_clear()
    yield work
    get_settings.cache_clear()


def invoke(*args: str, input: str | None = None):
    get_settings.cache_clear()
    return CliRunner().invoke(app, list(args), input=input)


def shown(*args: str) -> dict:
    result = invoke("config", "show", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def by_name(summary: dict) -> dict[str, dict]:
    return {row["name"]: row for row in summary["settings"]}


def test_environment_over_profile_over_file_over_default_with_sources(place, monkeypatch, tables_at_a_fixed_width):
    user_file = place.parent / "xdg" / "worldsmith" / "worldsmith.toml"
    user_file.parent.mkdir()
    user_file.write_text('llm_model = "from-user-config"\n')
    monkeypatch.delenv("WORLDSMITH_HOME")

    # no file here: the user's config directory's
    summary = shown()
    assert summary["config_file"] == str(user_file) and summary["profile"] is None
    assert by_name(summary)["llm_model"] == {
        "name": "llm_model",
        "env": "WORLDSMITH_LLM_MODEL",
        "value": "from-user-config",
        "source": str(user_file),
    }

    # a file in the working directory comes first; the profile over its top level, the environment over both
    here = place / "worldsmith.toml"
    here.write_text(CONFIG)
    monkeypatch.setenv("WORLDSMITH_PROFILE", "gpu")
    monkeypatch.setenv("WORLDSMITH_DASHBOARD_PORT", "9100")
    summary = shown()
    rows = by_name(summary)
    assert summary["config_file"] == str(here) and summary["profile"] == "gpu"
    assert (rows["llm_model"]["value"], rows["llm_model"]["source"]) == ("gpu-model", f"{here} [profiles.gpu]")
    assert (rows["llm_temperature"]["value"], rows["llm_temperature"]["source"]) == (0.1, str(here))
    assert (rows["dashboard_port"]["value"], rows["dashboard_port"]["source"]) == (
        9100,
        "env WORLDSMITH_DASHBOARD_PORT",
    )
    assert (rows["llm_retries"]["value"], rows["llm_retries"]["source"]) == (Settings().llm_retries, "default")
    # a relative home is relative to the file that names it, wherever the command runs
    assert summary["home"] == str(place / "state") and not summary["home_is_default"]
    assert get_settings().dashboard_port == 9100 and get_settings().llm_model == "gpu-model"

    # the table says the same
    monkeypatch.setenv("WORLDSMITH_PROFILE", "cpu")
    table = invoke("config", "show")
    assert table.exit_code == 0, table.output
    assert f"config file: {here} (profile cpu)" in table.output
    assert re.search(r"llm_model\s+│\s+cpu-model\s+│\s+worldsmith\.toml \[profiles\.cpu\]", table.output), table.output

    # WORLDSMITH_CONFIG names the file outright
    elsewhere = place.parent / "team.toml"
    elsewhere.write_text('llm_model = "team-model"\n')
    monkeypatch.setenv("WORLDSMITH_CONFIG", str(elsewhere))
    monkeypatch.delenv("WORLDSMITH_PROFILE")
    assert by_name(shown())["llm_model"]["source"] == str(elsewhere)


def _one_line(result) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    return lines[0]


def test_an_unknown_variable_is_refused_in_one_line_naming_the_closest_setting(place, monkeypatch):
    monkeypatch.setenv(MISSPELT, "gpt-5")
    for command in (["config", "show"], ["catalog", "ls"]):
        line = _one_line(invoke(*command))
        assert line == f"{MISSPELT} is not a setting; did you mean WORLDSMITH_LLM_MODEL?"
    monkeypatch.delenv(MISSPELT)
    monkeypatch.setenv("WORLDSMITH_NOTHING_LIKE_IT", "1")
    assert "WORLDSMITH_NOTHING_LIKE_IT is not a setting" in _one_line(invoke("config", "show"))


@pytest.mark.parametrize(
    ("text", "where", "key", "closest"),
    [
        ('llm_modle = "x"\n', "", "llm_modle", "llm_model"),
        ("[profiles.gpu]\ndashbord_port = 1\n", " [profiles.gpu]", "dashbord_port", "dashboard_port"),
    ],
)
def test_an_unknown_key_in_the_file_is_refused_in_one_line(place, text, where, key, closest):
    (place / "worldsmith.toml").write_text(text)
    line = _one_line(invoke("config", "show"))
    assert line == f"{place / 'worldsmith.toml'}{where}: {key} is not a setting; did you mean {closest}?"


@pytest.mark.parametrize(
    ("variables", "words"),
    [
        ({"WORLDSMITH_PROFILE": "gpu"}, "there is no worldsmith.toml"),
        ({"WORLDSMITH_CONFIG": "/nonexistent/ws.toml"}, "WORLDSMITH_CONFIG names /nonexistent/ws.toml"),
        ({"WORLDSMITH_LLM_TEMPERATURE": "5"}, "WORLDSMITH_LLM_TEMPERATURE=5 is invalid"),
        ({"WORLDSMITH_LLM_PRICES": "{not json"}, "WORLDSMITH_LLM_PRICES is not valid JSON"),
    ],
)
def test_a_wrong_choice_of_file_profile_or_value_is_one_line(place, monkeypatch, variables, words):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert words in _one_line(invoke("config", "show"))


def test_a_missing_profile_names_the_ones_there_are(place, monkeypatch):
    (place / "worldsmith.toml").write_text(CONFIG)
    monkeypatch.setenv("WORLDSMITH_PROFILE", "tpu")
    assert "has no [profiles.tpu] (profiles: gpu, cpu)" in _one_line(invoke("config", "show"))


def test_every_worldsmith_variable_the_project_names_is_a_setting_or_known_not_to_be():
    """The refusal never hits a variable the project itself sets or documents (or a misspelling in its docs)."""
    known = {env_name(field) for field in Settings.model_fields} | NOT_SETTINGS
    named: dict[str, Path] = {}
    for root in ("worldsmith", "tests", "docs", "deployments", "scripts", ".ci", "README.md"):
        for path in [REPO / root] if (REPO / root).is_file() else (REPO / root).rglob("*"):
            skipped = path.suffix in (".pyc", ".db") or "__pycache__" in path.parts or path == Path(__file__).resolve()
            if path.is_file() and not skipped:
                for name in re.findall(r"WORLDSMITH_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="ignore")):
                    named.setdefault(name, path)
    unknown = {
        name: str(path)
        for name, path in named.items()
        if name not in known and not name.startswith(NOT_SETTINGS_PREFIXES) and name != MISSPELT
    }
    assert unknown == {}


def test_secrets_are_masked(place, monkeypatch):
    monkeypatch.setenv("WORLDSMITH_LLM_API_KEY", "sk-very-secret")
    monkeypatch.setenv("WORLDSMITH_CATALOG_URL", "postgresql://worldsmith:hunter2@db.internal/worldsmith")
    rows = by_name(shown())
    assert rows["llm_api_key"]["value"] == "********" and rows["llm_api_key"]["source"] == "env WORLDSMITH_LLM_API_KEY"
    assert rows["catalog_url"]["value"] == "postgresql://worldsmith:********@db.internal/worldsmith"
    table = invoke("config", "show")
    for output in (table.output, json.dumps(rows)):
        assert "sk-very-secret" not in output and "hunter2" not in output
    assert get_settings().llm_key() == "sk-very-secret"  # masked in the display only


def test_the_key_from_the_higher_source_wins_over_a_block(place, monkeypatch):
    (place / "worldsmith.toml").write_text('llm_api_key_block = "team-key"\n')
    monkeypatch.setenv("WORLDSMITH_LLM_API_KEY", "sk-mine")
    rows = by_name(shown())
    assert rows["llm_api_key_block"]["value"] is None and rows["llm_api_key"]["value"] == "********"
    assert get_settings().llm_key() == "sk-mine"  # no Prefect Secret block read
    monkeypatch.setenv("WORLDSMITH_LLM_API_KEY_BLOCK", "other-key")
    line = _one_line(invoke("config", "show"))
    assert "llm_api_key (env WORLDSMITH_LLM_API_KEY) and llm_api_key_block" in line and "keep one" in line


@pytest.mark.flow
def test_the_model_key_from_a_prefect_secret_block(place, monkeypatch, prefect_api):
    name = f"ws-key-{uuid.uuid4().hex[:8]}"
    assert "is not a block name" in _one_line(invoke("config", "set-secret", "Bad_Name", input="sk-x\n"))
    assert "no key on stdin" in _one_line(invoke("config", "set-secret", name, input="\n"))
    saved = invoke("config", "set-secret", name, input="sk-from-the-block\n")
    assert saved.exit_code == 0 and f'llm_api_key_block = "{name}"' in saved.output, saved.output
    assert "sk-from-the-block" not in saved.output

    (place / "worldsmith.toml").write_text(f'llm_api_key_block = "{name}"\n')
    rows = by_name(shown())
    assert rows["llm_api_key_block"]["value"] == name and rows["llm_api_key"]["value"] is None
    get_settings.cache_clear()
    assert get_settings().llm_key() == "sk-from-the-block"

    (place / "worldsmith.toml").write_text('llm_api_key_block = "no-such-block"\n')
    get_settings.cache_clear()
    with pytest.raises(UserFixable, match="worldsmith config set-secret no-such-block") as refused:
        get_settings().llm_key()
    assert refused.value.exit_code == 2


def test_a_new_default_home_is_announced_once(place, monkeypatch):
    monkeypatch.delenv("WORLDSMITH_HOME")
    first = invoke("config", "show")
    assert first.exit_code == 0, first.output
    announced = f"created a new WORLDSMITH_HOME at {place / '.worldsmith'}"
    assert first.stderr.count(announced) == 1 and (place / ".worldsmith").is_dir()
    assert "the default: .worldsmith in the working directory" in first.stdout
    again = invoke("config", "show")
    assert again.exit_code == 0 and "created a new" not in again.output
    # a home that is named is created silently
    monkeypatch.setenv("WORLDSMITH_HOME", str(place / "named"))
    named = invoke("config", "show")
    assert named.exit_code == 0 and "created a new" not in named.output and (place / "named").is_dir()


@pytest.mark.sandbox
def test_a_child_process_started_elsewhere_reads_this_directorys_config(place, monkeypatch):
    """What a worker started from here needs (ConfigFile.environment) to use this directory's worldsmith.toml."""
    (place / "worldsmith.toml").write_text(CONFIG)
    monkeypatch.setenv("WORLDSMITH_PROFILE", "gpu")
    found = ConfigFile.find()
    assert found.environment() == {"WORLDSMITH_CONFIG": str(place / "worldsmith.toml"), "WORLDSMITH_PROFILE": "gpu"}
    env = {k: v for k, v in os.environ.items() if k not in ("WORLDSMITH_PROFILE", "WORLDSMITH_HOME")}
    child = subprocess.run(
        [sys.executable, "-c", "from worldsmith.settings import get_settings as g; print(g().llm_model, g().home)"],
        cwd=place.parent,
        env={**env, **found.environment()},
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["gpu-model", str(place / "state")]


@pytest.mark.sandbox
def test_a_secret_block_without_a_prefect_server_is_one_line(place):
    """Without PREFECT_API_URL (nor a running stack) there is nowhere to keep a block that workers can read."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "worldsmith.cli", "config", "set-secret", "some-key"],
        input="sk-x\n",
        env={**env, "WORLDSMITH_HOME": str(place / "home")},
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
    )
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr.strip() == (
        "Prefect Secret blocks need a Prefect server: start one with `worldsmith up` or set PREFECT_API_URL"
    )
