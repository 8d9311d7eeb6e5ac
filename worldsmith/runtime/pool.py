"""Parent side of the sandbox: worker processes and the pool that hands them out.

A `SandboxWorker` is one confined child process serving one request at a time; callers on
many threads share it through a lock. A request that overruns its deadline gets the worker
killed; a worker whose reply says it ran code that broke a limit is retired right after.
Either way the pool starts a fresh worker in its place on the next `acquire`. Nothing a worker
sends can grow the parent without bound: frames are checked against size limits before they are
read (a worker breaking them is killed), and its stderr is kept as a short tail of capped lines.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import worldsmith
from worldsmith.bundle.contract import Bundle
from worldsmith.runtime.errors import RuntimeFault, WorkerLost
from worldsmith.runtime.sandbox.protocol import (
    FrameReader,
    ProtocolClosed,
    ProtocolTimeout,
    ProtocolViolation,
    write_frame,
)
from worldsmith.settings import Settings, get_settings

_PACKAGE_ROOT = str(Path(worldsmith.__file__).resolve().parent.parent)
_BOOTSTRAP = "import sys; sys.path.insert(0, sys.argv[2]); from worldsmith.runtime.sandbox.worker import main; main()"
#: The only environment variables a worker gets: nothing secret can leak through them.
WORKER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/nonexistent"}


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of every call and worker (see docs/security.md)."""

    call_timeout_s: float = 5.0
    cpu_s: float = 5.0
    memory_mb: int = 2048
    file_size_mb: int = 16
    uid: int = 65534
    lifetime_cpu_s: int = 3600
    grace_s: float = 2.0
    start_timeout_s: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> SandboxLimits:
        s = settings or get_settings()
        return cls(
            call_timeout_s=s.sandbox_call_timeout_s,
            cpu_s=s.sandbox_cpu_s,
            memory_mb=s.sandbox_memory_mb,
            file_size_mb=s.sandbox_file_size_mb,
            uid=s.sandbox_uid,
        )


class StderrTail:
    """The last `lines` lines a stream wrote, each cut to `line_chars`: read in chunks, so a flood
    (even one line of hundreds of MB) costs the parent at most about `lines * line_chars` bytes."""

    def __init__(self, lines: int = 40, line_chars: int = 2000, chunk: int = 1 << 16):
        self.line_chars = line_chars
        self.chunk = chunk
        self._lines: collections.deque[str] = collections.deque(maxlen=lines)
        self._partial = bytearray()
        self._dropped = 0  # bytes of the current line beyond `line_chars`

    def feed(self, data: bytes) -> None:
        """Take the next bytes the stream wrote."""
        *complete, rest = data.split(b"\n")
        for piece in complete:
            self._add(piece)
            self._end_line()
        self._add(rest)

    def _add(self, piece: bytes) -> None:
        room = self.line_chars - len(self._partial)
        self._partial += piece[: max(room, 0)]
        self._dropped += max(len(piece) - max(room, 0), 0)

    def _end_line(self) -> None:
        text = self._partial.decode(errors="replace").rstrip()
        if self._dropped:
            text += f"...[truncated {self._dropped} bytes]"
        self._lines.append(text)
        self._partial.clear()
        self._dropped = 0

    def drain(self, fd: int) -> None:
        """Read `fd` to its end (a worker's stderr, on a thread of its own)."""
        while True:
            try:
                data = os.read(fd, self.chunk)
            except OSError:
                return
            if not data:
                if self._partial or self._dropped:
                    self._end_line()
                return
            self.feed(data)

    def tail(self, lines: int = 5) -> str:
        return " | ".join(list(self._lines)[-lines:])


class SandboxWorker:
    """One confined worker process."""

    def __init__(self, limits: SandboxLimits, scratch_root: Path, *, frameworks: bool = False):
        self.limits = limits
        self.frameworks = frameworks
        self.name = uuid.uuid4().hex[:12]
        self.scratch = scratch_root / self.name
        self.loaded_envs: set[str] = set()
        self.episodes = 0
        self.layers: dict[str, str] = {}
        self.dead_reason: str | None = None
        self._lock = threading.Lock()
        self._stderr = StderrTail()
        config = {
            "scratch": str(self.scratch),
            "uid": limits.uid,
            "memory_mb": limits.memory_mb,
            "file_size_mb": limits.file_size_mb,
            "lifetime_cpu_s": limits.lifetime_cpu_s,
            "call_timeout_s": limits.call_timeout_s,
            "cpu_s": limits.cpu_s,
            "frameworks": frameworks,
        }
        # Stdlib-only workers start without site-packages (-S); workers of ASGI environments need the
        # web stack installed there and import it before they confine themselves.
        flags = ["-I", "-B"] if frameworks else ["-I", "-S", "-B"]
        self.process = subprocess.Popen(
            [sys.executable, *flags, "-c", _BOOTSTRAP, json.dumps(config), _PACKAGE_ROOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=WORKER_ENV,
            cwd="/",
            close_fds=True,
            start_new_session=True,
        )
        assert self.process.stderr is not None and self.process.stdout is not None
        threading.Thread(
            target=self._stderr.drain,
            args=(self.process.stderr.fileno(),),
            daemon=True,
            name=f"sandbox-stderr-{self.name}",
        ).start()
        # a worker cannot legitimately send more than its address space holds
        self._reader = FrameReader(self.process.stdout.fileno(), max_blobs=limits.memory_mb * 1024 * 1024)
        try:
            hello, _ = self._reader.read(time.monotonic() + limits.start_timeout_s)
        except (ProtocolClosed, ProtocolTimeout, ProtocolViolation) as exc:
            self.kill(f"failed to start: {exc}")
            raise RuntimeFault(f"sandbox worker failed to start: {exc}; stderr: {self.stderr_tail()}") from None
        self.pid = hello["pid"]
        self.layers = hello["layers"]

    def stderr_tail(self, lines: int = 5) -> str:
        return self._stderr.tail(lines)

    @property
    def alive(self) -> bool:
        return self.dead_reason is None and self.process.poll() is None

    def _death(self) -> str:
        """Why the worker went away; one still running after a short grace (blocked or silent) is killed."""
        try:
            code = self.process.wait(timeout=self.limits.grace_s)
        except subprocess.TimeoutExpired:
            self._stop()
            return "sandbox worker closed its reply channel but did not exit; killed"
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        tail = self.stderr_tail()
        return f"sandbox worker {how}" + (f" ({tail})" if tail else "")

    def request(
        self, header: dict[str, Any], blobs: list[bytes] | tuple[bytes, ...] = (), *, timeout: float
    ) -> tuple[dict[str, Any], list[bytes]]:
        """Send one request and wait for its reply; raises `WorkerLost` if the worker is or goes away."""
        with self._lock:
            if not self.alive:
                raise WorkerLost(self.dead_reason or "sandbox worker is gone", in_flight=False)
            try:
                write_frame(self.process.stdin, header, blobs)
            except (BrokenPipeError, OSError):
                reason = self._death()
                self.kill(reason)
                raise WorkerLost(reason, in_flight=False) from None
            try:
                reply, reply_blobs = self._reader.read(time.monotonic() + timeout)
            except ProtocolTimeout:
                reason = f"sandbox limit timeout: no reply within {timeout:g} s; worker killed and replaced"
                self.kill(reason)
                raise WorkerLost(reason, in_flight=True, limit="timeout") from None
            except ProtocolClosed:
                reason = self._death()
                self.kill(reason)
                raise WorkerLost(f"{reason}; worker replaced", in_flight=True, limit="crash") from None
            except ProtocolViolation as exc:
                reason = f"sandbox limit protocol: the worker sent an invalid reply ({exc}); worker killed and replaced"
                self.kill(reason)
                raise WorkerLost(reason, in_flight=True, limit="protocol") from None
            if reply.get("retire"):
                self.kill("retired after running code that broke a sandbox limit")
            return reply, reply_blobs

    def _stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=10)

    def kill(self, reason: str) -> None:
        """Stop the process (if running) and remember why; its scratch directory is removed."""
        if self.dead_reason is None:
            self.dead_reason = reason
        self._stop()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        shutil.rmtree(self.scratch, ignore_errors=True)


class WorkerPool:
    """A fixed number of worker slots; dead or retired workers are replaced when next needed."""

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
        self._closed = False

    @property
    def size(self) -> int:
        return len(self._slots)

    def workers(self) -> list[SandboxWorker]:
        return [w for w in self._slots if w is not None]

    def acquire(self) -> SandboxWorker:
        """The live worker with the fewest episodes, starting or replacing one if needed."""
        with self._lock:
            if self._closed:
                raise RuntimeFault("the runtime is closed")
            for index, worker in enumerate(self._slots):
                if worker is None or not worker.alive:
                    if worker is not None:
                        worker.kill(worker.dead_reason or "replaced")
                    self._slots[index] = SandboxWorker(self.limits, self.scratch_root, frameworks=self.frameworks)
                    break
            chosen = min(self._slots, key=lambda w: w.episodes if w is not None else 0)
            assert chosen is not None
            chosen.episodes += 1
            return chosen

    def release(self, worker: SandboxWorker) -> None:
        with self._lock:
            worker.episodes = max(0, worker.episodes - 1)

    def ensure_env(self, worker: SandboxWorker, bundle: Bundle) -> None:
        """Load `bundle`'s code and world into `worker` once."""
        if bundle.runtime_key in worker.loaded_envs:
            return
        tools_kind = bundle.tools_kind
        code = tools_kind.code_fields(bundle.files, bundle.manifest.origin)
        reply, _ = worker.request(
            {
                "op": "load_env",
                "env": bundle.runtime_key,
                "tools_kind": tools_kind.name,
                **code,
                "verifiers": bundle.text("verifiers.py"),
                "verifiers_kind": bundle.verifiers_kind.name,
                "tool_names": [t.name for t in bundle.tools],
            },
            [bundle.world],
            timeout=60,
        )
        if reply["status"] != "ok":
            raise RuntimeFault(f"loading {bundle.env_id} into a sandbox worker failed: {reply.get('error')}")
        worker.loaded_envs.add(bundle.runtime_key)

    def layers(self) -> dict[str, str]:
        """The confinement layers reported by a live worker (starting one if none runs)."""
        worker = next((w for w in self._slots if w is not None and w.alive), None)
        if worker is None:
            worker = self.acquire()
            self.release(worker)
        return dict(worker.layers)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for worker in self._slots:
                if worker is not None:
                    worker.kill("runtime closed")
            self._slots = [None] * len(self._slots)
