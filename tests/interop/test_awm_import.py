"""Import of the AgentWorldModel-1K format (tests/data/awm_format_sample): the environment runs in
the sandbox as a FastAPI app called in-process, both verifier modes judge the reference solutions,
and planted defects of every kind are reported by name."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from sqlmodel import select
from support.paths import TESTS

from worldsmith.bundle.contract import Bundle
from worldsmith.interop.awm import AwmFormatError, import_scenario, read_release
from worldsmith.interop.catalog_import import import_release
from worldsmith.localserver import BackgroundServer
from worldsmith.models.catalog import QualityReport
from worldsmith.serving.gateway import Gateway
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import LocalStore

pytestmark = pytest.mark.sandbox

#: A copy of ../shared/data/awm_format_sample (a hand-written environment in the release's format).
SAMPLE = TESTS / "data" / "awm_format_sample"


def endpoints() -> list[dict]:
    spec = json.loads((SAMPLE / "gen_spec.jsonl").read_text().splitlines()[0])["api_spec"]
    return [e for group in spec["api_groups"] for e in group["endpoints"]]


@pytest.fixture(scope="module")
def scenario():
    (found,) = read_release(SAMPLE)
    return found


@pytest.fixture(scope="module")
def import_in(scenario, runtime) -> Callable[[str], Bundle]:
    """The sample imported with verifier mode MODE (each mode imported once per module)."""
    bundles: dict[str, Bundle] = {}

    def imported(mode: str) -> Bundle:
        if mode not in bundles:
            result = import_scenario(scenario, runtime, mode)
            assert result.defects == [] and result.bundle is not None
            bundles[mode] = result.bundle
        return bundles[mode]

    return imported


@pytest.fixture(scope="module", params=["code", "sql"])
def imported(request, import_in) -> Bundle:
    """The sample imported with each verifier mode: for what the verifiers judge."""
    return import_in(request.param)


@pytest.fixture(scope="module")
def app_bundle(import_in) -> Bundle:
    """The sample imported: for what its tools answer, the app's routes (the same in either verifier mode)."""
    return import_in("code")


def test_tools_come_from_the_routes(app_bundle):
    by_name = {t.name: t for t in app_bundle.tools}
    assert set(by_name) == {e["operation_id"] for e in endpoints()}
    for endpoint in endpoints():
        properties = by_name[endpoint["operation_id"]].parameters["properties"]
        assert set(endpoint["request_params"]) <= set(properties), endpoint["operation_id"]
        required = {n for n, p in endpoint["request_params"].items() if p.get("required")}
        assert required <= set(by_name[endpoint["operation_id"]].parameters["required"]), endpoint["operation_id"]


def example_arguments(endpoint: dict) -> dict:
    return {name: p["example"] for name, p in endpoint["request_params"].items() if "example" in p}


def test_every_route_answers_through_the_runtime(app_bundle, runtime):
    for endpoint in endpoints():
        with runtime.open_episode(app_bundle) as episode:  # a fresh copy each, as the fixture's README prescribes
            result = episode.call_tool(endpoint["operation_id"], example_arguments(endpoint))
            assert result.status == "ok", (endpoint["operation_id"], result.error)


def test_an_apps_refusals_are_tool_errors_that_undo_nothing_else(app_bundle, runtime):
    with runtime.open_episode(app_bundle) as episode:
        missing = episode.call_tool("cancel_hold", {"hold_id": 999})
        assert missing.status == "tool_error" and "HTTP 404" in missing.error and "999" in missing.error
        first = episode.call_tool("place_hold", {"book_id": 1, "pickup_branch_id": 2})
        twice = episode.call_tool("place_hold", {"book_id": 1, "pickup_branch_id": 2})
        assert first.ok and first.changed and twice.status == "tool_error" and "HTTP 409" in twice.error
        holds = episode.call_tool("list_my_holds", {}).value
        assert sum(h["book_id"] == 1 for h in holds) == 1
        bad = episode.call_tool("place_hold", {"book_id": "one", "pickup_branch_id": 2})
        assert bad.status == "tool_error" and "book_id" in bad.error


def test_the_apps_clock_is_the_environments_fixed_instant(app_bundle, runtime):
    with runtime.open_episode(app_bundle) as episode:
        placed = episode.call_tool("place_hold", {"book_id": 1, "pickup_branch_id": 2})
    assert placed.value["placed_at"] == app_bundle.manifest.clock


def test_an_older_import_with_its_clock_in_origin_still_answers_it(app_bundle, runtime):
    instant = "2023-02-03T04:05:06"
    origin = {**app_bundle.manifest.origin, "clock": instant}
    older = dataclasses.replace(
        app_bundle, manifest=app_bundle.manifest.model_copy(update={"clock": None, "origin": origin})
    )
    assert older.clock == instant and older.runtime_key != app_bundle.runtime_key
    with runtime.open_episode(older) as episode:
        assert episode.call_tool("place_hold", {"book_id": 1, "pickup_branch_id": 2}).value["placed_at"] == instant


def test_each_imported_verifier_tells_its_solved_state_from_the_untouched_one(imported, runtime):
    for task in imported.tasks:
        with runtime.open_episode(imported, task) as episode:
            untouched = episode.verify(task.answer or "")
            assert untouched.status == "incomplete", (task.id, untouched.evidence)
            for step in task.solution:
                assert episode.call_tool(step.tool, step.arguments).ok, (task.id, step.tool)
            verdict = episode.verify(task.answer or "")
            assert verdict.status == "complete", (task.id, verdict.error, verdict.evidence)
    assert len(imported.tasks) == 10


def test_two_episodes_of_one_environment_do_not_see_each_others_writes(app_bundle, runtime):
    with runtime.open_episode(app_bundle) as one, runtime.open_episode(app_bundle) as two:
        assert one.call_tool("place_hold", {"book_id": 1, "pickup_branch_id": 2}).ok
        assert two.call_tool("place_hold", {"book_id": 1, "pickup_branch_id": 3}).ok  # no 409: one's hold is not there
        mine = [h["pickup_branch_id"] for h in one.call_tool("list_my_holds", {}).value if h["book_id"] == 1]
        theirs = [h["pickup_branch_id"] for h in two.call_tool("list_my_holds", {}).value if h["book_id"] == 1]
        assert (mine, theirs) == ([2], [3])


def test_every_route_answers_through_the_mcp_gateway(app_bundle, runtime):
    gateway = Gateway(runtime, [app_bundle])

    async def call_each(url: str) -> dict[str, tuple[bool, str]]:
        answers = {}
        for endpoint in endpoints():  # one MCP session (one episode) per route: each on a fresh copy
            async with streamable_http_client(f"{url}/envs/{app_bundle.env_id}/mcp") as (read, write):
                async with ClientSession(read, write) as client:
                    await client.initialize()
                    result = await client.call_tool(endpoint["operation_id"], example_arguments(endpoint))
                    answers[endpoint["operation_id"]] = (
                        bool(result.is_error),
                        result.content[0].text if result.content else "",
                    )
        return answers

    with BackgroundServer(gateway.app()) as server:
        answers = anyio.run(call_each, server.url)
    assert len(answers) == 19
    assert {name: text for name, (is_error, text) in answers.items() if is_error} == {}


def test_served_over_the_mcp_gateway(imported, runtime):
    gateway = Gateway(runtime, [imported])

    async def session(url: str) -> tuple[list[str], dict, bool, object]:
        async with streamable_http_client(f"{url}/envs/{imported.env_id}/mcp?task=t00") as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                names = [t.name for t in (await client.list_tools()).tools]
                placed = await client.call_tool("place_hold", {"book_id": 1, "pickup_branch_id": 2})
                (episode,) = gateway.sessions.values()  # verification is not reachable through MCP
                verdict = await anyio.to_thread.run_sync(episode.verify, "")
                return names, json.loads(placed.content[0].text), bool(placed.is_error), verdict

    with BackgroundServer(gateway.app()) as server:
        names, placed, is_error, verdict = anyio.run(session, server.url)
    assert sorted(names) == sorted(e["operation_id"] for e in endpoints())
    assert not is_error and placed["pickup_branch_name"] == "Riverside Branch"
    assert verdict.status == "complete"


# -- planted defects ---------------------------------------------------------------------------


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (SAMPLE / name).read_text().splitlines() if line.strip()]


def plant(directory: Path, defects: dict[str, callable]) -> Path:
    """A release directory holding the sample once per planted defect (scenario `NAME`), each copy
    changed by its function `edit(records by file)`."""
    directory.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[dict]] = {}
    for key, edit in defects.items():
        records = {
            name: _rows(name)
            for name in (
                "gen_scenario.jsonl",
                "gen_tasks.jsonl",
                "gen_db.jsonl",
                "gen_sample.jsonl",
                "gen_spec.jsonl",
                "gen_envs.jsonl",
                "gen_verifier.jsonl",
                "gen_verifier.pure_code.jsonl",
            )
        }
        for name, rows in records.items():
            for row in rows:
                if name == "gen_scenario.jsonl":
                    row["name"] = key
                else:
                    row["scenario"] = key
        edit(records)
        for name, rows in records.items():
            out.setdefault(name, []).extend(rows)
    for name, rows in out.items():
        (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


def _app(records: dict, old: str, new: str) -> None:
    row = records["gen_envs.jsonl"][0]
    assert old in row["full_code"]
    row["full_code"] = row["full_code"].replace(old, new, 1)


def _verifier(records: dict, task: int, code: str) -> None:
    for row in records["gen_verifier.pure_code.jsonl"]:
        if row["task_idx"] == task:
            row["verification"]["code"] = code


def failing_insert(records: dict) -> None:
    tables = records["gen_sample.jsonl"][0]["sample_data"]["tables"]
    loans = next(t for t in tables if t["table_name"] == "loans")
    loans["insert_statements"].append(
        "INSERT INTO loans (id, copy_id, member_id, checkout_date, due_date, returned_date, renewal_count, "
        "status, created_at) VALUES (9001, 424242, 1, '2025-06-02', '2025-06-23', NULL, 0, 'active', "
        "'2025-06-02 10:00:00');"
    )  # copy 424242 does not exist


def crashing_route(records: dict) -> None:
    _app(records, "async def list_branches():\n", "async def list_branches():\n    1 / 0\n")


def raising_verifier(records: dict) -> None:
    _verifier(
        records,
        3,
        "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n    raise KeyError('fines')\n",
    )


def satisfied_task(records: dict) -> None:
    _verifier(
        records,
        4,
        "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n    return {'result': 'complete'}\n",
    )


def secret_read(records: dict) -> None:
    _app(
        records,
        "async def list_branches():\n",
        "async def list_branches():\n    token = os.environ.get('OPENAI_API_KEY')\n",
    )


def network_call(records: dict) -> None:
    _app(
        records,
        "async def list_branches():\n",
        "async def list_branches():\n    import urllib.request\n"
        "    urllib.request.urlopen('http://169.254.169.254/latest/meta-data/')\n",
    )


PLANTED = {
    "seed_insert_fails": failing_insert,
    "route_crashes": crashing_route,
    "verifier_raises": raising_verifier,
    "task_already_satisfied": satisfied_task,
    "secret_attempt": secret_read,
    "network_attempt": network_call,
}


def test_each_planted_defect_fails_its_world_naming_the_defect(runtime, tmp_path):
    release = plant(tmp_path / "release", {f"defect_{kind}": edit for kind, edit in PLANTED.items()})
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    rows = {row["scenario"]: row for row in import_release(release, runtime, LocalStore(tmp_path / "store"), catalog)}
    for kind in PLANTED:
        row = rows[f"defect_{kind}"]
        kinds = {d["kind"] for d in row["defects"]}
        assert kinds == {kind}, (kind, row["defects"])
        assert row["status"] == "failed" and row["ref"] and kind in row["reason"]
    insert = rows["defect_seed_insert_fails"]["defects"]
    assert len(insert) == 1 and "FOREIGN KEY" in insert[0]["detail"] and "9001" in insert[0]["detail"]
    assert {d["target"] for d in rows["defect_route_crashes"]["defects"]} == {"list_branches"}
    assert "ZeroDivisionError" in rows["defect_route_crashes"]["defects"][0]["detail"]
    assert {d["target"] for d in rows["defect_verifier_raises"]["defects"]} == {"t03"}
    assert {d["target"] for d in rows["defect_task_already_satisfied"]["defects"]} == {"t04"}
    assert "OPENAI_API_KEY" in rows["defect_secret_attempt"]["defects"][0]["detail"]
    assert "urllib" in rows["defect_network_attempt"]["defects"][0]["detail"]


@pytest.mark.unit
def test_malformed_release_files_are_named(tmp_path):
    release = tmp_path / "release"
    shutil.copytree(SAMPLE, release)
    with pytest.raises(AwmFormatError, match="no scenario nope"):
        read_release(release, ["nope"])
    (release / "gen_tasks.jsonl").write_text('{"scenario": "city_library", "tasks": [\n')
    with pytest.raises(AwmFormatError, match=r"gen_tasks.jsonl:1: invalid JSON"):
        read_release(release)
    (release / "gen_envs.jsonl").unlink()
    with pytest.raises(AwmFormatError, match="lacks gen_envs.jsonl"):
        read_release(release)


# -- export and round trip -----------------------------------------------------------------------


def contents(world: bytes) -> dict[str, list[tuple]]:
    import sqlite3

    conn = sqlite3.connect(":memory:")
    conn.deserialize(world)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return {t: sorted(conn.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}


def test_export_then_import_gives_environments_that_pass_the_same_checks(runtime, golden, tmp_path):
    from typer.testing import CliRunner

    from worldsmith.bundle.loader import write_bundle
    from worldsmith.cli import app
    from worldsmith.interop.awm_export import export_bundles
    from worldsmith.llm.procedural.backend import procedural_bundle

    originals = [golden, procedural_bundle("clinic", 1), procedural_bundle("banking", 2)]
    release = export_bundles(originals, tmp_path / "release")
    records = [json.loads(line) for line in (release / "gen_envs.jsonl").read_text().splitlines()]
    assert all("@app.post(" in r["full_code"] and "create_engine(" in r["full_code"] for r in records)
    again = {s.key: s for s in read_release(release)}
    assert set(again) == {b.env_id for b in originals}
    for original in originals:
        imported = import_scenario(again[original.env_id], runtime, "code")
        assert imported.defects == [] and imported.bundle is not None, imported.defects
        bundle = imported.bundle
        assert [t.name for t in bundle.tools] == [t.name for t in original.tools]
        assert [t.instruction for t in bundle.tasks] == [t.instruction for t in original.tasks]
        assert contents(bundle.world) == contents(original.world)  # the same tables and rows
        written = write_bundle(bundle, tmp_path / "bundles" / bundle.env_id)  # every probe, through the CLI
        checked = CliRunner().invoke(app, ["env", "check", str(written)])
        assert checked.exit_code == 0 and ", 0 failed" in checked.output, checked.output
        # the exported tool refuses as the original does: a ToolError becomes HTTP 409, a tool_error again
        with runtime.open_episode(original) as before, runtime.open_episode(bundle) as after:
            step = original.tasks[0].solution[-1]
            first = (before.call_tool(step.tool, step.arguments), after.call_tool(step.tool, step.arguments))
            assert [r.status for r in first] == ["ok", "ok"] and first[0].value == first[1].value


def test_cli_round_trip_of_a_set(home, golden):
    from typer.testing import CliRunner

    from worldsmith.cli import app

    runner = CliRunner()
    assert runner.invoke(app, ["catalog", "publish", str(golden.root)]).exit_code == 0
    assert runner.invoke(app, ["sets", "create", "shop", "--validation-fraction", "0"]).exit_code == 0
    exported = runner.invoke(app, ["export", "awm", "shop", str(home / "release")])
    assert exported.exit_code == 0 and "retail_store@1" in exported.output
    imported = runner.invoke(app, ["import", "awm", str(home / "release"), "--json"])
    assert imported.exit_code == 0, imported.output
    (row,) = json.loads(imported.output)
    assert (row["env_id"], row["status"], row["defects"]) == ("retail_store", "good", [])
    assert row["ref"] == "retail_store@2"  # the same world as a new version of the ASGI kind
    bad = runner.invoke(app, ["import", "awm", str(home / "nowhere")])
    assert bad.exit_code == 2 and f"{home / 'nowhere'} is not a directory" in bad.output


@pytest.mark.flow
def test_import_publishes_one_good_environment_that_the_evaluate_flow_evaluates(prefect_api, home, runtime):
    """One import (SQL verifiers) published with its quality record; the same content imported again
    is the same version; the published environment is evaluated by the evaluate flow."""
    from worldsmith.flows.evaluate import run_evaluate
    from worldsmith.settings import get_settings
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.objectstore import open_store
    from worldsmith.storage.sets import SetQuery, create_set
    from worldsmith.tasks.parameters import EvaluateParameters

    store, catalog = open_store(get_settings().resolved_store_url()), open_catalog()
    (row,) = import_release(SAMPLE, runtime, store, catalog, mode="sql")
    assert (row["scenario"], row["ref"], row["status"], row["defects"]) == (
        "city_library",
        "city_library@1",
        "good",
        [],
    )
    assert row["tools"] == len(endpoints()) == 19 and row["tasks"] == 10
    # its template read each GET route ahead (strict isolation: docs/security.md, "Stand-in reads")
    assert row["read_ahead"] == sum(e["method"].upper() == "GET" for e in endpoints()) == 9
    with catalog.session() as session:
        reports = {r.kind: r.passed for r in session.exec(select(QualityReport)).all()}
    assert reports == {"expectations": True, "probes": True, "import": True}
    again = import_release(SAMPLE, runtime, store, catalog, mode="sql")
    assert again[0]["ref"] == "city_library@1"  # the same content is the same version
    create_set(
        catalog,
        "imported",
        SetQuery(categories=["awm-import"], require_passed=["probes", "import"], validation_fraction=0.0),
    )
    reference = run_evaluate(EvaluateParameters(set_name="imported", policy="reference"))
    assert (
        reference.overall.pass_at_1 == 1.0
        and reference.overall.episodes == 10
        and reference.overall.env_error_rate == 0.0
    )
    random_run = run_evaluate(EvaluateParameters(set_name="imported", policy="random", samples=2, max_turns=4))
    assert random_run.overall.episodes == 20 and random_run.overall.pass_at_1 < 0.5
    assert random_run.overall.env_error_rate == 0.0  # random arguments are the agent's errors, not the environment's
