"""Session affinity between the gateway processes sharing one port (`env serve --processes N`).

A session lives in the process that answered its `initialize` (its episode, its sandbox worker, the SDK's
transport). The session id a client sees names that owner: `<process index>-<the SDK's id>`, written
into every `mcp-session-id` response header and stripped from the request header on the way in, so the
SDK, the hot path and idle expiry (serving/gateway.py, sessions.py) only ever see the SDK's own id. The kernel spreads
connections, not sessions, over the processes (serving/supervisor.py), and a client may spread one
session over several connections (the official client's POST and GET streams, a pool): a request of a
session owned by another process is forwarded to its owner over the owner's Unix socket (serving/relay.py:
the answer streamed back, a GET's SSE stream included) and answered as the owner answers. A session id
naming no process, or a malformed one, is answered as the SDK answers an unknown session (404). Requests
without a session (`initialize`, the listings, `/healthz`) are answered where they land.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mcp_types import INVALID_REQUEST
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from worldsmith.failures import UserFixable
from worldsmith.serving import hotpath
from worldsmith.serving.relay import OwnerGone, Relay

#: A member index as `Member.argument` writes it: ASCII digits, no leading zero, short enough to convert.
_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")


class NotAMember(UserFixable, ValueError):
    """A `--member` argument that `Member.argument` did not write."""


@dataclass
class Member:
    """Gateway process `index` of `count` serving one port; every member's Unix socket is in `run_dir`;
    `supervisor` is the pid of the process that started it (None: started by hand), which it outlives
    by about a second once started. `forwarded` counts the requests this process forwarded to their session's owner."""

    index: int
    count: int
    run_dir: Path
    supervisor: int | None = None
    forwarded: int = 0
    answered: int = 0  # session requests this process answered itself (its own sessions)

    def socket_path(self, index: int | None = None) -> Path:
        """The Unix socket of member `index` (default: this one)."""
        return self.run_dir / f"gateway-{self.index if index is None else index}.sock"

    def argument(self) -> str:
        """This member as the `--member` argument of a gateway process (`INDEX/COUNT[@SUPERVISOR]:RUN_DIR`)."""
        supervisor = f"@{self.supervisor}" if self.supervisor is not None else ""
        return f"{self.index}/{self.count}{supervisor}:{self.run_dir}"

    @classmethod
    def parse(cls, text: str) -> Member:
        """The member `argument()` wrote (NotAMember for anything else)."""
        numbers, _, run_dir = text.partition(":")
        numbers, _, supervisor = numbers.partition("@")
        index, _, count = numbers.partition("/")
        try:
            member = cls(int(index), int(count), Path(run_dir), int(supervisor) if supervisor else None)
        except ValueError:
            member = None
        if member is None or not run_dir or not 0 <= member.index < member.count:
            raise NotAMember(
                f"--member {text!r} is not a gateway process's place (INDEX/N@PID:RUN_DIR): `env serve --processes N` "
                "sets it; leave it unset"
            )
        return member

    def describe(self) -> dict[str, int]:
        """What `/envs` says of this process."""
        return {
            "process": self.index,
            "processes": self.count,
            "session_requests_answered": self.answered,
            "session_requests_forwarded": self.forwarded,
        }


class Affinity:
    """The gateway app of member `member`, its session ids naming their owner and requests of other
    members' sessions forwarded to them (see the module docstring)."""

    def __init__(self, app: ASGIApp, member: Member):
        self.app = app
        self.member = member
        self._prefix = f"{member.index}-".encode()
        self._relays: dict[int, Relay] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._closing_relays(receive), send)
            return
        session = hotpath.header(scope, hotpath.SESSION_HEADER) if scope["type"] == "http" else None
        if session is None:
            await self.app(scope, receive, self._naming_owner(send))
            return
        owner = owner_of(session, self.member.count)
        if owner is None:
            await unknown_session(scope, receive, send)
        elif owner != self.member.index:
            self.member.forwarded += 1
            await self._forward(owner, scope, receive, send)
        else:
            self.member.answered += 1
            sdk_id = session.encode("latin-1")[len(self._prefix) :]
            headers = [(k, sdk_id if k == hotpath.SESSION_HEADER else v) for k, v in scope["headers"]]
            await self.app(dict(scope, headers=headers), receive, self._naming_owner(send))

    def _naming_owner(self, send: Send) -> Send:
        """`send` with this process named in the session id of the response headers."""
        prefix = self._prefix

        async def naming(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = message.get("headers", [])
                if any(k == hotpath.SESSION_HEADER for k, _ in headers):
                    named = [(k, prefix + v if k == hotpath.SESSION_HEADER else v) for k, v in headers]
                    message = {**message, "headers": named}
            await send(message)

        return naming

    def _relay(self, owner: int) -> Relay:
        relay = self._relays.get(owner)
        if relay is None:
            relay = self._relays[owner] = Relay(self.member.socket_path(owner))
        return relay

    def _closing_relays(self, receive: Receive) -> Receive:
        async def closing() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                for relay in self._relays.values():
                    await relay.close()
            return message

        return closing

    async def _forward(self, owner: int, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer the request as member `owner` answers it (404, as for an unknown session, if it is gone)."""
        try:
            await self._relay(owner)(scope, receive, send)
        except OwnerGone:  # its sessions went with it
            await unknown_session(scope, receive, send)


def owner_of(session_id: str, count: int) -> int | None:
    """The index of the member owning `session_id` (`<index>-<sdk id>`), or None if it names none."""
    index, _, sdk_id = session_id.partition("-")
    if not sdk_id or not _INDEX.fullmatch(index) or int(index) >= count:
        return None
    return int(index)


async def unknown_session(scope: Scope, receive: Receive, send: Send) -> None:
    """The SDK's answer to a session id it does not know (streamable_http_manager.py)."""
    error = {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": "Session not found"}}
    await JSONResponse(error, status_code=404)(scope, receive, send)
