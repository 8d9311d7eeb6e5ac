"""Flow run names that say what a run does (`generate-10x-openai`, `train-retail-nov`), for the
flows' `flow_run_name` callables.

A callable, not a format string: a run started by a deployment has its parameters as plain dicts
when it is named, one called in-process has the validated models; both read the same here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePath
from typing import TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def run_parameter(name: str, model: type[M]) -> M:
    """Parameter `name` of the flow run being named, as `model` (unset: the model's defaults). Raises
    ValidationError when it is not one; the run itself then fails with that error."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    value = (context.parameters or {}).get(name) if context is not None else None
    return value if isinstance(value, model) else model.model_validate(value or {})


def named_after(flow: str, name: str, model: type[M], describe: Callable[[M], str]) -> Callable[[], str]:
    """A `flow_run_name` callable: `flow-<describe(parameter name as model)>`; plain `flow` when the
    parameter is invalid (the run fails on it with its own message)."""

    def run_name() -> str:
        try:
            return f"{flow}-{describe(run_parameter(name, model))}"
        except ValidationError:
            return flow

    return run_name


def short_policy(policy: str) -> str:
    """A policy spec as a name shows it: `hf:PATH` by its last two path parts, others as they are."""
    kind, _, target = policy.partition(":")
    if kind != "hf" or not target:
        return policy
    return f"hf:{'/'.join(PurePath(target).parts[-2:])}"
