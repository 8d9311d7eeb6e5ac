"""Stage `database`: the schema, then seed rows that make every task possible. Each is executed
on a fresh database; every statement must succeed (foreign keys enforced)."""

from __future__ import annotations

from worldsmith.bundle.loader import sql_issues
from worldsmith.bundle.sqlscript import build_world, check_schema
from worldsmith.llm.backend import Generator, Prompt
from worldsmith.models.specs import SchemaSpec, SeedSpec
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.order import Stage
from worldsmith.stages.repair import CheckFailed, run_with_repair
from worldsmith.stages.work import EnvWork


def _fail_on(faults: list, kind: str) -> None:
    if faults:
        raise CheckFailed(kind, "\n".join(str(issue) for issue in sql_issues(faults)))


def run_database_stage(
    work: EnvWork, generator: Generator, log: AttemptLog, max_attempts: int, feedback: str | None = None
) -> EnvWork:
    def schema_prompt(extra: str | None) -> Prompt:
        return work.prompt("schema", extra, tasks=work.task_lines())

    def check(spec: SchemaSpec) -> str:
        _fail_on(check_schema(spec.schema_sql), "sql_error")
        return spec.schema_sql

    schema_sql = run_with_repair(
        stage=Stage.DATABASE.step("schema"),
        env_id=work.env_id,
        generator=generator,
        prompt=schema_prompt,
        spec=SchemaSpec,
        check=check,
        log=log,
        max_attempts=max_attempts,
        first_feedback=feedback,
    )

    def seed_prompt(extra: str | None) -> Prompt:
        return work.prompt("seed", extra, schema=schema_sql, tasks=work.task_lines())

    def check_seed(spec: SeedSpec) -> str:
        _, faults = build_world(schema_sql, spec.seed_sql)
        _fail_on(faults, "seed_error")
        return spec.seed_sql

    seed_sql = run_with_repair(
        stage=Stage.DATABASE.step("seed"),
        env_id=work.env_id,
        generator=generator,
        prompt=seed_prompt,
        spec=SeedSpec,
        check=check_seed,
        log=log,
        max_attempts=max_attempts,
    )
    return work.model_copy(update={"schema_sql": schema_sql, "seed_sql": seed_sql})
