"""Wrong input to a command is answered in one line naming what is wrong (file, line, field, option) and
the fix, with a non-zero exit: never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import GOLDEN
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.runtime.answers import answer

pytestmark = pytest.mark.unit


def one_line_failure(args: list[str], code: int = 2) -> str:
    result = CliRunner().invoke(app, args)
    lines = result.output.strip().splitlines()
    assert result.exit_code == code and len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.fixture()
def wrong_lines(tmp_path: Path) -> dict[str, Path]:
    """JSON-lines files that are wrong on their second line: a missing field, a field of the wrong type,
    text that is no JSON."""
    files = {
        "missing-field": '{"bogus": 1}',
        "wrong-type": '{"name": 3, "description": "d", "categories": []}',
        "not-json": "not json",
    }
    for name, line in files.items():
        (tmp_path / f"{name}.jsonl").write_text("\n" + line + "\n")  # a blank first line: skipped, still counted
    return {name: tmp_path / f"{name}.jsonl" for name in files}


@pytest.mark.parametrize("command", ["sft", "transitions"])
@pytest.mark.parametrize(("case", "words"), [("missing-field", "field env_id: Field required"), ("not-json", "JSON")])
def test_data_names_the_file_line_and_field_of_a_malformed_line(home, wrong_lines, tmp_path, command, case, words):
    line = one_line_failure(["data", command, str(wrong_lines[case]), str(tmp_path / "out")])
    assert line.startswith(f"{wrong_lines[case]}:2: not a trajectory") and words in line, line


@pytest.mark.parametrize("command", ["sft", "transitions"])
def test_data_from_a_missing_file(home, tmp_path, command):
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    line = one_line_failure(["data", command, str(binary), str(tmp_path / "out")])
    assert line.startswith(f"cannot read {binary}: not UTF-8 text"), line
    line = one_line_failure(["data", command, "/nonexistent/trajectories.jsonl", str(tmp_path / "out")])
    assert line == "cannot use /nonexistent/trajectories.jsonl: No such file or directory; check the path"


@pytest.mark.parametrize(
    ("case", "words"),
    [("missing-field", "field name: Field required"), ("wrong-type", "field name: Input should be a valid")],
)
def test_generate_names_the_line_and_field_of_a_malformed_scenario(home, wrong_lines, case, words):
    line = one_line_failure(["generate", "--scenarios", str(wrong_lines[case])])
    assert f"{wrong_lines[case]}:2: not a scenario" in line and words in line, line


def test_generate_refuses_a_scenario_file_with_no_scenarios(home, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    line = one_line_failure(["generate", "--scenarios", str(empty)])
    assert f"scenario file {empty} holds no scenarios" in line, line


def test_catalog_fetch_into_an_existing_file_names_force(home, tmp_path):
    target = tmp_path / "a-file"
    target.write_text("mine")
    line = one_line_failure(["catalog", "fetch", "retail_store", str(target)])
    assert f"{target} exists and is not a directory" in line and "--force" in line
    assert target.read_text() == "mine"


def test_catalog_fetch_into_a_directory_with_files_names_force(home, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    line = one_line_failure(["catalog", "fetch", "retail_store", str(tmp_path / "full")])
    assert "exists and is not empty" in line and "--force" in line


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["train", "--set", "s", "--model", "/nonexistent"], "--model /nonexistent: does not exist"),
        (["cotrain", "--set", "s", "--world-model", "./nope"], "--world-model ./nope: does not exist"),
    ],
)
def test_a_model_path_that_is_not_there_is_one_line(home, args, words):
    line = one_line_failure(args)
    assert words in line and "local Hugging Face cache" in line, line


def test_the_ephemeral_prefect_server_timing_out_names_the_setting_and_up():
    line = answer(RuntimeError("Timed out while attempting to connect to ephemeral Prefect API server."))
    assert line is not None and "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in line and "worldsmith up" in line


def test_generate_refuses_to_record_into_a_file_before_the_flow(home, tmp_path):
    (tmp_path / "afile").write_text("mine")
    line = one_line_failure(["generate", "--record", str(tmp_path / "afile")])
    assert f"{tmp_path / 'afile'} is a file, not a directory" in line


@pytest.mark.parametrize("command", [["sets", "export", "s1"], ["export", "awm", "s1"]])
def test_exporting_into_a_file_is_one_line(home, tmp_path, command):
    for setup in (["catalog", "publish", str(GOLDEN), "--no-probes"], ["sets", "create", "s1"]):
        assert CliRunner().invoke(app, setup).exit_code == 0
    (tmp_path / "afile").write_text("mine")
    line = one_line_failure([*command, str(tmp_path / "afile")])
    assert f"cannot write into {tmp_path / 'afile'}: it exists and is not a directory" in line
