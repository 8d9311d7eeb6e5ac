"""Launching a sandbox worker process, and the bounded tail of its stderr the parent keeps.

`launch_worker` starts `python -I [-S] -B -c _BOOTSTRAP` (worldsmith/runtime/sandbox/worker.py's
`main`) with the worker's configuration as its argument, `WORKER_ENV` as its whole environment, `/`
as its directory and a session of its own; the worker confines itself (kernel layers, then the
guard) before it answers. Tests and benchmarks swap `_BOOTSTRAP` to start another main.
`StderrTail` keeps what a worker writes to stderr at a fixed cost, however much it writes.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import worldsmith
from worldsmith.runtime.limits import SandboxLimits
from worldsmith.runtime.sandbox.messages import WorkerConfig

_PACKAGE_ROOT = str(Path(worldsmith.__file__).resolve().parent.parent)
_BOOTSTRAP = "import sys; sys.path.insert(0, sys.argv[2]); from worldsmith.runtime.sandbox.worker import main; main()"
#: The only environment variables a worker gets: nothing secret can leak through them.
#: TZ: every world's local time is UTC, whatever the host's zone (worldsmith/runtime/sandbox/worldclock.py).
WORKER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/nonexistent", "TZ": "UTC0"}


def launch_worker(
    limits: SandboxLimits, scratch: Path, *, frameworks: bool, channel_fd: int | None
) -> subprocess.Popen[bytes]:
    """A worker process confining itself under `limits`, its files under `scratch`, its stdin, stdout
    and stderr pipes to this process. `frameworks`: it imports the web stack of ASGI environments
    before it confines itself. `channel_fd` (strict isolation): its end of the socket over which it
    hands episode processes' pipes over, passed to it open (None: no such socket)."""
    config: WorkerConfig = {
        "scratch": str(scratch),
        "uid": limits.uid,
        "memory_mb": limits.memory_mb,
        "file_size_mb": limits.file_size_mb,
        "lifetime_cpu_s": limits.lifetime_cpu_s,
        "call_timeout_s": limits.call_timeout_s,
        "cpu_s": limits.cpu_s,
        "grace_s": limits.grace_s,
        "isolation": limits.isolation,
        "episode_processes": limits.episode_processes,
        "spare_processes": limits.spare_processes,
        "stand_in_reads": limits.stand_in_reads,
        "call_files": limits.call_files,
        "episode_db_growth_mb": limits.episode_db_growth_mb,
        "frameworks": frameworks,
        "channel_fd": channel_fd,
    }
    # Stdlib-only workers start without site-packages (-S); workers of ASGI environments need the
    # web stack installed there and import it before they confine themselves.
    flags = ["-I", "-B"] if frameworks else ["-I", "-S", "-B"]
    return subprocess.Popen(
        [sys.executable, *flags, "-c", _BOOTSTRAP, json.dumps(config), _PACKAGE_ROOT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=WORKER_ENV,
        cwd="/",
        close_fds=True,
        pass_fds=(channel_fd,) if channel_fd is not None else (),
        start_new_session=True,
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
