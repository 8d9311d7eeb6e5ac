"""Test tiers: every test carries exactly one tier marker, and the unit tier stays in-process.

| tier | what a test of it may do | run before |
| --- | --- | --- |
| `unit` | call code in this process: no child process, no sandbox worker, no Prefect server | every commit (`pytest -m unit`) |
| `sandbox` | start sandbox workers and local servers (gateway, moto, PostgreSQL, a scripted LLM server) | a change to runtime, serving, quality |
| `flow` | run Prefect flows against the session's Prefect test server | a change to tasks, flows, storage |
| `e2e` | run the product as a user does: CLI processes, the demo, training a model | stopping |

A tier is given by a marker on the test, its class or its module (`pytestmark`); the closest one wins,
so a module's default can be overridden test by test. A test with none fails collection, naming it.

A `unit` test that starts a process fails at that point (an audit hook refuses `subprocess.Popen`,
`os.fork` and `os.posix_spawn` while it runs): the tier's speed is kept by the machine, not by habit.

Each tier has a hang guard (pytest-timeout), far above what its tests need even on a loaded machine:
a guard, not a measure. A test that knows its work sets its own `@pytest.mark.timeout(N)`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

TIERS = ("unit", "sandbox", "flow", "e2e")
#: Hang guards in seconds, by tier (see the module docstring).
HANG_GUARD_S = {"unit": 120, "sandbox": 900, "flow": 1200, "e2e": 1800}
_DESCRIPTIONS = {
    "unit": "in-process only: no child process, no sandbox worker, no Prefect server (pytest -m unit)",
    "sandbox": "starts sandbox workers or local servers",
    "flow": "runs Prefect flows on the session's Prefect test server",
    "e2e": "runs the product as a user does: CLI processes, the demo, model training",
}
#: Audit events that start a process.
_SPAWNS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec"})


class _InProcessOnly:
    """Refuses process starts while a unit test runs (an audit hook cannot be removed, so it is armed
    and disarmed by a flag)."""

    armed_for: str | None = None

    @classmethod
    def hook(cls, event: str, args: tuple[object, ...]) -> None:
        if cls.armed_for is not None and event in _SPAWNS:
            test, cls.armed_for = cls.armed_for, None  # one failure, not one per retry of the caller
            raise RuntimeError(
                f"{test} is marked `unit` but started a process ({event} {args[:1]!r}): "
                "mark it `sandbox`, `flow` or `e2e`, or keep it in-process"
            )


sys.addaudithook(_InProcessOnly.hook)


def tier_of(item: pytest.Item) -> str | None:
    """The closest tier marker of `item` (its own, then its class's, then its module's)."""
    return next((mark.name for mark in item.iter_markers() if mark.name in TIERS), None)


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: {_DESCRIPTIONS[tier]}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    untiered = [item.nodeid for item in items if tier_of(item) is None]
    if untiered:
        shown = "\n  ".join(untiered[:20]) + (f"\n  ... and {len(untiered) - 20} more" if len(untiered) > 20 else "")
        raise pytest.UsageError(
            f"{len(untiered)} test(s) carry no tier marker ({', '.join(TIERS)}); "
            f"mark the test, its class or its module (pytestmark):\n  {shown}"
        )
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(HANG_GUARD_S[tier_of(item) or "e2e"]))


def _in_process_only(item: pytest.Item) -> Iterator[None]:
    _InProcessOnly.armed_for = item.nodeid if tier_of(item) == "unit" else None
    try:
        yield
    finally:
        _InProcessOnly.armed_for = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _in_process_only(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _in_process_only(item)
