"""Great Expectations (1.x) suites built from a world's schema and run on its seed tables.

Per table: not empty; primary key not null and unique; NOT NULL columns filled; foreign keys
resolve; CHECK sets and ranges respected. Every failure names the table, column(s), check and
the offending rows (rowid and value). Runs in an ephemeral context: no files, no network.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import TYPE_CHECKING, Any

from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.quality import QualityCheck
from worldsmith.quality.memo import SharedMemo, content_digest
from worldsmith.quality.schema import TableSchema, read_schema

if TYPE_CHECKING:  # Great Expectations (and pandas) are imported when a world is validated (slow to import)
    import pandas as pd
    from great_expectations.core.batch_definition import BatchDefinition
    from great_expectations.core.expectation_suite import ExpectationSuite
    from great_expectations.expectations import Expectation

ROWID = "_rowid_"
MAX_OFFENDING = 20


def _plain(value: Any) -> Any:
    """numpy scalars, pandas NA and NaN as plain JSON values."""
    try:
        import pandas as pd

        if value is pd.NA:
            return None
    except ImportError:  # pragma: no cover
        pass
    if isinstance(value, float) and value != value:
        return None
    return value.item() if hasattr(value, "item") else value


def _context() -> BatchDefinition[None]:
    """A batch of a whole pandas frame, in an ephemeral context (no files, no network)."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    context = gx.get_context(
        mode="ephemeral",
        project_config=DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(), progress_bars=ProgressBarsConfig(globally=False)
        ),
    )
    return (
        context.data_sources.add_pandas("worldsmith")
        .add_dataframe_asset("table")
        .add_batch_definition_whole_dataframe("whole")
    )


def _suite(table: TableSchema, frame: pd.DataFrame, frames: dict[str, pd.DataFrame]) -> ExpectationSuite:
    """The expectation suite of one table; foreign keys become derived orphan columns of `frame`."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    def meta(check: str, columns: list[str]) -> JsonObject:
        return {"check": check, "table": table.name, "columns": [*columns]}

    expectations: list[Expectation] = [gxe.ExpectTableRowCountToBeBetween(min_value=1, meta=meta("not_empty", []))]
    for column in table.primary_key:
        expectations.append(
            gxe.ExpectColumnValuesToNotBeNull(column=column, meta=meta("primary_key_not_null", [column]))
        )
    if len(table.primary_key) == 1:
        column = table.primary_key[0]
        expectations.append(gxe.ExpectColumnValuesToBeUnique(column=column, meta=meta("primary_key_unique", [column])))
    elif len(table.primary_key) > 1:
        expectations.append(
            gxe.ExpectCompoundColumnsToBeUnique(
                column_list=table.primary_key,
                ignore_row_if="any_value_is_missing",
                meta=meta("primary_key_unique", table.primary_key),
            )
        )
    for column in table.not_null:
        if column not in table.primary_key:
            expectations.append(gxe.ExpectColumnValuesToNotBeNull(column=column, meta=meta("not_null", [column])))
    for column, parent, parent_column in table.foreign_keys:
        parent_frame = frames.get(parent)
        keys = (
            parent_frame[parent_column].dropna() if parent_frame is not None and parent_column in parent_frame else []
        )
        orphan = f"__orphan_{column}"
        # a derived column (orphans, else null): GX's value sets grow slow on big parents
        frame[orphan] = frame[column].where(~frame[column].isin(list(keys)))
        expectations.append(
            gxe.ExpectColumnValuesToBeNull(
                column=orphan, meta=meta(f"foreign_key -> {parent}.{parent_column}", [column])
            )
        )
    for column, values in table.enums.items():
        expectations.append(
            gxe.ExpectColumnValuesToBeInSet(column=column, value_set=values, meta=meta(f"check_in {values}", [column]))
        )
    for column, bounds in table.ranges.items():
        expectations.append(
            gxe.ExpectColumnValuesToBeBetween(
                column=column,
                min_value=bounds.low,
                max_value=bounds.high,
                strict_min=bounds.strict_low,
                strict_max=bounds.strict_high,
                meta=meta(f"check_range [{bounds.low}, {bounds.high}]", [column]),
            )
        )
    return gx.ExpectationSuite(name=f"seed_{table.name}", expectations=expectations)


def _errors(result: Any) -> list[str]:
    info = result.exception_info or {}
    if "raised_exception" in info:
        return [info["exception_message"]] if info.get("raised_exception") else []
    return [v["exception_message"] for v in info.values() if isinstance(v, dict) and v.get("exception_message")]


def _failure(result: Any) -> JsonObject:
    """A failed expectation's detail (stored in the check's details): where, which, the offending rows."""
    meta = result.expectation_config.meta or {}
    detail: JsonObject = {
        "table": meta.get("table"),
        "columns": meta.get("columns"),
        "check": meta.get("check"),
        "expectation": result.expectation_config.type,
    }
    payload = result.result or {}
    if "observed_value" in payload:
        detail["observed"] = _plain(payload["observed_value"])
    if "unexpected_count" in payload:
        detail["unexpected_count"] = _plain(payload["unexpected_count"])
        offending: list[JsonValue] = []
        for entry in (payload.get("unexpected_index_list") or [])[:MAX_OFFENDING]:
            if isinstance(entry, dict):
                row = {k: _plain(v) for k, v in entry.items()}
                row = {("rowid" if k == ROWID else k.removeprefix("__orphan_")): v for k, v in row.items()}
                offending.append(row)
        detail["offending"] = offending
    errors = _errors(result)
    if errors:
        detail["error"] = "; ".join(errors)
    return detail


#: The expectations' outcome per world (digest of its bytes): `validate_world(reuse=True)`.
_OUTCOMES: SharedMemo[QualityCheck] = SharedMemo(64)


def validate_world(world: bytes, *, reuse: bool = False) -> QualityCheck:
    """Run the seed-data expectations on a serialized world database. With `reuse`, the outcome for the
    same bytes computed earlier in this process, or being computed now (the verifiers stage starts it
    while the model answers: stages/verifiers.py), is returned instead."""
    if reuse:
        return _OUTCOMES.get(content_digest(world), lambda: _validated(world))
    return _validated(world)


def _validated(world: bytes) -> QualityCheck:
    import pandas as pd

    conn = sqlite3.connect(":memory:")
    conn.deserialize(world)
    tables = read_schema(conn)
    frames: dict[str, pd.DataFrame] = {}
    for table in tables:
        select = (
            f'SELECT rowid AS "{ROWID}", * FROM "{table.name}" ORDER BY rowid'
            if table.has_rowid
            else f'SELECT * FROM "{table.name}"'
        )
        frames[table.name] = pd.read_sql(select, conn, dtype_backend="numpy_nullable")
    conn.close()
    batch_definition = _context()
    evaluated = 0
    failures: list[JsonObject] = []
    for table in tables:
        frame = frames[table.name].copy()
        suite = _suite(table, frame, frames)
        index_columns = [ROWID] if table.has_rowid else table.primary_key[:1]
        result = batch_definition.get_batch(batch_parameters={"dataframe": frame}).validate(
            suite, result_format={"result_format": "COMPLETE", "unexpected_index_column_names": index_columns}
        )
        evaluated += len(result.results)
        failures.extend(_failure(r) for r in result.results if not r.success)
    failures.sort(key=lambda f: (str(f["table"] or ""), str(f["check"] or "")))
    summary: JsonObject = {"tables": len(tables), "expectations": evaluated, "failed": len(failures)}
    if failures:
        first, columns = failures[0], failures[0]["columns"]
        where = f"{first['table']}" + (
            f".{','.join(map(str, columns))}" if isinstance(columns, list) and columns else ""
        )
        summary["reason"] = (
            f"{len(failures)} of {evaluated} seed-data expectations failed (first: {where} {first['check']})"
        )
    return QualityCheck("expectations", not failures, summary, failures)


def validate_seed_data(bundle: Bundle, *, reuse: bool = False) -> QualityCheck:
    """The expectations of `bundle`'s schema run on its seed tables (`reuse`: see validate_world)."""
    return validate_world(bundle.world, reuse=reuse)
