"""A local OpenAI-compatible chat-completions server for tests, driven by a script of replies.

Each request takes the next scripted reply: a JSON object to answer with, raw text, a truncated
answer, an HTTP error (with optional Retry-After), a delay, or a refusal of JSON-schema mode.
Requests are recorded for assertions.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from worldsmith.runtime.gateway import BackgroundServer


@dataclass
class Reply:
    kind: str  # json | text | truncated | status | refuse_schema
    body: Any = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


def json_reply(obj: Any, delay_s: float = 0.0) -> Reply:
    return Reply("json", obj, delay_s=delay_s)


def text_reply(text: str) -> Reply:
    return Reply("text", text)


def truncated_reply(text: str) -> Reply:
    return Reply("truncated", text)


def error_reply(status: int, retry_after: float | None = None) -> Reply:
    return Reply("status", status=status, headers={"retry-after": str(retry_after)} if retry_after is not None else {})


class ScriptedLLM:
    """The server's state: a queue of replies (the last one repeats) and the requests seen."""

    def __init__(self, replies: list[Reply] | None = None):
        self.replies = list(replies or [])
        self.requests: list[dict[str, Any]] = []
        self.times: list[float] = []
        self._lock = threading.Lock()

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self.replies = list(replies)

    def _next(self) -> Reply:
        with self._lock:
            return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]

    async def completions(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        self.times.append(time.monotonic())
        reply = self._next()
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.kind == "status":
            return JSONResponse({"error": {"message": f"scripted HTTP {reply.status}", "type": "server_error"}},
                                status_code=reply.status, headers=reply.headers)
        if reply.kind == "refuse_schema" and body.get("response_format", {}).get("type") == "json_schema":
            return JSONResponse({"error": {"message": "response_format json_schema is not supported", "type": "invalid_request_error"}}, status_code=400)
        content = json.dumps(reply.body) if reply.kind in ("json", "refuse_schema") else reply.body
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        return JSONResponse({
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "length" if reply.kind == "truncated" else "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(content.split()), "total_tokens": prompt_tokens + len(content.split())},
        })

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.completions, methods=["POST"])])

    def serve(self) -> BackgroundServer:
        return BackgroundServer(self.app())
