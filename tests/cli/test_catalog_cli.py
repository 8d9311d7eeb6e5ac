"""`worldsmith catalog ...` and `worldsmith sets ...` as a user runs them, on local files and on S3."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from support.paths import GOLDEN
from typer.testing import CliRunner

from worldsmith.bundle.loader import rebuild_bundle_dir
from worldsmith.cli import app
from worldsmith.cli import console as cli_console
from worldsmith.settings import get_settings

runner = CliRunner()
pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("tables_at_a_fixed_width")]


@pytest.fixture()
def installation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WORLDSMITH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WORLDSMITH_STORE_URL", raising=False)
    monkeypatch.delenv("WORLDSMITH_CATALOG_URL", raising=False)
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


def run(*args: str, code: int = 0) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result.output


@pytest.mark.sandbox
def test_a_published_world_fetched_back_passes_its_checks(installation):
    out = run("catalog", "publish", str(GOLDEN))
    assert "published retail_store@1: good" in out
    assert "already published as retail_store@1" in run("catalog", "publish", str(GOLDEN), "--no-probes")
    run("catalog", "fetch", "retail_store@1", str(installation / "copy"))
    check = run("env", "check", str(installation / "copy"))
    assert re.search(r"\b\d{2,} passed, 0 failed", check), check
    listing = json.loads(run("catalog", "ls", "--json"))
    assert listing[0]["ref"] == "retail_store@1" and listing[0]["checks"] == {"expectations": True, "probes": True}
    record = json.loads(run("catalog", "show", "retail_store"))
    assert record["status"] == "good" and set(record["artifacts"]) >= {"tools.py", "world.db", "manifest.json"}
    assert {r["kind"] for r in record["reports"]} == {"expectations", "probes"}
    assert "no environment version 'nope'" in run("catalog", "show", "nope", code=2)


@pytest.mark.sandbox
def test_a_version_that_fails_its_checks_is_published_as_failed(installation):
    bundle = installation / "lenient"
    shutil.copytree(GOLDEN, bundle)
    verifiers = (
        (bundle / "verifiers.py")
        .read_text()
        .replace(
            "def verify_t07_cheapest_audio(initial, final, answer):\n",
            "def verify_t07_cheapest_audio(initial, final, answer):\n    return _result('complete')\n",
        )
    )
    (bundle / "verifiers.py").write_text(verifiers)
    rebuild_bundle_dir(bundle)
    out = run("catalog", "publish", str(bundle), code=1)
    assert re.search(
        r"published retail_store@1: failed \(probes: 1 of \d{2,} probes failed \(first: untouched rejected "
        r"t07_cheapest_audio",
        out,
    ), out


#: Why half_world, published by `_publish_a_good_world_beside_a_failed_one`, failed.
HALF_WORLD_FAILURE = "stage tools raised IndexError: list index out of range"


def _publish_a_good_world_beside_a_failed_one() -> bytes:
    """Publish the golden world (good) and half_world (failed at stage tools with its partial artifacts:
    the golden schema.sql, its work.json); returns that schema.sql."""
    from worldsmith.bundle.loader import load_bundle
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.objectstore import configured_store
    from worldsmith.storage.publish import publish_failed

    run("catalog", "publish", str(GOLDEN), "--no-probes")
    golden = load_bundle(GOLDEN)
    manifest = golden.manifest.model_copy(update={"env_id": "half_world"})
    files = {"schema.sql": golden.files["schema.sql"], "work.json": b"{}\n"}
    publish_failed(manifest, files, "tools", HALF_WORLD_FAILURE, configured_store(), open_catalog())
    return golden.files["schema.sql"]


def test_catalog_ls_lists_by_status(installation):
    _publish_a_good_world_beside_a_failed_one()
    failed = json.loads(run("catalog", "ls", "--status", "failed", "--json"))
    assert [(r["ref"], r["status"], r["failed_stage"], r["failure_reason"]) for r in failed] == [
        ("half_world@1", "failed", "tools", HALF_WORLD_FAILURE)
    ]
    good = json.loads(run("catalog", "ls", "--status", "good", "--json"))
    assert [(r["ref"], r["failure_reason"]) for r in good] == [("retail_store@1", None)]
    assert "half_world@1" in run("catalog", "ls", "--status", "failed") and "IndexError" in run("catalog", "ls")
    assert "--status" in run("catalog", "ls", "--status", "broken", code=2)


def test_fetching_a_failed_world_gives_its_partial_artifacts(installation):
    schema = _publish_a_good_world_beside_a_failed_one()
    out = run("catalog", "fetch", "half_world@1", str(installation / "half"))
    assert "partial artifacts of half_world@1" in out and "stage tools" in out
    assert (installation / "half" / "schema.sql").read_bytes() == schema
    assert "no good version" in run("catalog", "fetch", "half_world", str(installation / "none"), code=2)


def test_messages_are_not_wrapped_at_the_console_width(installation, monkeypatch):
    """A message naming a long path stays on one line, whatever the terminal's width."""
    for console in (cli_console.console, cli_console.errors):
        monkeypatch.setattr(console, "width", 40)
    target = installation.joinpath(*["a-rather-long-directory-name"] * 6)
    run("catalog", "publish", str(GOLDEN), "--no-probes")
    assert f"fetched retail_store@1 into {target}\n" in run("catalog", "fetch", "retail_store@1", str(target))
    ref = "no-such-environment-" + "-".join(["with-a-rather-long-name"] * 4) + "@7"
    other = target.with_name("another")
    assert f"no environment version '{ref}' in the catalog; `worldsmith catalog ls` lists them\n" in run(
        "catalog", "fetch", ref, str(other), code=2
    )


def test_diff_between_versions(installation):
    run("catalog", "publish", str(GOLDEN), "--no-probes")
    edited = installation / "edited"
    shutil.copytree(GOLDEN, edited)
    (edited / "seed.sql").write_text((edited / "seed.sql").read_text().replace("('SAVE10',   10,", "('SAVE10',   15,"))
    rebuild_bundle_dir(edited)
    assert "published retail_store@2: good" in run("catalog", "publish", str(edited), "--no-probes")
    diff = run("catalog", "diff", "retail_store@1", "retail_store@2")
    assert "--- retail_store@1/seed.sql" in diff and "+    ('SAVE10',   15," in diff and "world.db: differs" in diff
    assert "--- retail_store@1/tools.py" not in diff  # unchanged artifacts are not shown
    assert "--- retail_store@1/manifest.json" in diff and '+  "version": 2,' in diff


def test_sets_commands(installation):
    run("catalog", "publish", str(GOLDEN), "--no-probes")
    assert "created set demo: 1 environment versions (1 train, 0 validation)" in run(
        "sets", "create", "demo", "--category", "retail"
    )
    assert "already exists" in run("sets", "create", "demo", code=2)
    assert "demo" in run("sets", "ls")
    manifest = json.loads(run("sets", "show", "demo"))
    assert manifest["members"][0]["ref"] == "retail_store@1"
    run("sets", "export", "demo", str(installation / "export"))
    assert (installation / "export" / "tasks.parquet").is_file()


def test_catalog_export_import_between_installations(installation, monkeypatch):
    run("catalog", "publish", str(GOLDEN), "--no-probes")
    run("sets", "create", "demo")
    run("catalog", "export", str(installation / "moving"))
    monkeypatch.setenv("WORLDSMITH_HOME", str(installation / "cluster"))
    get_settings.cache_clear()
    assert "'versions_added': 1" in run("catalog", "import", str(installation / "moving"))
    assert "'versions_skipped': 1" in run("catalog", "import", str(installation / "moving"))
    assert json.loads(run("sets", "show", "demo"))["members"][0]["ref"] == "retail_store@1"


@pytest.mark.sandbox
def test_a_world_published_to_s3_fetches_back_byte_for_byte(installation, monkeypatch, s3_endpoint, s3_bucket):
    monkeypatch.setenv("WORLDSMITH_STORE_URL", f"s3://{s3_bucket}/worlds")
    monkeypatch.setenv("WORLDSMITH_S3_ENDPOINT_URL", s3_endpoint)
    get_settings.cache_clear()
    run("catalog", "publish", str(GOLDEN), "--no-probes")
    run("catalog", "fetch", "retail_store", str(installation / "from-s3"))
    for name in ("tools.py", "world.db", "tasks.jsonl"):
        assert (installation / "from-s3" / name).read_bytes() == (GOLDEN / name).read_bytes()


def test_a_bad_reference_is_answered_in_one_line(installation):
    out = run("catalog", "show", "retail_store@" + "9" * 30, code=2)
    assert "bad reference" in out and "Traceback" not in out and len(out.strip().splitlines()) == 1


def test_a_missing_input_file_is_answered_in_one_line(installation, tmp_path):
    missing = tmp_path / "no-such-trajectories.jsonl"
    for command in (["data", "sft"], ["wm", "data"]):
        out = run(*command, str(missing), str(tmp_path / "out"), code=2)
        assert out.strip() == f"cannot use {missing}: No such file or directory; check the path"
