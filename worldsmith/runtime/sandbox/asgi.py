"""ASGI environments inside a sandbox worker: a FastAPI app's routes as tools, called in-process.

Imports nothing third-party at module level: the web stack is imported by `preload()` in workers
started for ASGI environments (before the worker confines itself), never in stdlib-only workers.

- `preload()` imports the stack and makes it run sync endpoints and dependencies inline: one
  thread, so the episode's connection, the timers and the guard apply to the code as they do to
  plain tools.
- `routes_of(app)` reads the app's OpenAPI document: one tool per operation, named by its
  operation_id, its arguments flat (path parameters, then query parameters, then the fields of
  the JSON body), as fastapi-mcp and the AWM release expose them.
- `call(app, route, arguments)` sends one HTTP request through the app (an ASGI scope, no
  socket, no server) and returns the status and the decoded body.
- `warm(app, namespace)` builds what the stack would build at the app's first request, running
  none of the app's per-request or per-row code.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from worldsmith.jsonvalue import JsonObject, JsonValue

#: The web stack an app may use, imported before the worker confines itself.
FRAMEWORK_MODULES = (
    "fastapi",
    "fastapi.routing",
    "fastapi.encoders",
    "fastapi.exceptions",
    "fastapi.responses",
    "fastapi.openapi.utils",
    "fastapi.dependencies.utils",
    "fastapi.concurrency",
    "starlette.applications",
    "starlette.routing",
    "starlette.responses",
    "starlette.concurrency",
    "starlette.middleware.base",  # `@app.middleware("http")`: its first request imports the rest of anyio
    "anyio._backends._asyncio",
    "anyio.streams.memory",
    "anyio.streams.stapled",
    "anyio.streams.tls",
    "queue",
    "pydantic",
    "pydantic.fields",
    "sqlalchemy",
    "sqlalchemy.orm",
    "sqlalchemy.pool",
    "sqlalchemy.sql",
    "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.sqlite.pysqlite",
    "sqlalchemy.ext.declarative",
    "sqlalchemy.ext.hybrid",
    "anyio",
    "anyio.to_thread",
    "typing_extensions",
    "annotated_types",
    "email.utils",
    "urllib.parse",
    "asyncio",
)
#: Environment variable names whose reading is an attempt to reach a secret.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|^AWS_|OPENAI|ANTHROPIC|HF_", re.IGNORECASE)


#: The worker's event loop, made by `preload` (its self-pipe is a socket pair, which the seccomp
#: layer forbids creating afterwards).
LOOP: asyncio.AbstractEventLoop | None = None


def preload() -> None:
    """Import the web stack, make sync endpoints and dependencies run inline (no thread pool) and
    create the event loop requests run on."""
    global LOOP
    for name in FRAMEWORK_MODULES:
        importlib.import_module(name)
    LOOP = asyncio.new_event_loop()
    asyncio.set_event_loop(LOOP)
    import contextlib

    import fastapi.concurrency
    import fastapi.dependencies.utils
    import fastapi.routing
    import starlette.concurrency

    async def run_inline(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    @contextlib.asynccontextmanager
    async def context_inline(cm: Any) -> Any:
        with cm as value:
            yield value

    patched: tuple[Any, ...] = (starlette.concurrency, fastapi.concurrency, fastapi.routing, fastapi.dependencies.utils)
    for module in patched:
        if hasattr(module, "run_in_threadpool"):
            module.run_in_threadpool = run_inline
        if hasattr(module, "contextmanager_in_threadpool"):
            module.contextmanager_in_threadpool = context_inline
    # build the stack's lazily created parts (validators, the sqlite dialect) while files may still be read
    from sqlalchemy import create_engine, text

    with create_engine("sqlite://").connect() as conn:
        conn.execute(text("SELECT 1"))


class MonitoredEnviron(dict[str, str]):
    """The environment an app sees as `os.environ`: empty; reading a secret-looking name calls `on_secret`."""

    def __init__(self, on_secret: Callable[[str], None]):
        super().__init__()
        self._on_secret = on_secret

    def _looked_up(self, key: Any) -> None:
        if isinstance(key, str) and SECRET_NAME.search(key):
            self._on_secret(key)

    def __getitem__(self, key: Any) -> Any:
        self._looked_up(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._looked_up(key)
        return super().get(key, default)

    def __contains__(self, key: Any) -> bool:
        self._looked_up(key)
        return super().__contains__(key)


@dataclass
class Route:
    """One operation of the app, exposed as a tool."""

    name: str
    method: str
    path: str
    description: str
    path_params: list[str] = field(default_factory=list)
    query_params: list[str] = field(default_factory=list)
    body_fields: list[str] = field(default_factory=list)
    body_whole: str | None = None  # a body that is not an object: passed as this one argument
    parameters: JsonObject = field(default_factory=dict)  # the JSON Schema of its arguments

    def schema(self) -> JsonObject:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


def _resolve(node: Any, components: Mapping[str, JsonObject], depth: int = 0) -> Any:
    """`node` with `#/components/schemas/...` references inlined (recursion cut at depth 8)."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            if depth >= 8:
                return {"type": "object"}
            target = components.get(ref.rsplit("/", 1)[1], {"type": "object"})
            return _resolve({**target, **{k: v for k, v in node.items() if k != "$ref"}}, components, depth + 1)
        return {k: _resolve(v, components, depth) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, components, depth) for v in node]
    return node


def routes_of(app: Any) -> dict[str, Route]:
    """The app's operations by tool name (operation_id), with flat JSON schemas of their arguments."""
    document = app.openapi()
    components = document.get("components", {}).get("schemas", {})
    routes: dict[str, Route] = {}
    for path, operations in document.get("paths", {}).items():
        for method, op in operations.items():
            if method.lower() not in ("get", "post", "put", "patch", "delete") or not op.get("operationId"):
                continue
            route = Route(
                name=op["operationId"],
                method=method.upper(),
                path=path,
                description=" ".join(x for x in (op.get("summary"), op.get("description")) if x) or op["operationId"],
            )
            properties: JsonObject = {}
            required: list[str] = []
            for param in op.get("parameters", []):
                where = param.get("in")
                if where not in ("path", "query"):
                    continue
                (route.path_params if where == "path" else route.query_params).append(param["name"])
                properties[param["name"]] = {
                    **_resolve(param.get("schema", {}), components),
                    **({"description": param["description"]} if param.get("description") else {}),
                }
                if param.get("required") or where == "path":
                    required.append(param["name"])
            body = (op.get("requestBody") or {}).get("content", {}).get("application/json", {}).get("schema")
            if body is not None:
                body = _resolve(body, components)
                if body.get("type") == "object" or "properties" in body:
                    for name, schema in body.get("properties", {}).items():
                        route.body_fields.append(name)
                        properties[name] = schema
                    required.extend(body.get("required", []))
                else:
                    route.body_whole = "body"
                    properties["body"] = body
                    if (op.get("requestBody") or {}).get("required"):
                        required.append("body")
            route.parameters = {
                "type": "object",
                "properties": properties,
                "required": [*sorted(set(required))],
                "additionalProperties": False,
            }
            routes[route.name] = route
    return routes


#: The path of the request `warm` sends: no route's (operation paths start with "/"; this one is
#: refused before any endpoint runs).
UNROUTED_PATH = "/.worldsmith-warm"


def warm(app: Any, namespace: Mapping[str, Any]) -> None:
    """Build now what the web stack builds lazily at an app's first request, so that processes forked
    after share it instead of each building it at its first call: SQLAlchemy's mappers configured
    (done once per process either way) and a SELECT of each mapped class of the app's module
    (`namespace`) compiled, and one request to a path no route serves (the middleware stack built,
    the router's matching run). None of the app's code that runs per request or per row runs here,
    so an episode's process starts with the app's module state as a fresh start would have it: no
    endpoint runs; the request is sent only to an app whose per-request path is the web stack's own
    (`_stack_only`), and a class is selected only if loading its rows runs none of the app's code
    (`_loads_plainly`)."""
    from sqlalchemy import Engine, select
    from sqlalchemy.orm import Session, configure_mappers

    configure_mappers()
    values = list(namespace.values())
    mapped = [v for v in values if isinstance(v, type) and getattr(v, "__mapper__", None) is not None]
    plain = [cls for cls in mapped if _loads_plainly(cls)]
    for engine in [v for v in values if isinstance(v, Engine)]:
        with Session(engine) as session:
            for cls in plain:
                session.scalars(select(cls).limit(1)).all()
    assert LOOP is not None, "preload() makes the event loop"
    if _stack_only(app):
        LOOP.run_until_complete(_request(app, "GET", UNROUTED_PATH, [], None))


def _library(value: Any) -> bool:
    """Whether `value`'s class is the web stack's own (not one the app's code defined)."""
    return type(value).__module__.split(".")[0] in ("fastapi", "starlette", "sqlalchemy")


def _stack_only(app: Any) -> bool:
    """Whether a request to a path no route serves runs only the web stack's code in `app`: a plain
    FastAPI app and router, no middleware of the app's, the stack's own routes and error handlers."""
    import fastapi
    from fastapi import exception_handlers

    defaults = {
        exception_handlers.http_exception_handler,
        exception_handlers.request_validation_exception_handler,
        exception_handlers.websocket_request_validation_exception_handler,
    }
    return (
        type(app) is fastapi.FastAPI
        and type(app.router) is fastapi.routing.APIRouter
        and not app.user_middleware
        and all(handler in defaults for handler in app.exception_handlers.values())
        and all(_library(route) for route in app.router.routes)
    )


def _loads_plainly(cls: type) -> bool:
    """Whether loading a row of the mapped class `cls` runs none of the app's code: no `load` or
    `refresh` listener (a reconstructor included) and only SQLAlchemy's own column types."""
    events = cls._sa_class_manager.dispatch  # type: ignore[attr-defined]
    mapper = cls.__mapper__  # type: ignore[attr-defined]
    return not events.load and not events.refresh and all(_library(column.type) for column in mapper.columns)


def _split(route: Route, arguments: Mapping[str, JsonValue]) -> tuple[str, list[tuple[str, str]], bytes | None]:
    """(path, query pairs, JSON body) of a call: path parameters by name, then query parameters,
    the rest is the body. Raises KeyError naming a missing path parameter."""
    path = route.path
    for name in route.path_params:
        path = path.replace("{" + name + "}", urllib.parse.quote(str(arguments[name]), safe=""))
    query: list[tuple[str, str]] = []
    for name in route.query_params:
        value = arguments.get(name)
        if value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            query.append((name, json.dumps(item) if isinstance(item, (dict, bool)) else str(item)))
    rest = {k: v for k, v in arguments.items() if k not in route.path_params and k not in route.query_params}
    if route.body_whole is not None:
        return path, query, json.dumps(rest.get(route.body_whole)).encode()
    return (
        path,
        query,
        (json.dumps(rest).encode() if route.body_fields or route.method in ("POST", "PUT", "PATCH") else None),
    )


async def _request(
    app: Any, method: str, path: str, query: list[tuple[str, str]], body: bytes | None
) -> tuple[int, bytes]:
    payload = body or b""
    headers = [(b"host", b"worldsmith.local"), (b"accept", b"application/json")]
    if body is not None:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": urllib.parse.urlencode(query).encode(),
        "headers": headers,
        "client": ("127.0.0.1", 0),
        "server": ("worldsmith.local", 80),
        "state": {},
    }
    delivered = False
    status = 500
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await asyncio.sleep(3600)  # the client never disconnects mid-request
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


def build_stack(app: Any) -> None:
    """Build the app's middleware stack now, as its first request would (its middleware's constructors
    run: the caller runs this as generated code)."""
    if getattr(app, "middleware_stack", None) is None:
        app.middleware_stack = app.build_middleware_stack()


def loop_idle() -> bool:
    """Whether nothing waits on the event loop: no task pending, no callback or timer scheduled (what a
    request left would run in the next request's turn of the loop)."""
    if LOOP is None:
        return True
    ready, scheduled = getattr(LOOP, "_ready", ()), getattr(LOOP, "_scheduled", ())
    return not asyncio.all_tasks(LOOP) and not ready and not scheduled


def clear_loop() -> None:
    """Drop every callback and timer scheduled on the event loop, so that nothing a request left (a
    task's next step included) runs in a later request's turn of the loop."""
    for name in ("_ready", "_scheduled"):
        pending = getattr(LOOP, name, None)
        if pending is not None:
            pending.clear()


def call(app: Any, route: Route, arguments: Mapping[str, JsonValue]) -> tuple[int, JsonValue]:
    """One call of `route` with flat `arguments`: (HTTP status, decoded JSON body or text)."""
    assert LOOP is not None, "preload() makes the event loop"
    path, query, body = _split(route, arguments)
    status, raw = LOOP.run_until_complete(_request(app, route.method, path, query, body))
    text = raw.decode("utf-8", errors="replace")
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text


def error_detail(value: Any) -> str:
    """The message of an error response (FastAPI's `detail`, validation errors shortened)."""
    detail = value.get("detail", value) if isinstance(value, dict) else value
    if isinstance(detail, list):  # 422: [{"loc": [...], "msg": ...}, ...]
        return "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', [])[1:]) or 'request'}: {d.get('msg')}"
            for d in detail[:5]
            if isinstance(d, dict)
        )
    return str(detail)[:500]
