"""The template: the clean process that forks every process running generated code. Stdlib only.

Under strict isolation the worker forks its template once, right after loading its environment and
before any episode's request (`ForkedProcesses.start_template`): a copy of the worker that holds the
environment's code and world and nothing of any episode. From then on each process that runs
generated code or reads an episode's data is forked by the template, never by the worker, whose
heap keeps what it decoded for episodes (first calls' arguments, final answers, databases' bytes,
freed or not): a process inherits nothing of another episode's requests, answers or bytes.

The template never sees a request. The one generated code it runs is an ASGI environment's app,
built once in `prepare` before it forks anything (on a private copy of the world, under the guard and
with threads denied: docs/security.md, "An imported app, built once"), so that every episode's
process starts with the app built. The worker speaks to it over a sequenced-packet socket pair made
before the worker confined itself, one small JSON message a packet:

- `spawn`: it makes two pipes and forks; the child (`child(requests_fd, replies_fd)`, which never
  returns) reads its requests from the first and writes its replies to the second, and the worker
  gets the other ends with SCM_RIGHTS, the child's pid and its serial;
- `end`: it stops one of its children (given `grace_s` to exit by itself, then killed) and answers
  its wait status;
- `ended`: which of some children have ended, with their wait statuses.

It reaps its children as they end (at each message), keeping each one's status under its serial
until the worker asks: unlike a pid, a serial never names another process while the worker holds it.
It dies with the worker (PR_SET_PDEATHSIG), and its children with it.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn

from worldsmith.runtime.sandbox import kernel
from worldsmith.runtime.sandbox.protocol import ready

#: How long the worker waits for the template's answer to a message (it forks, or stops a process
#: within the grace the message gives): past this the template is taken for lost.
ANSWER_S = 30.0
_PACKET = 1 << 16


class TemplateLost(Exception):
    """The template process is gone or does not answer: the worker can fork nothing clean any more.
    It exits, saying so on stderr: the parent replaces it and moves its episodes, as for a crash."""

    def __init__(self, why: str):
        super().__init__(f"sandbox worker: its template process {why}")


@dataclass(frozen=True)
class Spawned:
    """A process the template forked: its serial and pid, and the worker's ends of its two pipes."""

    serial: int
    pid: int
    requests: int  # write end: the process's requests
    replies: int  # read end: its replies


class TemplateProcess:
    """The worker's side of its template: fork a process, stop one, ask which ended."""

    def __init__(self, pid: int, control: socket.socket, prepare_s: float = 0.0):
        self.pid = pid
        self._control = control
        self._prepare_s = prepare_s  # how long its first answer may also wait (it prepares first)
        self.lost: str | None = None  # why it is taken for lost, once it is

    def _ask(self, message: dict[str, object], extra_s: float = 0.0) -> tuple[dict[str, object], list[int]]:
        if self.lost is not None:
            raise TemplateLost(self.lost)
        extra_s, self._prepare_s = extra_s + self._prepare_s, 0.0
        try:
            self._control.send(json.dumps(message).encode())
            if not ready(self._control.fileno(), ANSWER_S + extra_s):
                raise TemplateLost(self._lose(f"did not answer within {ANSWER_S + extra_s:g} s"))
            data, fds, _, _ = socket.recv_fds(self._control, _PACKET, 2)
        except OSError as exc:
            raise TemplateLost(self._lose(f"is gone ({exc.strerror or exc})")) from None
        try:
            answer = json.loads(data) if data else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            for fd in fds:
                os.close(fd)
            raise TemplateLost(self._lose("answered out of turn" if data else "is gone"))
        return answer, fds

    def _lose(self, why: str) -> str:
        self.lost = why
        try:
            os.kill(self.pid, signal.SIGKILL)  # its children die with it
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        return why

    def spawn(self) -> Spawned:
        """A freshly forked process waiting for its first frame; OSError (its errno and text) when the
        template could not make its pipes or fork, or the worker could not take the pipes."""
        answer, fds = self._ask({"op": "spawn"})
        if "errno" in answer:
            for fd in fds:
                os.close(fd)
            raise OSError(int(str(answer["errno"])), str(answer.get("error")))
        serial, pid = int(str(answer["serial"])), int(str(answer["pid"]))
        if len(fds) != 2:  # the worker is short of descriptors: they were dropped in transit
            for fd in fds:
                os.close(fd)
            self.end(serial, 0.0)
            raise OSError(errno.EMFILE, "the worker has no descriptor free for a process's pipes")
        return Spawned(serial=serial, pid=pid, requests=fds[0], replies=fds[1])

    def end(self, serial: int, grace_s: float) -> int:
        """Stop the process `serial` (given `grace_s` to exit by itself, then killed) and return its
        wait status."""
        answer, _ = self._ask({"op": "end", "serial": serial, "grace_s": grace_s}, extra_s=grace_s)
        return int(str(answer["status"]))

    def ended(self, serials: Iterable[int]) -> dict[int, int]:
        """Those of `serials` whose process ended, with their wait statuses (reaped: ask no more)."""
        answer, _ = self._ask({"op": "ended", "serials": list(serials)})
        statuses = answer.get("statuses")
        return {int(k): int(v) for k, v in statuses.items()} if isinstance(statuses, dict) else {}


def start_template(
    control: tuple[socket.socket, socket.socket],
    prepare: Callable[[], None],
    child: Callable[[int, int], None],
    prepare_s: float = 0.0,
) -> TemplateProcess:
    """Fork the template: it runs `prepare` (drop what is not its own, build what every episode
    shares: up to `prepare_s` more for its first answer), then serves the worker's messages on its
    end of `control` until the worker goes; each process it forks runs `child`."""
    mine, theirs = control
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            mine.close()
            kernel.die_with_parent()
            prepare()
            _serve(theirs, child)
        except BaseException:  # noqa: BLE001 - the worker finds its template gone
            code = 70
        finally:
            os._exit(code)
    theirs.close()  # the template's end: with it closed here, a template gone is an error at once
    return TemplateProcess(pid, mine, prepare_s)


class _Children:
    """The template's children: unreaped ones by serial, and how reaped ones ended until asked."""

    def __init__(self) -> None:
        self.pids: dict[int, int] = {}  # serial -> pid, not reaped yet
        self.serials: dict[int, int] = {}  # pid -> serial, not reaped yet
        self.statuses: dict[int, int] = {}  # serial -> wait status, reaped, until the worker asks
        self.serial = 0

    def add(self, pid: int) -> int:
        self.serial += 1
        self.pids[self.serial], self.serials[pid] = pid, self.serial
        return self.serial

    def _reaped(self, pid: int, status: int) -> None:
        serial = self.serials.pop(pid, None)
        if serial is not None:
            del self.pids[serial]
            self.statuses[serial] = status

    def reap(self) -> None:
        """Reap every child that ended (no zombie waits for the worker's next question)."""
        while self.pids:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._reaped(pid, status)

    def end(self, serial: int, grace_s: float) -> int:
        """Stop child `serial`, given `grace_s` to exit by itself, then killed; its wait status."""
        pid = self.pids.get(serial)
        if pid is None:
            return self.statuses.pop(serial, 0)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self._reaped(pid, status)
                return self.statuses.pop(serial)
            time.sleep(0.002)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._reaped(pid, os.waitpid(pid, 0)[1])
        return self.statuses.pop(serial)


def _serve(control: socket.socket, child: Callable[[int, int], None]) -> NoReturn:
    """The template's loop: answer the worker's messages, one at a time, until the worker goes."""
    children = _Children()
    while True:
        data = control.recv(_PACKET)
        if not data:
            os._exit(0)
        message = json.loads(data)
        children.reap()
        op = message.get("op")
        if op == "spawn":
            _spawn(control, children, child)
        elif op == "end":
            status = children.end(int(message["serial"]), float(message.get("grace_s", 0.0)))
            control.send(json.dumps({"status": status}).encode())
        elif op == "ended":
            ended = {s: children.statuses.pop(s) for s in message.get("serials", []) if s in children.statuses}
            control.send(json.dumps({"statuses": ended}).encode())
        else:
            control.send(json.dumps({"error": f"unknown message {op!r}"}).encode())


def _spawn(control: socket.socket, children: _Children, child: Callable[[int, int], None]) -> None:
    """Fork a child that runs `child(requests_fd, replies_fd)` and exits; the worker gets the other
    ends of its pipes (SCM_RIGHTS), its serial and pid, or the errno of what failed."""
    opened: list[int] = []
    try:
        opened += os.pipe()  # requests: read end, write end
        opened += os.pipe()  # replies: read end, write end
        pid = os.fork()
    except OSError as exc:
        for fd in opened:
            os.close(fd)
        control.send(json.dumps({"errno": exc.errno, "error": exc.strerror}).encode())
        return
    requests_r, requests_w, replies_r, replies_w = opened
    if pid == 0:  # the new process: never returns
        code = 0
        try:
            control.close()
            os.close(requests_w)
            os.close(replies_r)
            child(requests_r, replies_w)
        except BaseException:  # noqa: BLE001 - the worker reports the missing reply
            code = 70
        finally:
            os._exit(code)
    os.close(requests_r)
    os.close(replies_w)
    answer = json.dumps({"serial": children.add(pid), "pid": pid}).encode()
    try:
        socket.send_fds(control, [answer], [requests_w, replies_r])
    finally:
        os.close(requests_w)
        os.close(replies_r)
