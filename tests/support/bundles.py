"""Variants of a bundle for tests: extra tools appended, or narrowed to a few tasks."""

from __future__ import annotations

from worldsmith.bundle.contract import Bundle, artifact_digest
from worldsmith.bundle.loader import build_bundle
from worldsmith.models.bundle import ToolSchema


def with_tools(bundle: Bundle, source: str, names: list[str], *, verifiers: str = "") -> Bundle:
    """`bundle` with `source` appended to tools.py and `names` exposed as argument-less tools (and
    `verifiers` appended to verifiers.py: tasks of a test name them, `TaskSpec`s given to `open_episode`).

    Built directly, without the loader's static checks, so the run-time layers are what is tested.
    """
    files = dict(bundle.files)
    files["tools.py"] = bundle.files["tools.py"] + b"\n\n" + source.encode()
    if verifiers:
        files["verifiers.py"] = bundle.files["verifiers.py"] + b"\n\n" + verifiers.encode()
    digests = {name: artifact_digest(files[name]) for name in ("tools.py", "verifiers.py")}
    artifacts = dict(bundle.manifest.artifacts, **digests)
    extra = [
        ToolSchema(name=n, description=f"test tool {n}", parameters={"type": "object", "properties": {}}) for n in names
    ]
    return Bundle(
        manifest=bundle.manifest.model_copy(update={"artifacts": artifacts}),
        files=files,
        tasks=bundle.tasks,
        tools=bundle.tools + tuple(extra),
    )


def narrowed(bundle: Bundle, task_ids: tuple[str, ...]) -> Bundle:
    """`bundle` with only the tasks `task_ids` and the tools their reference solutions call (the
    other public functions of tools.py cut from its syntax tree), rebuilt by the loader, so it
    passes every check and publishes as it is."""
    import ast
    import json

    tasks = [bundle.task(t) for t in task_ids]
    used = {s.tool for t in tasks for s in t.solution}
    source = bundle.text("tools.py")
    kept = [
        ast.get_source_segment(source, node)
        for node in ast.parse(source).body
        if not isinstance(node, ast.FunctionDef) or node.name in used or node.name.startswith("_")
    ]
    sources = {name: bundle.files[name] for name in ("schema.sql", "seed.sql", "verifiers.py")}
    sources["tools.py"] = "\n\n\n".join(kept) + "\n"
    sources["tasks.jsonl"] = "".join(json.dumps(t.model_dump(mode="json")) + "\n" for t in tasks)
    return build_bundle(sources, {"env_id": bundle.env_id, "scenario": bundle.manifest.scenario.model_dump()})
