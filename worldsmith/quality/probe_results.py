"""What an execution probe found, as typed values: which probe (`Probe`) checked what (`target`), whether it
passed, and of a failure what went wrong (`ProbeFailure`: one probe's failure, the fault of one `Artifact`,
its `owner`), what in the target it points at (`cause`) and the sandbox `limit` the code broke (the
runtime's `ToolResult.limit`, with the module of a refused import). Whoever acts on a failure reads these
fields (stages/routing.py, interop/report.py); `detail` is its account for people."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, Self

from worldsmith.jsonvalue import JsonObject, JsonValue


class Probe(StrEnum):
    """The execution probes, by the name their results carry (quality/probes.py, quality/deep_probes.py)."""

    TOOLS_LOAD = "tools load"
    TOOL_RUNS = "tool runs"
    VALID_INPUTS = "tool runs on valid inputs"
    INVALID_INPUTS = "tool refuses invalid inputs"
    READ_ONLY = "read tool writes nothing"
    OWN_TABLES = "tool writes only its tables"
    TASK_NOT_BLOCKED = "task not blocked"
    REFERENCE_ACCEPTED = "reference accepted"
    UNTOUCHED_REJECTED = "untouched rejected"
    REPLAY_DETERMINISTIC = "replay deterministic"
    BOUNDARY_INPUTS = "tool runs on boundary inputs"  # quality/input_probes.py
    TOOL_DETERMINISTIC = "tool replay deterministic"  # quality/tool_replays.py
    SEED_INVARIANTS = "seed keeps invariants"  # quality/invariants.py
    END_STATE_INVARIANTS = "end state keeps invariants"  # quality/invariants.py
    # what tools do, not only that they run (quality/behaviour_probes.py)
    READ_FILTERS = "read returns what its filters select"  # quality/read_filters.py
    RANGE_BOUNDARIES = "documented range bounds hold"  # quality/range_bounds.py
    WRITE_EFFECTS = "write sets the columns its arguments name"  # quality/write_effects.py
    DEPENDENT_ROWS = "dependent rows follow a removed row"  # quality/write_effects.py
    NO_SQL_FROM_ARGUMENTS = "no SQL text built from arguments"  # quality/sql_injection.py
    WRONG_END_STATE_REJECTED = "verifier rejects a wrong end state"  # quality/verifier_mutations.py
    EQUIVALENT_END_STATE_ACCEPTED = "verifier accepts an equivalent end state"  # quality/verifier_mutations.py
    NO_SEED_IDS = "verifier names no seed-only id"  # quality/verifier_ids.py


class Artifact(StrEnum):
    """The part of an environment a failed probe finds at fault: what must change for it to pass."""

    TOOL_CODE = "tool code"
    SEED = "seed"
    VERIFIERS = "verifiers"  # the verifiers and the tasks' reference solutions, written together
    INVARIANTS = "invariants"  # the world's invariants, stated with its schema


class ProbeFailure(StrEnum):
    """What went wrong in a failed probe. Each is the failure of one probe (`probe`) and the fault of one
    artifact (`owner`)."""

    TOOLS_DO_NOT_LOAD = "tools do not load"  # the tool module (or app) does not load: no tool can run
    TOOL_CRASHED = "tool crashed"  # its one call ended in env_error
    VALID_INPUT_CRASHED = "valid input crashed"
    INVALID_INPUT_CRASHED = "invalid input crashed"
    INVALID_INPUT_WRITTEN = "invalid input written"  # instead of refused
    READ_TOOL_WROTE = "read tool wrote"
    WROTE_OTHER_TABLES = "wrote other tables"  # a writing tool changed a table that is not its own
    BLOCKED_BY_REFUSED_STEP = "blocked by a refused step"  # a reference call ends in a ToolError
    BLOCKED_BY_MISSING_RECORD = "blocked by a missing record"  # the task names a record the seed lacks
    REFERENCE_STEP_CRASHED = "reference step crashed"  # a step gave env_error
    REFERENCE_STEP_REFUSED = "reference step refused"  # a step gave tool_error
    REFERENCE_REJECTED = "reference rejected"  # the verifier did not judge the reference complete
    UNTOUCHED_ACCEPTED = "untouched accepted"  # the verifier judged the untouched database complete
    UNTOUCHED_VERIFIER_CRASHED = "untouched verifier crashed"  # ... or failed judging it
    REPLAY_DIFFERS_IN_TOOL = "replay differs in a tool"  # a result, or the database after a step
    REPLAY_DIFFERS_IN_VERIFIER = "replay differs in the verifier"  # its verdict
    REPLAY_DIFFERS_IN_END_STATE = "replay differs in the end state"
    BOUNDARY_INPUT_CRASHED = "boundary input crashed"  # a boundary date, a quote, a NULL column ...
    TOOL_REPLAY_DIFFERS = "tool replay differs"  # its calls replayed in another process
    SEED_BREAKS_INVARIANT = "seed breaks invariant"  # an invariant's query returns rows of the seed
    INVARIANT_QUERY_FAILED = "invariant query failed"  # it does not run (or not within its budget)
    TOOL_BREAKS_INVARIANT = "tool breaks invariant"  # a reference step's call left rows that break one
    READ_ROW_OUTSIDE_FILTER = "read row outside its filter"  # a returned row does not hold the filter's value
    READ_DROPPED_ROWS = "read dropped matching rows"  # a row the filter selects is left out
    RANGE_BOUNDARY_BROKEN = "range boundary broken"  # a bound documented inclusive acts exclusive, or the reverse
    WRITE_WRONG_COLUMN = "write missed its column"  # an argument's value went to another column, or other rows
    WRITE_UNIT_CHANGED = "write changed its unit"  # an argument stored scaled (cents for dollars, s for min)
    WRITE_FORMAT_CHANGED = "write changed its format"  # a date or time stored unlike the column's seed rows
    DEPENDENT_ROWS_LEFT = "dependent rows left"  # a deleted or cancelled row's dependants stay as they were
    SQL_BUILT_FROM_ARGUMENTS = "SQL built from arguments"  # found in tools.py's source
    SQL_INJECTION_ACCEPTED = "SQL injection accepted"  # a quote in a text argument ends a string in its SQL
    HALF_DONE_ACCEPTED = "half done accepted"  # a prefix of the reference's writes judged complete
    WRONG_ENTITY_ACCEPTED = "wrong entity accepted"  # the reference's write on another row judged complete
    EXTRA_SIDE_EFFECT_ACCEPTED = "extra side effect accepted"  # the reference plus one more insert
    OTHER_ANSWER_ACCEPTED = "another task's answer accepted"
    REORDERED_REJECTED = "reordered solution rejected"  # its commuting writes in another order
    TEXT_VARIANT_REJECTED = "free-text variant rejected"  # the same text, its case or spacing otherwise
    OTHER_TEXT_ACCEPTED = "another entity's text accepted"  # a text the task names swapped for another row's
    SEED_ID_HARD_CODED = "seed id hard-coded"  # a row id neither the task nor its solution names

    @property
    def probe(self) -> Probe:
        """The probe this is a failure of."""
        return _FAILURES[self][0]

    @property
    def owner(self) -> Artifact:
        """The artifact at fault: a tool that crashes, writes where it must not or reads the real clock is
        the tool code's; a task naming a record the seed lacks, the seed's; a reference solution that is
        refused or rejected, or a verdict that is wrong or varies, the verifiers'."""
        return _FAILURES[self][1]


_FAILURES: dict[ProbeFailure, tuple[Probe, Artifact]] = {
    ProbeFailure.TOOLS_DO_NOT_LOAD: (Probe.TOOLS_LOAD, Artifact.TOOL_CODE),
    ProbeFailure.TOOL_CRASHED: (Probe.TOOL_RUNS, Artifact.TOOL_CODE),
    ProbeFailure.VALID_INPUT_CRASHED: (Probe.VALID_INPUTS, Artifact.TOOL_CODE),
    ProbeFailure.INVALID_INPUT_CRASHED: (Probe.INVALID_INPUTS, Artifact.TOOL_CODE),
    ProbeFailure.INVALID_INPUT_WRITTEN: (Probe.INVALID_INPUTS, Artifact.TOOL_CODE),
    ProbeFailure.READ_TOOL_WROTE: (Probe.READ_ONLY, Artifact.TOOL_CODE),
    ProbeFailure.WROTE_OTHER_TABLES: (Probe.OWN_TABLES, Artifact.TOOL_CODE),
    ProbeFailure.BLOCKED_BY_REFUSED_STEP: (Probe.TASK_NOT_BLOCKED, Artifact.VERIFIERS),
    ProbeFailure.BLOCKED_BY_MISSING_RECORD: (Probe.TASK_NOT_BLOCKED, Artifact.SEED),
    ProbeFailure.REFERENCE_STEP_CRASHED: (Probe.REFERENCE_ACCEPTED, Artifact.TOOL_CODE),
    ProbeFailure.REFERENCE_STEP_REFUSED: (Probe.REFERENCE_ACCEPTED, Artifact.VERIFIERS),
    ProbeFailure.REFERENCE_REJECTED: (Probe.REFERENCE_ACCEPTED, Artifact.VERIFIERS),
    ProbeFailure.UNTOUCHED_ACCEPTED: (Probe.UNTOUCHED_REJECTED, Artifact.VERIFIERS),
    ProbeFailure.UNTOUCHED_VERIFIER_CRASHED: (Probe.UNTOUCHED_REJECTED, Artifact.VERIFIERS),
    ProbeFailure.REPLAY_DIFFERS_IN_TOOL: (Probe.REPLAY_DETERMINISTIC, Artifact.TOOL_CODE),
    ProbeFailure.REPLAY_DIFFERS_IN_VERIFIER: (Probe.REPLAY_DETERMINISTIC, Artifact.VERIFIERS),
    ProbeFailure.REPLAY_DIFFERS_IN_END_STATE: (Probe.REPLAY_DETERMINISTIC, Artifact.TOOL_CODE),
    ProbeFailure.BOUNDARY_INPUT_CRASHED: (Probe.BOUNDARY_INPUTS, Artifact.TOOL_CODE),
    ProbeFailure.TOOL_REPLAY_DIFFERS: (Probe.TOOL_DETERMINISTIC, Artifact.TOOL_CODE),
    ProbeFailure.SEED_BREAKS_INVARIANT: (Probe.SEED_INVARIANTS, Artifact.SEED),
    ProbeFailure.INVARIANT_QUERY_FAILED: (Probe.SEED_INVARIANTS, Artifact.INVARIANTS),
    ProbeFailure.TOOL_BREAKS_INVARIANT: (Probe.END_STATE_INVARIANTS, Artifact.TOOL_CODE),
    ProbeFailure.READ_ROW_OUTSIDE_FILTER: (Probe.READ_FILTERS, Artifact.TOOL_CODE),
    ProbeFailure.READ_DROPPED_ROWS: (Probe.READ_FILTERS, Artifact.TOOL_CODE),
    ProbeFailure.RANGE_BOUNDARY_BROKEN: (Probe.RANGE_BOUNDARIES, Artifact.TOOL_CODE),
    ProbeFailure.WRITE_WRONG_COLUMN: (Probe.WRITE_EFFECTS, Artifact.TOOL_CODE),
    ProbeFailure.WRITE_UNIT_CHANGED: (Probe.WRITE_EFFECTS, Artifact.TOOL_CODE),
    ProbeFailure.WRITE_FORMAT_CHANGED: (Probe.WRITE_EFFECTS, Artifact.TOOL_CODE),
    ProbeFailure.DEPENDENT_ROWS_LEFT: (Probe.DEPENDENT_ROWS, Artifact.TOOL_CODE),
    ProbeFailure.SQL_BUILT_FROM_ARGUMENTS: (Probe.NO_SQL_FROM_ARGUMENTS, Artifact.TOOL_CODE),
    ProbeFailure.SQL_INJECTION_ACCEPTED: (Probe.NO_SQL_FROM_ARGUMENTS, Artifact.TOOL_CODE),
    ProbeFailure.HALF_DONE_ACCEPTED: (Probe.WRONG_END_STATE_REJECTED, Artifact.VERIFIERS),
    ProbeFailure.WRONG_ENTITY_ACCEPTED: (Probe.WRONG_END_STATE_REJECTED, Artifact.VERIFIERS),
    ProbeFailure.EXTRA_SIDE_EFFECT_ACCEPTED: (Probe.WRONG_END_STATE_REJECTED, Artifact.VERIFIERS),
    ProbeFailure.OTHER_ANSWER_ACCEPTED: (Probe.WRONG_END_STATE_REJECTED, Artifact.VERIFIERS),
    ProbeFailure.REORDERED_REJECTED: (Probe.EQUIVALENT_END_STATE_ACCEPTED, Artifact.VERIFIERS),
    ProbeFailure.TEXT_VARIANT_REJECTED: (Probe.EQUIVALENT_END_STATE_ACCEPTED, Artifact.VERIFIERS),
    ProbeFailure.OTHER_TEXT_ACCEPTED: (Probe.WRONG_END_STATE_REJECTED, Artifact.VERIFIERS),
    ProbeFailure.SEED_ID_HARD_CODED: (Probe.NO_SEED_IDS, Artifact.VERIFIERS),
}


class Outcome(Protocol):
    """What a probe's detail may quote (a ToolResult, a VerifierResult, a deep probe's call): the sandbox
    limit it hit, with the module of a refused import."""

    @property
    def limit(self) -> str | None: ...

    @property
    def refused_module(self) -> str | None: ...


@dataclass(frozen=True)
class ProbeResult:
    """One probe: what it checked (`probe`, `target`), whether it `passed`, and why (`detail`, for people).
    A failed one names what went wrong (`failure`), what in the target it points at where that is more
    than the target (`cause`: a step of a reference solution, where two replays first differ, the tables
    written, the records the seed lacks ...), and the sandbox `limit` the code broke, with the
    `refused_module` of a refused import. Make them with `passing` and `failing`."""

    probe: Probe
    target: str
    passed: bool
    detail: str = ""
    failure: ProbeFailure | None = None
    cause: str | None = None
    limit: str | None = None
    refused_module: str | None = None

    def __post_init__(self) -> None:
        if self.passed != (self.failure is None) or (self.failure and self.failure.probe != self.probe):
            raise ValueError(f"a {self.probe} result that passed={self.passed} cannot have failure {self.failure}")

    @classmethod
    def passing(cls, probe: Probe, target: str, detail: str) -> Self:
        return cls(probe, target, True, detail)

    @classmethod
    def failing(
        cls,
        failure: ProbeFailure,
        target: str,
        detail: str,
        *,
        cause: str | None = None,
        limit: str | None = None,
        refused_module: str | None = None,
    ) -> Self:
        return cls(failure.probe, target, False, detail, failure, cause, limit, refused_module)

    @classmethod
    def quoting(
        cls, failure: ProbeFailure, target: str, detail: str, outcome: Outcome, cause: str | None = None
    ) -> Self:
        """A failed probe whose detail quotes `outcome`: the sandbox limit it hit goes with it."""
        return cls.failing(
            failure, target, detail, cause=cause, limit=outcome.limit, refused_module=outcome.refused_module
        )

    @property
    def owner(self) -> Artifact | None:
        """The artifact at fault (None: it passed)."""
        return self.failure.owner if self.failure else None

    def record(self) -> JsonObject:
        """The result as stored in a quality check's details (JSON)."""
        return {
            "probe": self.probe.value,
            "target": self.target,
            "passed": self.passed,
            "detail": self.detail,
            "failure": self.failure.value if self.failure else None,
            "cause": self.cause,
            "limit": self.limit,
            "refused_module": self.refused_module,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, JsonValue]) -> Self:
        """The result `record` stores (ValueError for a failed one stored without its failure: catalogs
        written before failures were typed)."""

        def text(key: str) -> str | None:
            value = record.get(key)
            return value if isinstance(value, str) else None

        failure = text("failure")
        return cls(
            Probe(str(record["probe"])),
            str(record["target"]),
            record["passed"] is True,
            text("detail") or "",
            ProbeFailure(failure) if failure else None,
            text("cause"),
            text("limit"),
            text("refused_module"),
        )
