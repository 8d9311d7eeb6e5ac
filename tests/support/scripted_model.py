"""A scripted model behind a real OpenAI-compatible HTTP endpoint (`POST /v1/chat/completions`, streamed or
not), for libraries that drive their policy through an HTTP client (verifiers' harness).

Each conversation is one of the scripts: a script is the replies one episode's model makes, in order, and it
is recognised by a marker in the conversation's first user message (the task's instruction) and by the
replies the conversation already holds (its assistant messages). Conversations with the same marker and no
reply yet take that marker's scripts in turn. A conversation no script fits gets an empty reply.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedModel:
    """The replies of `scripts`: (marker, replies) pairs."""

    def __init__(self, scripts: list[tuple[str, list[str]]]):
        self.scripts = scripts
        self._openings: dict[str, int] = {}
        self._lock = threading.Lock()

    def reply(self, messages: list[dict[str, Any]]) -> str:
        """The next reply of the script this conversation follows."""
        first = next((_text(m) for m in messages if m.get("role") == "user"), "")
        said = [_text(m).strip() for m in messages if m.get("role") == "assistant"]
        fitting = [replies for marker, replies in self.scripts if marker in first and replies[: len(said)] == said]
        if not fitting or len(fitting[0]) <= len(said):
            return ""
        if said:
            return fitting[0][len(said)]
        with self._lock:
            turn = self._openings.get(first, 0)
            self._openings[first] = turn + 1
        return fitting[turn % len(fitting)][0]


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def _completion(text: str, model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _chunks(text: str, model: str) -> Iterator[dict[str, Any]]:
    base = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0, "model": model}
    yield base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}]}
    yield base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    yield base | {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


@contextmanager
def scripted_model(model: ScriptedModel) -> Iterator[str]:
    """Serve `model` on a free loopback port: the OpenAI base URL (`http://127.0.0.1:PORT/v1`)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            text = model.reply(body.get("messages", []))
            name = str(body.get("model", "scripted"))
            self.send_response(200)
            if body.get("stream"):
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in _chunks(text, name):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                return
            payload = json.dumps(_completion(text, name)).encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
