"""RunResources, the per-run registry the flows' tasks share resources through: built once per run
however many tasks ask at once, closed once when the run releases them, nothing kept after a failed
build, and what `holding` registers gone after its block."""

from __future__ import annotations

import threading

import cloudpickle
import pytest

from worldsmith.tasks.run_resources import RunResources

pytestmark = pytest.mark.unit


class Resource:
    def __init__(self, name: str) -> None:
        self.name, self.closed = name, 0

    def close(self) -> None:
        self.closed += 1


def test_built_once_per_run_however_many_tasks_ask_at_once() -> None:
    registry: RunResources[Resource] = RunResources(close=Resource.close)
    built: list[str] = []
    started = threading.Barrier(8)

    def build() -> Resource:
        built.append("a")
        return Resource("a")

    def ask(found: list[Resource]) -> None:
        started.wait()
        found.append(registry.get("run-a", build))

    found: list[Resource] = []
    threads = [threading.Thread(target=ask, args=(found,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert built == ["a"] and len({id(r) for r in found}) == 1
    assert registry.get("run-b", lambda: Resource("b")).name == "b"  # another run, its own
    assert registry.find("run-a") is found[0] and registry.find("run-c") is None


def test_release_closes_a_runs_resource_once() -> None:
    registry: RunResources[Resource] = RunResources(close=Resource.close)
    first = registry.get("run", lambda: Resource("first"))
    assert registry.release("run") is first and first.closed == 1
    assert registry.release("run") is None and first.closed == 1  # released already: nothing to close
    assert registry.find("run") is None


def test_a_get_after_release_builds_anew() -> None:
    registry: RunResources[Resource] = RunResources(close=Resource.close)
    registry.get("run", lambda: Resource("first"))
    registry.release("run")
    assert registry.get("run", lambda: Resource("second")).name == "second"


def test_a_build_that_raises_registers_nothing() -> None:
    registry: RunResources[Resource] = RunResources(close=Resource.close)

    def failing() -> Resource:
        raise ConnectionError("endpoint down")

    with pytest.raises(ConnectionError):
        registry.get("run", failing)
    assert registry.find("run") is None
    assert registry.get("run", lambda: Resource("retried")).name == "retried"


def test_holding_registers_for_the_block_only_even_when_it_raises() -> None:
    registry: RunResources[list[str]] = RunResources()
    with registry.holding("run", []) as finished:
        registry.find("run").append("world-1")  # a task of the run finds what the caller holds
    assert finished == ["world-1"] and registry.find("run") is None
    with pytest.raises(RuntimeError), registry.holding("run", []):
        raise RuntimeError("the flow failed")
    assert registry.find("run") is None


def test_a_registry_travels_to_another_process_empty() -> None:
    """A flow's run context goes to Dask workers with the registries its function names."""
    registry: RunResources[Resource] = RunResources(close=Resource.close)
    registry.get("run", lambda: Resource("here"))
    copy = cloudpickle.loads(cloudpickle.dumps(registry))
    assert copy.find("run") is None and registry.find("run") is not None
    copy.get("run", lambda: Resource("there"))
    assert copy.release("run").closed == 1  # closed as the original would close it
