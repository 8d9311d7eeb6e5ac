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
