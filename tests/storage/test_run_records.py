"""Run rows carry the flow run they belong to (from a flow, a subflow or a task), and the
`on_crashed` hook marks `crashed` exactly the `running` rows of a crashed flow run and of its subflows."""

from __future__ import annotations

import uuid

import pytest
from prefect import flow, task
from prefect.states import Crashed
from sqlmodel import select

from worldsmith.flows.records import current_flow_run_id, mark_crashed
from worldsmith.models.catalog import EvaluationRun, RunRecord, TrainingRun
from worldsmith.models.runs import RunKind
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.run_records import add_run, open_record

pytestmark = pytest.mark.flow


@task
def evaluation_row() -> int:
    return add_run(EvaluationRun(policy="reference", flow_run_id=current_flow_run_id()))


@flow
def inner() -> dict:
    return {"flow_run": current_flow_run_id(), "evaluation": evaluation_row()}


@flow
def outer() -> dict:
    run = add_run(TrainingRun(config={}, flow_run_id=current_flow_run_id()))
    done = add_run(TrainingRun(config={}, status="completed", flow_run_id=current_flow_run_id()))
    record = f"generation-{uuid.uuid4()}"
    open_record(RunKind.GENERATE, record, "1 worlds", current_flow_run_id())
    return {"flow_run": current_flow_run_id(), "training": run, "completed": done, "record": record, "inner": inner()}


class FlowRunStub:
    def __init__(self, flow_run_id: str):
        from uuid import UUID

        self.id = UUID(flow_run_id)


def test_a_crashed_flow_run_marks_the_running_rows_of_its_whole_flow_tree_crashed(prefect_api, home):
    assert current_flow_run_id() is None  # outside any flow
    crashed, other = outer(), outer()
    with open_catalog().session() as session:
        evaluation = session.get(EvaluationRun, crashed["inner"]["evaluation"])
    assert (
        evaluation.flow_run_id == crashed["inner"]["flow_run"] != crashed["flow_run"]
    )  # a task's row names its (sub)flow run

    mark_crashed(
        None,
        FlowRunStub(crashed["flow_run"]),
        Crashed(message="Flow run infrastructure exited with non-zero status code -9."),
    )
    with open_catalog().session() as session:
        training = session.get(TrainingRun, crashed["training"])
        evaluation = session.get(EvaluationRun, crashed["inner"]["evaluation"])
        untouched = [
            session.get(TrainingRun, crashed["completed"]),
            session.get(TrainingRun, other["training"]),
            session.get(EvaluationRun, other["inner"]["evaluation"]),
            session.get(RunRecord, other["record"]),
        ]
        assert len(session.exec(select(TrainingRun)).all()) == 4
        record = session.get(RunRecord, crashed["record"])
    for row in (training, evaluation, record):
        assert row.status == "crashed" and row.finished_at is not None
        assert row.metrics["error"] == "crashed: Flow run infrastructure exited with non-zero status code -9."
    assert [row.status for row in untouched] == ["completed", "running", "running", "running"]
