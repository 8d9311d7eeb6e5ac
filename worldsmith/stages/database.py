"""Stage `database`: the schema, then seed rows that make every task possible. Each is executed
on a fresh database; every statement must succeed (foreign keys enforced), and the seeded database
must hold every entity the tasks name (the coverage check). The schema's answer also states the world's
invariants (queries returning the rows that break them: each must run on the schema), and the seed must
break none of them (`invariant_broken` names each broken one with its offending rows). Feedback for the
seed step (`work.resume_step == "seed"`) keeps the schema and asks for the seed again. The schema step's
answer may state the world's conventions (`Conventions`), kept in `work.conventions` for every later prompt."""

from __future__ import annotations

from worldsmith.bundle.invariants import broken_invariants, invariant_problems
from worldsmith.bundle.loader import sql_issues
from worldsmith.bundle.sqlscript import (
    BUILD_BUDGET,
    SqlFault,
    bounded_connection,
    build_world,
    check_schema,
    snapshot,
    split_statements,
)
from worldsmith.llm.backend import Generator, Prompt
from worldsmith.models.bundle import Conventions, Invariant
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


def _schema_only(schema_sql: str) -> bytes:
    """The empty database of `schema_sql` (a schema `check_schema` passed), serialized."""
    with bounded_connection(BUILD_BUDGET) as (conn, _):
        for statement in split_statements(schema_sql):
            conn.execute(statement.sql)
        return snapshot(conn)


def check_invariant_sql(spec: SchemaSpec) -> None:
    """Raise CheckFailed("invariant_sql_error") naming each invariant that is not one SELECT or does not run
    on the schema (an empty database of it)."""
    problems = invariant_problems(spec.invariants)
    if not problems and spec.invariants:
        problems = [v.describe() for v in broken_invariants(_schema_only(spec.schema_sql), spec.invariants) if v.error]
    if problems:
        raise CheckFailed(
            "invariant_sql_error",
            "these invariants cannot be checked:\n"
            + "\n".join(problems)
            + "\nGive each as one SELECT over the schema's tables that returns the rows breaking it.",
        )


def check_seed_invariants(world: bytes, invariants: list[Invariant]) -> None:
    """Raise CheckFailed("invariant_broken") naming each invariant the seeded database `world` breaks, with the
    offending rows: the seed must keep the world's own rules."""
    broken = broken_invariants(world, invariants)
    if broken:
        raise CheckFailed(
            "invariant_broken",
            "the seed data breaks the world's invariants:\n"
            + "\n".join(f"- {v.describe()}" for v in broken)
            + "\nChange the seed rows so that every invariant holds (keep the invariants as stated).",
        )


def run_database_stage(
    work: EnvWork, generator: Generator, log: AttemptLog, max_attempts: int, feedback: str | None = None
) -> EnvWork:
    def schema_prompt(extra: str | None) -> Prompt:
        return work.prompt("schema", extra, tasks=work.task_lines())

    def check(spec: SchemaSpec) -> tuple[str, Conventions | None, list[Invariant]]:
        _fail_on(check_schema(spec.schema_sql), "sql_error")
        check_invariant_sql(spec)
        return spec.schema_sql, spec.conventions, spec.invariants

    schema_step, seed_step = Stage.DATABASE.step("schema"), Stage.DATABASE.step("seed")
    schema_history, seed_history = work.history_of(schema_step), work.history_of(seed_step)
    keep = feedback is not None and work.resume_step == "seed" and work.schema_sql is not None
    if keep:
        schema_sql, conventions, invariants = work.schema_sql or "", work.conventions, work.invariants
    else:
        schema_sql, conventions, invariants = run_with_repair(
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
    stated = work.model_copy(update={"conventions": conventions, "invariants": invariants})

    def seed_prompt(extra: str | None) -> Prompt:
        listed = "\n".join(f"- {i.id}: {i.statement}\n  {' '.join(i.sql.split())}" for i in invariants) or "none stated"
        return stated.prompt("seed", extra, schema=schema_sql, invariants=listed, tasks=work.task_lines())

    def check_seed(spec: SeedSpec) -> str:
        world, faults = build_world(schema_sql, spec.seed_sql)
        _fail_on(faults, "seed_error")
        check_coverage(world or b"", work.tasks)
        check_seed_invariants(world or b"", invariants)
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
