"""The sweep of wrong inputs (scripts/wrong_inputs.py: every command of `worldsmith --help` with missing,
empty, malformed or misplaced files, out-of-range numbers, bad enum values, unknown refs, an unreachable
endpoint), in process: every answer is one line with a non-zero exit, never a traceback, a flood, or a
wrong input taken (exit 0)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from support.paths import REPO
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.settings import get_settings

pytestmark = pytest.mark.unit


def _sweep() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wrong_inputs", REPO / "scripts" / "wrong_inputs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their module
    spec.loader.exec_module(module)
    return module


SWEEP = _sweep()


#: The answers the sweep found unclear or long, now naming their fix: words each must hold.
NAMED_FIXES = {
    "eval --set nosuch": "(`worldsmith sets ls` lists them)",
    "catalog show nosuch": "; `worldsmith catalog ls` lists them",
    "tasks ls nosuch": "no bundle directory 'nosuch', and no environment version",
    "resume 999": "(`worldsmith runs ls --kind train` lists them)",
    "curate --name x": "loosen it, or generate or publish environments first",
    "sets create x": "loosen it, or generate or publish environments first",
    "generate --scenarios {dir}": "is a directory; give a JSON lines file",
    "import awm {file}": "is not a directory; give the directory of an AgentWorldModel-1K download",
    "env build {missing}": ": bundle directory not found; give a bundle directory",
    "env build {file}": ": is a file, not a bundle directory; give a bundle directory",
    "env check {dir}": ": no bundle here (none of manifest.json",
    "env call {bundle} nosuch_tool": "unknown tool 'nosuch_tool'; available tools: ",
    "wm train {missing}": "cannot use ",
    "wm train {dir}": ": Is a directory; check the path",
    "wm train {empty} --steps 0": "invalid WorldModelConfig: 1 error(s), first at steps",
    "wm eval {missing}": "cannot use ",
    "wm eval {empty} --split nosuch": "--split nosuch: not a split; use train | validation | test | all",
    "wm eval {empty} --k 0": "--k 0: give a number of at least 1",
}


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, str]:
    made: dict[str, str] = SWEEP.sweep_files(tmp_path / "files")
    yield made
    Path(made["unreadable"]).chmod(0o600)


@pytest.mark.parametrize("case", SWEEP.CASES, ids=[c.name for c in SWEEP.CASES])
def test_a_wrong_input_is_answered_in_one_line(home, files, monkeypatch, case):
    args, env = SWEEP.filled(case, files)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # no server of the host's: refused before any flow
    monkeypatch.setenv("WORLDSMITH_PREFECT_PORT", files["dead_url"].split(":")[2].split("/")[0])
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    result = CliRunner().invoke(app, args)
    escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
    output = result.output + (f"\nTraceback (most recent call last): {result.exception!r}" if escaped else "")
    judged = SWEEP.verdict(result.exit_code, output)
    assert judged == "clean", f"{judged}: exit {result.exit_code}\n{output}"
    assert NAMED_FIXES.get(case.name, "") in output, output


def test_every_named_fix_is_of_a_case_of_the_sweep():
    assert set(NAMED_FIXES) <= {c.name for c in SWEEP.CASES}
