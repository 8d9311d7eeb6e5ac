"""A local OpenAI-compatible chat-completions server for tests, driven by a script of replies.

Each request takes the next scripted reply: a JSON object to answer with, raw text (with any finish
reason), a truncated answer, an answer without choices, the model's refusal, an HTTP error (with
optional Retry-After and the endpoint's message and code), a delay, a stall (no answer until the
client hangs up), a refusal of JSON-schema mode, tool calls (the chat API's, finish reason `tool_calls`),
or a refusal of `tools` (an endpoint without tool calling). Requests are recorded for assertions, and so is the
most requests the server had in flight at once.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from support.patience import MOMENTS_S
from worldsmith.localserver import BackgroundServer

#: A stalled reply (and the `slow` fault) answers after this long if the client never hangs up (a hang guard).
STALL_LIMIT_S = MOMENTS_S
#: A reply waiting for company answers after this long if the company never comes (a hang guard: company
#: that comes late under load is still company).
TOGETHER_LIMIT_S = MOMENTS_S


@dataclass
class Reply:
    kind: str  # json | text | truncated | empty | refusal | status | refuse_schema | stall | tool_calls | refuse_tools
    body: Any = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    together: int = 0  # answer only once this many requests are in flight (see TOGETHER_LIMIT_S)
    finish: str | None = "stop"  # the finish reason of a text answer (None: null)


def json_reply(obj: Any, delay_s: float = 0.0, together: int = 0) -> Reply:
    return Reply("json", obj, delay_s=delay_s, together=together)


def stalled_reply(obj: Any) -> Reply:
    """No answer until the client hangs up; `obj` after STALL_LIMIT_S if it never does."""
    return Reply("stall", obj)


def text_reply(text: str, finish: str | None = "stop") -> Reply:
    return Reply("text", text, finish=finish)


def tool_calls_reply(*calls: tuple[str, dict[str, Any]]) -> Reply:
    """The model calling functions: each (name, arguments), finish reason `tool_calls`."""
    return Reply("tool_calls", list(calls))


def refuse_tools_reply(obj: Any) -> Reply:
    """HTTP 400 to a request with `tools` (an endpoint without tool calling), else `obj` as a JSON answer."""
    return Reply("refuse_tools", obj)


def truncated_reply(text: str) -> Reply:
    return Reply("truncated", text)


def empty_reply() -> Reply:
    """HTTP 200 with an empty `choices` list (and usage), as some gateways answer."""
    return Reply("empty")


def refusal_reply(refusal: str) -> Reply:
    """The model's refusal: `message.refusal` set, no content."""
    return Reply("refusal", refusal)


def error_reply(
    status: int, retry_after: float | None = None, message: str | None = None, code: str | None = None
) -> Reply:
    """HTTP `status` with an OpenAI-style error body (`message`, `code`) and optional Retry-After."""
    headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
    return Reply(
        "status", {"message": message or f"scripted HTTP {status}", "code": code}, status=status, headers=headers
    )


async def until_hung_up(request: Request) -> None:
    """Wait until the client hangs up on `request` (it timed out), or STALL_LIMIT_S if it never does."""
    started = time.monotonic()
    while not await request.is_disconnected() and time.monotonic() - started < STALL_LIMIT_S:
        await asyncio.sleep(0.02)


class ScriptedLLM:
    """The server's state: a queue of replies (the last one repeats) and the requests seen."""

    def __init__(self, replies: list[Reply] | None = None, models: list[str] | Reply | None = None):
        self.replies = list(replies or [])
        #: GET /v1/models: these models listed, this reply (an HTTP error), or 404 (no listing) when None
        self.models = models
        self.requests: list[dict[str, Any]] = []
        self.times: list[float] = []
        self.in_flight = self.peak_in_flight = 0  # counted on the server's one event loop
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
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self._answer(request, body, self._next())
        finally:
            self.in_flight -= 1

    async def _answer(self, request: Request, body: dict[str, Any], reply: Reply) -> JSONResponse:
        waited = time.monotonic()
        while self.in_flight < reply.together and time.monotonic() - waited < TOGETHER_LIMIT_S:
            await asyncio.sleep(0.01)
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.kind == "stall":
            await until_hung_up(request)
        if reply.kind == "status":
            return JSONResponse(
                {"error": {"type": "server_error" if reply.status >= 500 else "invalid_request_error", **reply.body}},
                status_code=reply.status,
                headers=reply.headers,
            )
        if reply.kind == "empty":
            return self.completion(body, "", "stop", choices=False)
        if reply.kind == "refusal":
            return self.completion(body, None, "stop", refusal=reply.body)
        if reply.kind == "refuse_schema" and body.get("response_format", {}).get("type") == "json_schema":
            return JSONResponse(
                {"error": {"message": "response_format json_schema is not supported", "type": "invalid_request_error"}},
                status_code=400,
            )
        if reply.kind == "refuse_tools" and body.get("tools"):
            return JSONResponse(
                {"error": {"message": "tools are not supported by this model", "type": "invalid_request_error"}},
                status_code=400,
            )
        if reply.kind == "tool_calls":
            return self.completion(body, None, "tool_calls", tool_calls=reply.body)
        content = (
            json.dumps(reply.body) if reply.kind in ("json", "refuse_schema", "stall", "refuse_tools") else reply.body
        )
        return self.completion(body, content, {"truncated": "length", "text": reply.finish}.get(reply.kind, "stop"))

    def completion(
        self,
        body: dict[str, Any],
        content: str | None,
        finish: str | None,
        *,
        refusal: str | None = None,
        choices: bool = True,
        tool_calls: list[tuple[str, dict[str, Any]]] | None = None,
    ) -> JSONResponse:
        """A chat-completion response with `content` (or `refusal`, or `tool_calls`: each a function's name and
        arguments), or none when not `choices`; tokens counted as words."""
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        completion_tokens = len((content or refusal or "").split())
        message: dict[str, Any] = {"role": "assistant", "content": content, **({"refusal": refusal} if refusal else {})}
        if tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{len(self.requests)}_{n}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
                for n, (name, arguments) in enumerate(tool_calls)
            ]
        return JSONResponse(
            {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}] if choices else [],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )

    async def listing(self, request: Request) -> JSONResponse:
        """The model listing (`models`), its scripted error, or 404 when there is none."""
        if isinstance(self.models, Reply):
            return await self._answer(request, {}, self.models)
        if self.models is None:
            return JSONResponse({"error": {"message": "no model listing", "type": "invalid_request_error"}}, 404)
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "tests"} for m in self.models]
        return JSONResponse({"object": "list", "data": data})

    async def embeddings(self, request: Request) -> JSONResponse:
        """Bag-of-words vectors over a fixed hashed vocabulary: similar texts get similar vectors."""
        import hashlib

        body = await request.json()
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        self.requests.append(body)
        data = []
        for index, text in enumerate(texts):
            vector = [0.0] * 64
            for word in re.findall(r"[a-z]+", text.lower()):
                vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1.0
            data.append({"object": "embedding", "index": index, "embedding": vector})
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": body.get("model"),
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.completions, methods=["POST"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/v1/models", self.listing, methods=["GET"]),
            ]
        )

    def serve(self) -> BackgroundServer:
        return BackgroundServer(self.app())


class ProceduralLLM(ScriptedLLM):
    """An OpenAI-compatible server that answers every generation stage with procedural content
    (as a capable model would), after injecting the faults scheduled for that stage: `faults`
    maps a stage to the faults of its next requests, in order."""

    CONTENT_FAULTS = {
        "schema": "sql_error",
        "seed": "seed_fk",
        "tool_code": "tool_raises",
        "verifiers": "verifier_accepts_untouched",
    }

    def __init__(self, faults: dict[str, list[str]] | None = None, seed: int = 0, latency_s: float = 0.0):
        super().__init__()
        from worldsmith.llm.procedural.backend import ProceduralGenerator

        self.faults = {stage: list(kinds) for stage, kinds in (faults or {}).items()}
        self.seed = seed
        self.latency_s = latency_s
        self.generator = ProceduralGenerator(seed=seed)
        self.served: list[tuple[str, str]] = []  # (stage, fault or "ok")

    def _fault(self, stage: str) -> str:
        with self._lock:
            kinds = self.faults.get(stage) or []
            return kinds.pop(0) if kinds else "ok"

    async def completions(self, request: Request) -> JSONResponse:
        from worldsmith.llm.backend import Prompt
        from worldsmith.llm.prompts import scenario_lines, stage_of

        body = await request.json()
        self.requests.append(body)
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        stage = stage_of(system.split("\n\nAnswer with one JSON object")[0]) or "unknown"
        fault = self._fault(stage)
        self.served.append((stage, fault))
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if fault == "http_429":
            return JSONResponse({"error": {"message": "rate limited"}}, status_code=429, headers={"retry-after": "1"})
        if fault == "http_500":
            return JSONResponse({"error": {"message": "upstream exploded"}}, status_code=500)
        if fault == "http_401":
            return JSONResponse({"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}, 401)
        if fault == "context_length":
            message = "This model's maximum context length is 8192 tokens; you requested 9000 tokens."
            return JSONResponse({"error": {"message": message, "code": "context_length_exceeded"}}, 400)
        if fault == "empty_choices":
            return self.completion(body, "", "stop", choices=False)
        if fault == "slow":
            await until_hung_up(request)
        name, description = scenario_lines(user)
        context = {"scenario": {"name": name, "description": description, "categories": []}, "seed": self.seed}
        if stage == "scenario":
            wanted = re.search(r"Propose (\d+) new", user)
            context = {"count": int(wanted.group(1)) if wanted else 1, "examples": [], "round": len(self.requests)}
        prompt = Prompt(stage, system, user, context)
        text = self.generator.answer_text(
            prompt, fault=fault in ("sql_error", "seed_fk", "tool_raises", "verifier_accepts_untouched")
        )
        finish = "stop"
        if fault == "malformed_json":
            text = "Here you go: " + text.replace('": ', '" ', 3)
        elif fault == "truncated":
            text, finish = text[: len(text) // 2], "length"
        elif fault == "schema_violation":
            text = json.dumps({"result": json.loads(text)})
        return self.completion(body, text, finish)
