"""Starting the CLI loads none of the heavy libraries: importing `worldsmith.cli`, or showing a
command's help, leaves them to the commands that use them (worldsmith/cli/__init__.py). Checked by
what a fresh interpreter has imported, never by how long it took."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.patience import PROCESS_S

pytestmark = pytest.mark.e2e

HEAVY = frozenset(
    {
        "torch",
        "transformers",
        "trl",
        "peft",
        "datasets",  # the training stack
        "prefect",  # the flows
        "sqlalchemy",
        "sqlmodel",
        "alembic",  # the catalog
        "mcp",
        "uvicorn",
        "plotly",  # the MCP gateway, the dashboard and its server
        "openai",  # world models and generator backends
        "great_expectations",  # the quality suites
    }
)

SHOW_MODULES = "import sys; print(' '.join(sorted({m.partition('.')[0] for m in sys.modules})))"


def _top_level_modules(code: str, home: Path) -> set[str]:
    """The top-level packages a fresh interpreter has imported after running `code`, then SHOW_MODULES."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{SHOW_MODULES}"],
        capture_output=True,
        text=True,
        env={**os.environ, "WORLDSMITH_HOME": str(home)},
        timeout=PROCESS_S,
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.splitlines()[-1].split())  # SHOW_MODULES's line, not the words of a help text


@pytest.mark.parametrize(
    "code",
    [
        "import worldsmith.cli",
        # the options of generate, eval, curate, sets create, train, cotrain and wm train are derived from their
        # parameter models when the CLI loads
        "from worldsmith.cli import app\nfor argv in (['--help'], ['train', '--help'], ['cotrain', '--help'], "
        "['wm', 'train', '--help'], ['catalog', 'ls', '--help'], ['status', '--help'], ['runs', 'ls', '--help'], "
        "['curate', '--help'], ['generate', '--help'], ['eval', '--help'], ['sets', 'create', '--help']):\n"
        "    try:\n        app(argv)\n    except SystemExit as exit:\n        assert exit.code == 0, (argv, exit.code)",
    ],
    ids=["import", "help"],
)
def test_the_cli_starts_without_the_heavy_libraries(code: str, tmp_path: Path) -> None:
    loaded = _top_level_modules(code, tmp_path)
    assert "worldsmith" in loaded and "typer" in loaded
    assert sorted(loaded & HEAVY) == []
