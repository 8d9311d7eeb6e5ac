"""A read-only WORLDSMITH_HOME (a home on read-only media, or one the user cannot write): listings and
fetches work, a write is one line naming the fix, a fresh home that cannot be created is one line too."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import GOLDEN
from support.processes import run_cli

pytestmark = pytest.mark.e2e


def worldsmith(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORLDSMITH_")}
    env.update(WORLDSMITH_HOME=str(home), COLUMNS="200")
    return run_cli(list(args), env)


@pytest.fixture(scope="module")
def read_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A home with the golden world published in it, read-only: through a read-only bind mount as root
    (permissions do not stop root), by permissions otherwise (skipped where neither is possible). Its
    parent directory is read-only too, so a fresh home beside it cannot be made. Published once for
    the module's tests (a CLI run with the checks)."""
    source = tmp_path_factory.mktemp("source")
    published = worldsmith(source / "home", "catalog", "publish", str(GOLDEN))
    assert published.returncode == 0, published.stdout + published.stderr
    if os.geteuid() != 0:
        for directory in (source / "home", source):
            directory.chmod(0o555)
        try:
            yield source / "home"
        finally:
            for directory in (source, source / "home"):
                directory.chmod(0o755)
        return
    view = tmp_path_factory.mktemp("view")
    mounted = subprocess.run(["mount", "--bind", str(source), str(view)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("root without the right to mount: no way to make a directory read-only here")
    try:
        remounted = subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], capture_output=True)
        if remounted.returncode != 0:
            pytest.skip("a read-only remount is refused here")
        yield view / "home"
    finally:
        subprocess.run(["umount", str(view)], capture_output=True)


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused command answers (no traceback)."""
    assert done.returncode == 2 and "Traceback" not in done.stdout + done.stderr
    (line,) = (done.stdout + done.stderr).strip().splitlines()
    return line


def test_a_read_only_home_still_lists_its_worlds(read_only):
    listed = worldsmith(read_only, "catalog", "ls")
    assert listed.returncode == 0 and "retail_store" in listed.stdout, listed.stdout + listed.stderr


def test_a_read_only_home_still_fetches_its_worlds(read_only, tmp_path):
    fetched = worldsmith(read_only, "catalog", "fetch", "retail_store", str(tmp_path / "copy"))
    assert fetched.returncode == 0 and (tmp_path / "copy" / "manifest.json").is_file(), fetched.stderr


def test_a_write_to_a_read_only_home_is_refused_in_one_line(read_only):
    line = _one_line(worldsmith(read_only, "sets", "create", "s", "--count", "1"))
    assert "read-only" in line and "WORLDSMITH_HOME" in line


def test_a_home_that_cannot_be_made_is_refused_in_one_line(read_only):
    fresh = read_only.parent / "new-home"
    line = _one_line(worldsmith(fresh, "catalog", "ls"))
    assert str(fresh) in line and "WORLDSMITH_HOME" in line
