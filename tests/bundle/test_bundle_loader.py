"""The bundle loader: round trips, and an error naming file, place and problem for each defect."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.paths import GOLDEN

from worldsmith.bundle.contract import artifact_digest
from worldsmith.bundle.errors import BundleError
from worldsmith.bundle.loader import load_bundle, rebuild_bundle_dir, write_bundle

pytestmark = pytest.mark.unit


@pytest.fixture()
def copy(tmp_path: Path) -> Path:
    target = tmp_path / "bundle"
    shutil.copytree(GOLDEN, target)
    return target


def issues_of(path: Path) -> list[str]:
    with pytest.raises(BundleError) as info:
        load_bundle(path)
    return [str(i) for i in info.value.issues]


def edit(path: Path, name: str, old: str, new: str) -> None:
    text = (path / name).read_text()
    assert old in text, f"{old!r} not in {name}"
    (path / name).write_text(text.replace(old, new, 1))


def test_golden_bundle_loads_with_its_contents(golden):
    assert golden.env_id == "retail_store"
    assert golden.manifest.stats["tables"] >= 6
    assert len(golden.tools) >= 12
    assert len(golden.tasks) == 10
    assert golden.world[:16] == b"SQLite format 3\x00"


def test_write_then_load_reproduces_every_byte(golden, tmp_path):
    write_bundle(golden, tmp_path / "out")
    again = load_bundle(tmp_path / "out")
    assert again.files == golden.files
    assert again.key == golden.key
    assert (tmp_path / "out" / "manifest.json").read_bytes() == (GOLDEN / "manifest.json").read_bytes()


def test_missing_file_is_named(copy):
    (copy / "verifiers.py").unlink()
    assert any(i.startswith("verifiers.py: missing file") for i in issues_of(copy))


def test_missing_directory(tmp_path):
    assert "bundle directory not found" in issues_of(tmp_path / "nope")[0]


def test_a_hash_mismatch_names_the_file_with_both_hashes(copy):
    with (copy / "tools.py").open("a") as f:
        f.write("\n# tampered\n")
    problems = issues_of(copy)
    assert any(
        p.startswith("tools.py: sha256 mismatch: manifest.json says sha256:") and ", file is sha256:" in p
        for p in problems
    )


def test_an_sql_error_points_to_its_file_line_statement(copy):
    edit(copy, "seed.sql", "(3, 'Sofia Rossi'", "(3, 'Sofia Rossi', 'extra'")
    problems = issues_of(copy)
    hit = [p for p in problems if p.startswith("seed.sql:") and "SQL error" in p]
    assert hit, problems
    assert hit[0].startswith("seed.sql:3: SQL error: 2 values for 1 columns") or hit[0].split(":")[1].isdigit()
    assert "in: INSERT INTO customers" in hit[0]


def test_seed_row_breaking_a_foreign_key_fails(copy):
    edit(copy, "seed.sql", "(1, 3, 1, 5, 'Best headphones", "(1, 3, 99, 5, 'Best headphones")
    problems = [p for p in issues_of(copy) if p.startswith("seed.sql:") and "SQL error" in p]
    assert (
        problems
        and "FOREIGN KEY constraint failed (reviews row 1: customer_id=99 has no match in customers)" in problems[0]
    )


def test_schema_may_only_create(copy):
    with (copy / "schema.sql").open("a") as f:
        f.write("\nATTACH DATABASE '/tmp/x.db' AS x;\n")
    assert any(
        "schema.sql:" in p and "only CREATE statements are allowed here, not ATTACH" in p for p in issues_of(copy)
    )


def test_unterminated_statement(copy):
    with (copy / "seed.sql").open("a") as f:
        f.write("\nINSERT INTO coupons (code, percent_off) VALUES ('X', 5)\n")
    assert any("unterminated statement" in p for p in issues_of(copy))


def test_tool_argument_without_type_is_named_with_line(copy):
    edit(copy, "tools.py", "def get_product(conn, sku: str) -> dict:", "def get_product(conn, sku) -> dict:")
    problems = issues_of(copy)
    assert any(
        p.startswith("tools.py:") and "tool 'get_product': argument 'sku' has no type annotation" in p for p in problems
    )


def test_tool_argument_without_docstring_entry(copy):
    edit(copy, "tools.py", '        sku: The product\'s SKU, e.g. "KB-101".\n', "")
    problems = issues_of(copy)
    assert any("argument 'sku' is not documented" in p for p in problems)


def test_tool_without_docstring(copy):
    edit(
        copy,
        "tools.py",
        '    """Mark a paid order as shipped.\n\n    Args:\n        order_id: The paid order to ship.\n    """\n',
        "",
    )
    assert any("tool 'ship_order' has no docstring" in p for p in issues_of(copy))


def test_task_with_missing_verifier(copy):
    edit(copy, "verifiers.py", "def verify_t04_return_headphones(", "def verify_t04_renamed(")
    problems = issues_of(copy)
    assert any(
        p.startswith("tasks.jsonl:4: task 't04_return_headphones': verifier 'verify_t04_return_headphones' is missing")
        for p in problems
    )


def test_task_solution_calling_unknown_tool(copy):
    edit(copy, "tasks.jsonl", '"tool": "request_return"', '"tool": "refund_everything"')
    assert any("tasks.jsonl:4:" in p and "calls unknown tool 'refund_everything'" in p for p in issues_of(copy))


def test_task_solution_with_bad_arguments(copy):
    edit(copy, "tasks.jsonl", '"order_id": 1002, "sku": "HD-330"', '"order_id": "1002", "sku": "HD-330"')
    assert any("tasks.jsonl:4:" in p and "is not of type 'integer'" in p for p in issues_of(copy))


def test_task_with_empty_solution(copy):
    lines = (copy / "tasks.jsonl").read_text().splitlines()
    task = json.loads(lines[0])
    task["solution"] = []
    lines[0] = json.dumps(task)
    (copy / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    assert any("tasks.jsonl:1:" in p and "reference solution is missing" in p for p in issues_of(copy))


def test_malformed_task_line(copy):
    with (copy / "tasks.jsonl").open("a") as f:
        f.write('{"id": "t11", "instruction": "x"\n')
    assert any(p.startswith("tasks.jsonl:11: invalid task") for p in issues_of(copy))


def test_forbidden_import_is_refused_at_load(copy):
    edit(
        copy,
        "tools.py",
        "from worldsmith.runtime import ToolError",
        "import os\nfrom worldsmith.runtime import ToolError",
    )
    assert any(p.startswith("tools.py:8: import of 'os' is not allowed") for p in issues_of(copy))


def test_dunder_escape_is_refused_at_load(copy):
    with (copy / "verifiers.py").open("a") as f:
        f.write("\n\ndef _escape():\n    return ().__class__.__base__.__subclasses__()\n")
    problems = issues_of(copy)
    assert any("verifiers.py:" in p and "'__subclasses__' is not allowed" in p for p in problems)


def test_manifest_errors(copy):
    data = json.loads((copy / "manifest.json").read_text())
    data["env_id"] = "Retail Store!"
    (copy / "manifest.json").write_text(json.dumps(data))
    assert any(p.startswith("manifest.json: field env_id") and "snake_case" in p for p in issues_of(copy))


def test_stale_tools_json_is_reported(copy):
    data = json.loads((copy / "tools.json").read_text())
    data[0]["description"] = "something else"
    (copy / "tools.json").write_text(json.dumps(data, indent=2) + "\n")
    problems = issues_of(copy)
    assert any(p.startswith("tools.json: does not match") for p in problems)


def _write_tools_json(path: Path, tools: list) -> None:
    """Write tools.json as a hand-written world might, its manifest hash updated to match."""
    data = (json.dumps(tools, sort_keys=True, separators=(",", ":")) + "\n").encode()
    (path / "tools.json").write_bytes(data)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["artifacts"]["tools.json"] = artifact_digest(data)
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def test_tools_json_spelled_differently_but_meaning_the_same_loads(copy, golden):
    tools = json.loads((copy / "tools.json").read_text())[::-1]  # other tool order, key order, layout
    for tool in tools:
        tool["description"] = "  " + tool["description"].replace(" ", "\n    ") + "\n"
        parameters = tool["parameters"]
        parameters["required"] = parameters["required"][::-1]
        if not parameters["required"]:
            del parameters["required"]
        for schema in parameters["properties"].values():
            kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if len(kinds) > 1:
                del schema["type"]
                schema["anyOf"] = [{"type": k} for k in kinds[::-1]]
            else:
                schema["type"] = kinds
    _write_tools_json(copy, tools)
    bundle = load_bundle(copy)
    assert bundle.tools == golden.tools
    assert bundle.files["tools.json"] == (copy / "tools.json").read_bytes()  # as written: its hash holds


def test_tools_json_differing_in_meaning_names_the_tool_and_what_differs(copy):
    tools = json.loads((copy / "tools.json").read_text())
    by_name = {t["name"]: t for t in tools}
    by_name["get_customer"]["parameters"]["properties"]["customer_id"]["type"] = "string"
    by_name["list_orders"]["parameters"]["required"].append("status")
    by_name["find_customer"]["description"] = "Look up a customer by name."
    _write_tools_json(copy, tools)
    problems = [p for p in issues_of(copy) if p.startswith("tools.json: does not match")]
    assert len(problems) == 3, problems
    assert any("'get_customer': parameters.properties.customer_id.type" in p for p in problems)
    assert any("'list_orders': parameters.required" in p and "status" in p for p in problems)
    assert any("'find_customer': description" in p and "by name" in p for p in problems)


def test_rebuild_after_editing_sources_makes_it_load(copy):
    edit(copy, "seed.sql", "('SAVE10',   10,", "('SAVE10',   12,")
    with pytest.raises(BundleError):
        load_bundle(copy)
    rebuilt = rebuild_bundle_dir(copy)
    assert load_bundle(copy).key == rebuilt.key


def test_every_defect_is_reported_at_once(copy):
    (copy / "verifiers.py").unlink()
    edit(copy, "tools.py", "def get_product(conn, sku: str) -> dict:", "def get_product(conn, sku) -> dict:")
    problems = issues_of(copy)
    assert len(problems) >= 3  # missing file, hash of tools.py, missing annotation


def test_the_manifest_names_exactly_the_kinds_there_are():
    from typing import get_args

    from worldsmith.bundle.kinds import TOOLS_KINDS, VERIFIERS_KINDS
    from worldsmith.models.bundle import Manifest

    def names(field: str) -> set[str | None]:
        literal, _ = get_args(Manifest.model_fields[field].annotation)  # Literal[...] | None
        return {*get_args(literal), None}

    assert names("tools_kind") == set(TOOLS_KINDS)
    assert names("verifiers_kind") == set(VERIFIERS_KINDS)
