"""Test tiers: every test carries exactly one tier marker, and the unit tier stays in-process.

| tier | what a test of it may do | run before |
| --- | --- | --- |
| `unit` | call code in this process: no child process, no sandbox worker, no Prefect server | every commit (`pytest -m unit`) |
| `sandbox` | start sandbox workers and local servers (gateway, moto, PostgreSQL, a scripted LLM server) | a change to runtime, serving, quality |
| `flow` | run Prefect flows against the session's Prefect test server | a change to tasks, flows, storage |
| `e2e` | run the product as a user does: CLI processes, the demo, training a model | stopping |

A tier is given by a marker on the test, its class or its module (`pytestmark`); the closest one wins,
so a module's default can be overridden test by test. A test with none fails collection, naming it, and
so does a `unit` test that uses a fixture that starts something (`_HEAVY_FIXTURES`). After collection
each test carries its one tier marker itself, so `-m unit` selects exactly the unit tier.

A `unit` test that starts a process fails at that point (an audit hook refuses `subprocess.Popen`,
`os.fork` and `os.posix_spawn` while it runs): the tier's speed is kept by the machine, not by habit.

Each tier has a hang guard (pytest-timeout), far above what its tests need even on a loaded machine:
a guard, not a measure. It is the one knob of the suite's patience: the waits inside tests name the
constants of support/patience.py, derived from these guards. A test whose work is larger than its tier's
sets a multiple of a guard (`@pytest.mark.timeout(2 * HANG_GUARD_S["e2e"])`), never a number of its own.
"""

from __future__ import annotations

import platform
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
#: Fixtures a unit test may not use, and what they start.
_HEAVY_FIXTURES = {
    "prefect_api": "a Prefect server: tier flow",
    "tiny_model": "a model to train: tier e2e",
    "runtime": "sandbox workers: tier sandbox",
    "postgres_url": "a PostgreSQL server: tier sandbox",
    "browser": "Chromium: tier e2e",
}
#: Audit events that start a process.
_SPAWNS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec"})


class _InProcessOnly:
    """Refuses process starts while a unit test sets up or runs, from any thread, and remembers the
    first, so the test fails even where a caller swallowed the refusal (an audit hook cannot be
    removed, so it is armed and disarmed by a flag)."""

    armed_for: str | None = None
    started: str | None = None

    @classmethod
    def hook(cls, event: str, args: tuple[object, ...]) -> None:
        if cls.armed_for is not None and event in _SPAWNS:
            cls.started = cls.started or f"{event} {str(args[:1])[:200]}"
            raise RuntimeError(f"{cls.armed_for} is marked `unit` but started a process ({cls.started})")


sys.addaudithook(_InProcessOnly.hook)
# `platform.platform()` runs `uname -p` once per interpreter and caches it; libraries ask for it lazily
# (the openai SDK's request headers), so whichever unit test asked first would "start a process".
# Asked here, before any test, it is the session's cost, not a test's.
platform.platform()


def tier_of(item: pytest.Item) -> str | None:
    """The tier of `item`: its own tier marker (the heaviest, if a parametrized case adds one), else its
    class's, else its module's."""
    own = [mark.name for mark in item.own_markers if mark.name in TIERS]
    if own:
        return max(own, key=TIERS.index)
    return next((mark.name for mark in item.iter_markers() if mark.name in TIERS), None)


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: {_DESCRIPTIONS[tier]}")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: it must see one tier per test
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers = {item.nodeid: tier_of(item) for item in items}
    problems = [f"{nodeid}: no tier marker" for nodeid, tier in tiers.items() if tier is None]
    problems += [
        f"{item.nodeid}: marked `unit` but uses the {name} fixture ({_HEAVY_FIXTURES[name]})"
        for item in items
        if tiers[item.nodeid] == "unit"
        for name in sorted(_HEAVY_FIXTURES.keys() & set(getattr(item, "fixturenames", ())))
    ]
    if problems:
        shown = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        raise pytest.UsageError(
            f"{len(problems)} test(s) need another tier ({', '.join(TIERS)}); mark the test, its class or its "
            f"module (pytestmark):\n  {shown}"
        )
    # One tier marker per test, on the test itself: `-m unit` must not select an e2e test of a module
    # whose default is unit (pytest matches -m against every marker up the chain).
    for item in items:
        for node in item.listchain():
            node.own_markers[:] = [mark for mark in node.own_markers if mark.name not in TIERS]
    for item in items:
        tier = tiers[item.nodeid] or "e2e"
        item.add_marker(tier)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(HANG_GUARD_S[tier]))


def _in_process_only(item: pytest.Item) -> Iterator[None]:
    _InProcessOnly.armed_for = item.nodeid if tier_of(item) == "unit" else None
    _InProcessOnly.started = None
    try:
        yield
    finally:
        _InProcessOnly.armed_for = None
    if _InProcessOnly.started:
        pytest.fail(
            f"marked `unit` but started a process ({_InProcessOnly.started}): mark it `sandbox`, `flow` or "
            "`e2e`, or keep it in-process",
            pytrace=False,
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _in_process_only(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _in_process_only(item)
