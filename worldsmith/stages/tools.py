"""Stage `tools`: a tool specification, then tools.py implementing it. The code must pass the
static policy, match the specification, and every tool must run in the sandbox (a refusal counts
as running; a crash does not). Feedback for the code step (`work.resume_step == "code"`) keeps the
specification and asks for the code again. Both prompts show the world's conventions and a bounded view
of the seeded rows (seedview.seed_view: the rows the tasks name, then the tables they filter on). The model may
look (stages/looking.py): SQL over the seed from the first attempt, and calls of the latest tools.py that ran
(an earlier round's, or this run's latest attempt that got as far as the sandbox)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jsonschema

from worldsmith.bundle.codepolicy import check_source
from worldsmith.bundle.contract import Bundle, artifact_digest
from worldsmith.bundle.sqlscript import build_world
from worldsmith.bundle.toolspec import derive_tool_schemas
from worldsmith.jsonvalue import JsonValue
from worldsmith.llm.backend import Generator, Prompt
from worldsmith.models.bundle import Manifest, ToolSchema
from worldsmith.models.specs import ToolCode, ToolPlan
from worldsmith.quality.probes import probe_tools
from worldsmith.quality.seedview import TOOLS_VIEW_CHARS, named_by_tasks, seed_view
from worldsmith.runtime.episode import Runtime
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.history import Fault
from worldsmith.stages.looking import offer_looks, with_looks
from worldsmith.stages.order import Stage
from worldsmith.stages.repair import CheckFailed, refuse_repeated, run_with_repair
from worldsmith.stages.work import EnvWork


def check_plan(plan: ToolPlan) -> ToolPlan:
    refuse_repeated([t.name for t in plan.tools], "duplicate_tools", "tool names")
    for tool in plan.tools:
        try:
            jsonschema.Draft202012Validator.check_schema(tool.parameters)
        except jsonschema.SchemaError as exc:
            raise CheckFailed(
                "bad_schema",
                f"tool {tool.name}: parameters are not a valid JSON Schema: {exc.message}",
                [Fault(kind="bad_schema", subject=tool.name)],
            ) from None
        if tool.parameters.get("type") != "object":
            raise CheckFailed(
                "bad_schema",
                f"tool {tool.name}: parameters must be a JSON Schema of type object",
                [Fault(kind="bad_schema", subject=tool.name)],
            )
    return plan


def tools_only_bundle(
    work: EnvWork,
    tools_py: str,
    tools: Sequence[Mapping[str, JsonValue]],
    *,
    world: bytes | None = None,
    generator: Generator | None = None,
) -> Bundle:
    """A provisional bundle of the schema, seed (or `world`, built already) and tools (no tasks yet), to run
    tools in the sandbox under the world's clock (as its episodes will run them); with `generator`, its
    manifest is the one the finished bundle gets (provenance included)."""
    if world is None:
        world, faults = build_world(work.schema_sql or "", work.seed_sql or "")
        if world is None:
            raise CheckFailed("seed_error", f"the database does not build: {faults[0].problem}")
    files = {"tools.py": tools_py.encode(), "verifiers.py": b"", "world.db": world}
    artifacts = {n: artifact_digest(d) for n, d in files.items()}
    manifest = (
        work.manifest(generator, artifacts=artifacts)
        if generator is not None
        else Manifest(env_id=work.env_id, scenario=work.scenario, clock=work.now, artifacts=artifacts)
    )
    return Bundle(manifest=manifest, files=files, tasks=(), tools=tuple(ToolSchema.model_validate(t) for t in tools))


def run_tools_stage(
    work: EnvWork,
    generator: Generator,
    runtime: Runtime,
    log: AttemptLog,
    max_attempts: int,
    feedback: str | None = None,
) -> EnvWork:
    spec_step, code_step = Stage.TOOLS.step("spec"), Stage.TOOLS.step("code")
    spec_history, code_history = work.history_of(spec_step), work.history_of(code_step)
    world, _ = build_world(work.schema_sql or "", work.seed_sql or "")
    named = named_by_tasks(work.tasks) if work.tasks else []
    rows = seed_view(world, named, limit=TOOLS_VIEW_CHARS, texts=work.task_texts()) if world else "(none)"
    ran: list[Bundle] = []  # the latest tools that ran: an earlier round's, then each attempt's that got to run
    if world is not None and work.tools_py:
        earlier, issues = derive_tool_schemas(work.tools_py)
        ran += [] if issues else [tools_only_bundle(work, work.tools_py, earlier, world=world)]

    def looking(prompt: Prompt) -> Prompt:
        return with_looks(prompt, offer_looks(world, runtime, ran[-1] if ran else None))

    def plan_prompt(extra: str | None) -> Prompt:
        return looking(work.prompt("tool_plan", extra, schema=work.schema_sql, tasks=work.task_lines(), seed_rows=rows))

    kept_plan = work.tool_plan if feedback is not None and work.resume_step == "code" else None
    plan = kept_plan or run_with_repair(
        stage=spec_step,
        env_id=work.env_id,
        generator=generator,
        prompt=plan_prompt,
        spec=ToolPlan,
        check=check_plan,
        log=log,
        max_attempts=max_attempts,
        first_feedback=feedback,
        history=spec_history,
    )
    planned = work.model_copy(update={"tool_plan": plan})

    def code_prompt(extra: str | None) -> Prompt:
        return looking(
            work.prompt("tool_code", extra, schema=work.schema_sql, tools=planned.tool_lines(), seed_rows=rows)
        )

    def check_code(code: ToolCode) -> str:
        problems = check_source(code.tools_py, "tools.py")
        if problems:
            raise CheckFailed(
                "code_policy",
                "\n".join(f"tools.py:{line}: {problem}" for line, problem in problems),
                [Fault(kind="code_policy", subject=problem[:200]) for _, problem in problems],
            )
        tools, issues = derive_tool_schemas(code.tools_py)
        if issues:
            raise CheckFailed("tool_contract", "\n".join(str(i) for i in issues))
        missing = sorted({t.name for t in plan.tools} - {t["name"] for t in tools})
        if missing:
            raise CheckFailed(
                "missing_tools",
                f"tools.py does not implement: {', '.join(missing)}",
                [Fault(kind="missing_tools", subject=name) for name in missing],
            )
        bundle = tools_only_bundle(work, code.tools_py, tools, world=world)
        ran.append(bundle)
        failures = [r for r in probe_tools(runtime, bundle) if not r.passed]
        if failures:
            raise CheckFailed(
                "tool_crash",
                "\n".join(f"calling {r.target} raised: {r.detail}" for r in failures),
                [Fault(kind=str(r.failure or "tool_crash"), subject=r.target) for r in failures],
                records=[r.record() for r in failures],
            )
        return code.tools_py

    tools_py = run_with_repair(
        stage=code_step,
        env_id=work.env_id,
        generator=generator,
        prompt=code_prompt,
        spec=ToolCode,
        check=check_code,
        log=log,
        max_attempts=max_attempts,
        first_feedback=feedback if kept_plan else None,
        history=code_history,
    )
    histories = work.remembering({spec_step: spec_history, code_step: code_history})
    return planned.model_copy(update={"tools_py": tools_py, "resume_step": None, "history": histories})
