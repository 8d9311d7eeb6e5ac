"""The gateway's live sessions: what it keeps of each, the keys it sets on the SDK's session state, and
ending a session as its client would (`end_session`), which is how idle sessions expire.

A session's episode opens at `initialize` (serving/world_server.py) and closes once, through
`CLOSE_KEY`: at `submit`, when the client ends the session, or when it has had no request in flight
for the gateway's idle limit (`expire_idle_sessions`; hot-path calls count as activity).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.types import Message, Scope

from worldsmith.runtime.episode import Episode
from worldsmith.serving import hotpath
from worldsmith.serving.served_world import ServedWorld

logger = logging.getLogger(__name__)
EPISODE_KEY = "worldsmith.episode"
#: Set on a session once its episode was submitted: the verdict it got.
SUBMITTED_KEY = "worldsmith.submitted"
#: Set on a session with an episode: closes it (once), at submit or when the session ends.
CLOSE_KEY = "worldsmith.close"


@dataclass
class LiveSession:
    """A session with an open episode: its world, its episode, the SDK connection's state, and its
    activity (requests in flight, when the last one ended), from which the gateway expires it."""

    world: ServedWorld
    episode: Episode
    state: dict[str, Any]
    in_flight: int = 0
    last_active: float = field(default_factory=time.monotonic)
    ending: bool = False  # its DELETE came, or it was expired: nothing more is answered on the hot path


async def end_session(world: ServedWorld, session_id: str) -> None:
    """End session `session_id` of `world` as its client's DELETE does (through the SDK's front door)."""
    scope: Scope = {
        "type": "http",
        "method": "DELETE",
        "path": f"/envs/{world.env_id}/mcp",
        "raw_path": f"/envs/{world.env_id}/mcp".encode(),
        "root_path": "",
        "scheme": "http",
        "query_string": b"",
        "headers": [(hotpath.SESSION_HEADER, session_id.encode())],
        "http_version": "1.1",
        "server": None,
        "client": None,
    }

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def discard(message: Message) -> None:
        pass

    await world.manager.handle_request(scope, receive, discard)


async def expire_idle_sessions(live_sessions: dict[str, LiveSession], idle_s: float) -> None:
    """End every session of `live_sessions` with no request in flight for `idle_s` (as its client's
    DELETE would), checking a few times per idle period; runs until cancelled."""
    period = min(max(idle_s / 4, 0.05), 5.0)
    while True:
        await anyio.sleep(period)
        now = time.monotonic()
        for session_id, live in list(live_sessions.items()):
            if not live.ending and not live.in_flight and now - live.last_active > idle_s:
                live.ending = True
                try:
                    await end_session(live.world, session_id)
                except Exception:  # a bug ending one session: said in the log, the others still expire
                    logger.exception("ending idle session %s of %s failed", session_id, live.world.env_id)
