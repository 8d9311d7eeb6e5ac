"""A read-only WORLDSMITH_HOME (a home on read-only media, or one the user cannot write): listings and
fetches work, a write is one line naming the fix, a fresh home that cannot be created is one line too."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import GOLDEN
from support.paths import REPO as REPO

pytestmark = pytest.mark.e2e


def worldsmith(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORLDSMITH_")}
    env.update(WORLDSMITH_HOME=str(home), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "worldsmith.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture()
def read_only(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(writable source, the same directory read-only): a read-only bind mount as root (permissions do not
    stop root), permissions otherwise; skipped where neither is possible."""
    source, view = tmp_path / "source", tmp_path / "view"
    source.mkdir()
    if os.geteuid() != 0:
        yield source, source
        return
    view.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(source), str(view)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("root without the right to mount: no way to make a directory read-only here")
    try:
        remounted = subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], capture_output=True)
        if remounted.returncode != 0:
            pytest.skip("a read-only remount is refused here")
        yield source, view
    finally:
        subprocess.run(["umount", str(view)], capture_output=True)


def test_a_read_only_home_serves_reads_refusing_writes_in_one_line(read_only, tmp_path):
    source, view = read_only
    published = worldsmith(source / "home", "catalog", "publish", str(GOLDEN))
    assert published.returncode == 0, published.stdout + published.stderr
    if view == source:  # not root: take the write permission away
        for directory in (source / "home", source):
            directory.chmod(0o555)
    try:
        home = view / "home"
        listed = worldsmith(home, "catalog", "ls")
        assert listed.returncode == 0 and "retail_store" in listed.stdout, listed.stdout + listed.stderr
        fetched = worldsmith(home, "catalog", "fetch", "retail_store", str(tmp_path / "copy"))
        assert fetched.returncode == 0 and (tmp_path / "copy" / "manifest.json").is_file(), fetched.stderr
        refused = worldsmith(home, "sets", "create", "s", "--count", "1")
        assert refused.returncode == 2 and "Traceback" not in refused.stdout + refused.stderr
        (line,) = (refused.stdout + refused.stderr).strip().splitlines()
        assert "read-only" in line and "WORLDSMITH_HOME" in line
        fresh = worldsmith(view / "new-home", "catalog", "ls")
        assert fresh.returncode == 2 and "Traceback" not in fresh.stdout + fresh.stderr
        (line,) = (fresh.stdout + fresh.stderr).strip().splitlines()
        assert str(view / "new-home") in line and "WORLDSMITH_HOME" in line
    finally:
        for directory in (source, source / "home"):
            directory.chmod(0o755)
