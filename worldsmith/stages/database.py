"""Stage `database`: the schema, then seed rows that make every task possible. Each is executed
on a fresh database; every statement must succeed (foreign keys enforced), and the seeded database
must hold every entity the tasks name (the coverage check). Feedback for the seed step
(`work.resume_step == "seed"`) keeps the schema and asks for the seed again. The schema step's answer
may state the world's conventions (`Conventions`), kept in `work.conventions` for every later prompt."""

from __future__ import annotations

from worldsmith.bundle.loader import sql_issues
from worldsmith.bundle.sqlscript import SqlFault, build_world, check_schema
from worldsmith.llm.backend import Generator, Prompt
from worldsmith.models.bundle import Conventions
from worldsmith.models.specs import SchemaSpec, SeedSpec, TaskList
from worldsmith.quality.seedview import missing_entities
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.history import Fault
from worldsmith.stages.order import Stage
from worldsmith.stages.repair import CheckFailed, run_with_repair
from worldsmith.stages.work import EnvWork


def _fail_on(faults: list[SqlFault], kind: str) -> None:
    if faults:  # a fault is about its problem (the statement's line moves from answer to answer)
        typed = [Fault(kind=kind, subject=f.problem.split("\n")[0][:200]) for f in faults]
        raise CheckFailed(kind, "\n".join(str(issue) for issue in sql_issues(faults)), typed)


def check_coverage(world: bytes, tasks: TaskList | None) -> None:
    """Raise CheckFailed("coverage") naming each task and entity no row of `world` holds."""
    missing = missing_entities(world, tasks) if tasks else {}
    if missing:
        lines = [f"{owner} names {', '.join(repr(e) for e in absent)}" for owner, absent in missing.items()]
        faults = [Fault(kind="coverage", subject=owner) for owner in missing]
        raise CheckFailed(
            "coverage",
            "the seed data lacks records the tasks name; no row holds these values:\n"
            + "\n".join(lines)
            + "\nAdd rows holding each value exactly as written (case aside), with the rows they need.",
            faults,
        )


def run_database_stage(
    work: EnvWork, generator: Generator, log: AttemptLog, max_attempts: int, feedback: str | None = None
) -> EnvWork:
    def schema_prompt(extra: str | None) -> Prompt:
        return work.prompt("schema", extra, tasks=work.task_lines())

    def check(spec: SchemaSpec) -> tuple[str, Conventions | None]:
        _fail_on(check_schema(spec.schema_sql), "sql_error")
        return spec.schema_sql, spec.conventions

    schema_step, seed_step = Stage.DATABASE.step("schema"), Stage.DATABASE.step("seed")
    schema_history, seed_history = work.history_of(schema_step), work.history_of(seed_step)
    keep = feedback is not None and work.resume_step == "seed" and work.schema_sql is not None
    if keep:
        schema_sql, conventions = work.schema_sql or "", work.conventions
    else:
        schema_sql, conventions = run_with_repair(
            stage=schema_step,
            env_id=work.env_id,
            generator=generator,
            prompt=schema_prompt,
            spec=SchemaSpec,
            check=check,
            log=log,
            max_attempts=max_attempts,
            first_feedback=feedback,
            history=schema_history,
        )
    stated = work.model_copy(update={"conventions": conventions})

    def seed_prompt(extra: str | None) -> Prompt:
        return stated.prompt("seed", extra, schema=schema_sql, tasks=work.task_lines())

    def check_seed(spec: SeedSpec) -> str:
        world, faults = build_world(schema_sql, spec.seed_sql)
        _fail_on(faults, "seed_error")
        check_coverage(world or b"", work.tasks)
        return spec.seed_sql

    seed_sql = run_with_repair(
        stage=seed_step,
        env_id=work.env_id,
        generator=generator,
        prompt=seed_prompt,
        spec=SeedSpec,
        check=check_seed,
        log=log,
        max_attempts=max_attempts,
        first_feedback=feedback if keep else None,
        history=seed_history,
    )
    return stated.model_copy(
        update={
            "schema_sql": schema_sql,
            "seed_sql": seed_sql,
            "resume_step": None,
            "history": work.remembering({schema_step: schema_history, seed_step: seed_history}),
        }
    )
