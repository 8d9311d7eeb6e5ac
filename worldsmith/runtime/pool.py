"""The pool of sandbox workers: which worker serves an episode of which environment.

`WorkerPool.acquire(env)` hands out a live worker (runtime/worker_handle.py) bound to environment
`env` for good, starting, claiming or replacing one as needed; `release` gives it back. A worker the
pool finds dead or retired is replaced when next needed, so a worker lost to a limit costs its own
episodes a replay (runtime/episode.py) and nothing else. `ensure_env` loads a bundle's code and
world into a worker once.
"""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

from worldsmith.bundle.contract import Bundle
from worldsmith.runtime.errors import RuntimeFault
from worldsmith.runtime.limits import SandboxLimits
from worldsmith.runtime.sandbox import firstpages
from worldsmith.runtime.sandbox.messages import FirstPagesRequest, LoadEnvRequest
from worldsmith.runtime.worker_handle import SandboxWorker


class WorkerPool:
    """Up to `size` workers, each dedicated to one environment (runtime key): a worker that has run
    one environment's code never runs another's, so nothing one world's code does to its worker's
    interpreter (module state, caches, the guard's tables) can reach another world's episodes.

    `acquire(env)` spreads the episodes of `env` over workers: the least busy worker of `env` (ties:
    the one handed out least recently, so even sessions opened one after another take turns), or
    a worker in a slot no environment holds (empty, dead, or a worker that never ran code) while
    that is less busy; while every worker of `env` hosts episodes, also the slot of a worker idle
    for another environment (that worker is retired). A worker of another environment that is
    idle is not retired just to spread: its environment stays loaded for its next episode. With
    no free slot it shares the least busy worker of `env`; where `env` has none (every slot's
    worker hosts episodes of other environments) an overflow worker is started beyond `size`,
    stopped as soon as its last episode closes. Dead or retired workers are replaced when next needed."""

    def __init__(self, limits: SandboxLimits, size: int, scratch_root: Path, *, frameworks: bool = False):
        if size < 1:
            raise ValueError("a worker pool needs at least one worker")
        self.limits = limits
        self.frameworks = frameworks
        self.scratch_root = scratch_root
        scratch_root.mkdir(parents=True, exist_ok=True)
        os.chmod(scratch_root, 0o711)
        self._lock = threading.Lock()
        self._slots: list[SandboxWorker | None] = [None] * size
        self._overflow: list[SandboxWorker] = []
        self._handouts = itertools.count(1)
        self._closed = False

    @property
    def size(self) -> int:
        return len(self._slots)

    def workers(self) -> list[SandboxWorker]:
        return [w for w in self._slots if w is not None] + list(self._overflow)

    def _start(self, env: str | None) -> SandboxWorker:
        worker = SandboxWorker(self.limits, self.scratch_root, frameworks=self.frameworks)
        worker.env = env
        return worker

    def acquire(self, env: str | None = None) -> SandboxWorker:
        """The live worker of environment `env` (a runtime key) with the fewest episodes, starting,
        claiming or replacing one if needed. A worker is bound to `env` here, before any of its
        code is loaded, and never serves another environment. `env` None: a worker bound to none
        (it runs no generated code; `layers()`)."""
        with self._lock:
            if self._closed:
                raise RuntimeFault("the runtime is closed")
            for gone in [w for w in self._overflow if not w.alive]:
                gone.kill(gone.dead_reason or "gone")
                self._overflow.remove(gone)
            live = [w for w in self.workers() if w.alive and env is not None and w.env == env]
            best = min(live, key=lambda w: (w.episodes, w.handed_out), default=None)
            # an unclaimed slot always spreads the load; an idle worker of another world is retired
            # only when this world has no idle worker of its own
            fresh = self._free_slot(env, retire_idle=best is None or best.episodes > 0)
            if fresh is not None:
                best = fresh
            if best is None:  # every worker hosts episodes of other environments
                best = self._start(env)
                self._overflow.append(best)
            best.episodes += 1
            best.handed_out = next(self._handouts)
            return best

    def _free_slot(self, env: str | None, *, retire_idle: bool = True) -> SandboxWorker | None:
        """A worker for `env` in a slot that is empty, dead, or holds a worker bound to no environment,
        else (`retire_idle`) in the slot of a worker idle for another environment (retired); None if
        there is none."""
        for worker in self._slots:
            if worker is not None and worker.alive and worker.env is None and env is not None:
                worker.env = env  # it never ran generated code: claim it
                return worker
        for index, worker in enumerate(self._slots):
            if worker is None or not worker.alive:
                if worker is not None:
                    worker.kill(worker.dead_reason or "replaced")
                self._slots[index] = self._start(env)
                return self._slots[index]
        for index, worker in enumerate(self._slots if retire_idle else ()):
            if worker is not None and worker.episodes == 0 and worker.env != env:
                worker.kill("retired: idle, bound to another environment")
                self._slots[index] = self._start(env)
                return self._slots[index]
        return None

    def release(self, worker: SandboxWorker, *, retire: bool = False) -> None:
        """One episode fewer on `worker`; with `retire` (it ran code no one else may meet) it is
        stopped now. An overflow worker is stopped when its last episode goes."""
        with self._lock:
            worker.episodes = max(0, worker.episodes - 1)
            if retire:
                worker.kill("retired after use")
            if worker in self._overflow and (worker.episodes == 0 or not worker.alive):
                self._overflow.remove(worker)
                worker.kill("overflow worker no longer needed")

    def ensure_env(self, worker: SandboxWorker, bundle: Bundle) -> None:
        """Load `bundle`'s code and world into `worker` once."""
        if bundle.runtime_key in worker.loaded_envs:
            return
        if worker.env != bundle.runtime_key:  # a worker never runs two environments' code
            raise RuntimeFault(f"worker {worker.name} is bound to another environment than {bundle.env_id}")
        tools_kind = bundle.tools_kind
        load: LoadEnvRequest = {
            "op": "load_env",
            "env": bundle.runtime_key,
            "tools_kind": tools_kind.name,
            "verifiers": bundle.text("verifiers.py"),
            "verifiers_kind": bundle.verifiers_kind.name,
            "tool_names": [t.name for t in bundle.tools],
            "clock": bundle.clock,
            "probe": worker.limits.first_pages,
        }
        code = tools_kind.code_fields(bundle.files)  # one of the two, by kind
        if "tools" in code:
            load["tools"] = code["tools"]
        if "app" in code:
            load["app"] = code["app"]
        reply, _ = worker.request(load, [bundle.world], timeout=60)
        if reply["status"] != "ok":
            raise RuntimeFault(f"loading {bundle.env_id} into a sandbox worker failed: {reply.get('error')}")
        probe = reply.get("probe_pid")
        if isinstance(probe, int):  # the pages its first calls wrote, for its spares to write ahead
            pages: FirstPagesRequest = {"op": "first_pages", "env": bundle.runtime_key}
            worker.request(pages, [firstpages.written_pages(probe, grandparent=worker.pid)], timeout=60)
        worker.loaded_envs.add(bundle.runtime_key)

    def layers(self) -> dict[str, str]:
        """The confinement layers reported by a live worker (starting one if none runs)."""
        worker = next((w for w in self.workers() if w.alive), None)
        if worker is None:
            worker = self.acquire()
            self.release(worker)
        return dict(worker.layers)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for worker in self.workers():
                worker.kill("runtime closed")
            self._slots = [None] * len(self._slots)
            self._overflow = []
