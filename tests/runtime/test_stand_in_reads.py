"""What an imported app keeps between requests (runtime/sandbox/appstate.py), and the template's stand-in
reads kept only where they leave it as it was (runtime/sandbox/standin.py), in this process: no sandbox
worker. The app's module is made here from source, so that its classes and functions are its own."""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

from worldsmith.runtime.sandbox import appstate, asgi, guard, standin
from worldsmith.runtime.sandbox.failure import Failure
from worldsmith.runtime.sandbox.guard import Guard
from worldsmith.runtime.sandbox.host import app_module_name

APP = """
import functools
import itertools
import random
import threading
import types
from collections import namedtuple
from contextvars import ContextVar
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from fastapi import Depends, FastAPI
from pydantic import BaseModel
from sqlalchemy import Integer, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

app = FastAPI()
engine = create_engine("sqlite://")
SETTINGS = {"page_size": 10, "labels": ["a", "b"]}
LOCAL = threading.local()


class Context(threading.local):
    pass


CONTEXT = Context()


class Base(DeclarativeBase):
    pass


class Branch(Base):
    __tablename__ = "branches"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)


class Registry:
    seen = []

    def __init__(self):
        self.count = 0


class Slotted:
    __slots__ = ("value",)

    def __init__(self):
        self.value = 0


class Lazy:
    touched = []

    def __getattr__(self, name):
        Lazy.touched.append(name)
        raise AttributeError(name)

    @property
    def visible(self):
        Lazy.touched.append("visible")
        return 1


class Meta(type):
    def __getattribute__(cls, name):
        Lazy.touched.append(("metaclass", name))
        return type.__getattribute__(cls, name)


class Watched(metaclass=Meta):
    def __getattribute__(self, name):
        Lazy.touched.append(("instance", name))
        return object.__getattribute__(self, name)


class Disguised:  # says it is the interpreter's: walked all the same, none of its code run
    __module__ = "builtins"
    expire_all = None

    @property
    def identity_map(self):
        Lazy.touched.append("identity_map")
        return {}


class Namespaced:
    __slots__ = "value"

    def __init__(self):
        self.value = 0


class Counting:  # a middleware of the app's, reachable only through the app's middleware stack
    def __init__(self, app):
        self.app = app
        self.hits = 0

    async def __call__(self, scope, receive, send):
        await self.app(scope, receive, send)


app.add_middleware(Counting)


class Limiter:  # a dependency's instance, reachable only through its route
    def __init__(self):
        self.calls = 0

    def __call__(self):
        return self.calls


@app.get("/limited", dependencies=[Depends(Limiter())])
async def limited():
    return {}


def routes():  # an endpoint made by a factory: its closure reachable only through its route
    seen = []

    @app.get("/made")
    async def made():
        seen.append(1)
        return {}


routes()


class EqualsAll(type):  # a metaclass the walk must never ask to compare or hash
    def __eq__(cls, other):
        Lazy.touched.append("metaclass __eq__")
        return True

    def __hash__(cls):
        Lazy.touched.append("metaclass __hash__")
        return 0


class Compared(metaclass=EqualsAll):
    pass


class Model(BaseModel):  # what ordinary apps hold: none of it is "cannot tell"
    tags: list[str] = []
    note: str | None = None


EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)
LOAN_PERIOD = timedelta(days=14)
FINE = Decimal("0.25")
Point = namedtuple("Point", "x y")
CURRENT_USER = ContextVar("current_user", default=None)
COMPARED = Compared()
REGISTRY = Registry()
WATCHED = Watched()
DISGUISED = Disguised()
NAMESPACED = Namespaced()
IDS = itertools.count(1)
RNG = random.Random(42)
BAG = types.SimpleNamespace(hits=0)
TAGGED = {Registry()}
SLOTTED = Slotted()
LAZY = Lazy()
SESSION = Session(engine)


def counter():
    calls = 0

    def count():
        nonlocal calls
        calls += 1
        return calls

    return count


COUNT = counter()


@functools.lru_cache
def cached(key):
    return key
"""


#: The runtime key of the environment whose app the module above is.
KEY = "test"


@pytest.fixture
def app_module() -> Iterator[types.ModuleType]:
    """The module above, run as the app module of environment KEY (its classes and functions are its own)."""
    module = types.ModuleType(app_module_name(KEY))
    sys.modules[module.__name__] = module
    try:
        exec(compile(APP, "app.py", "exec"), module.__dict__)
        asgi.build_stack(module.app)  # as the template does before its first fingerprint
        yield module
    finally:
        sys.modules.pop(module.__name__, None)


def _fingerprint(module: types.ModuleType) -> tuple[object, ...] | None:
    return appstate.fingerprint(module.__dict__, module.__name__)


CHANGES = {
    "a global's value": lambda m: m.SETTINGS.update(page_size=20),
    "a list inside a global": lambda m: m.SETTINGS["labels"].append("c"),
    "a new global": lambda m: setattr(m, "LAST_REQUEST", "/api/books"),
    "a class attribute's list": lambda m: m.Registry.seen.append(1),
    "an instance of the app's class": lambda m: setattr(m.REGISTRY, "count", 1),
    "a slot of the app's object": lambda m: setattr(m.SLOTTED, "value", 1),
    "a closure's cell": lambda m: m.COUNT(),
    "an lru_cache": lambda m: m.cached("/api/books"),
    "app.state": lambda m: setattr(m.app.state, "requests", 1),
    "a thread-local": lambda m: setattr(m.LOCAL, "user", 7),
    "the app's thread-local": lambda m: setattr(m.CONTEXT, "user", 7),
    "a session's identity map": lambda m: m.SESSION.add(m.Branch(id=1)),
    "a session's open transaction": lambda m: m.SESSION.connection(),
    "an id counter": lambda m: next(m.IDS),
    "a random generator": lambda m: m.RNG.random(),
    "a SimpleNamespace": lambda m: setattr(m.BAG, "hits", 1),
    "an attribute of the app": lambda m: setattr(m.app, "cache", {"/api/books": []}),
    "an attribute of its router": lambda m: setattr(m.app.router, "hits", 1),
    "an object in a set": lambda m: setattr(next(iter(m.TAGGED)), "count", 2),
    "a slot named by a string": lambda m: setattr(m.NAMESPACED, "value", 1),
    "an object that says it is the interpreter's": lambda m: setattr(m.DISGUISED, "hits", 1),
    "an object with its own __getattribute__": lambda m: object.__setattr__(m.WATCHED, "hits", 1),
    "a middleware's own state": lambda m: setattr(_middleware(m, "Counting"), "hits", 1),
    "a dependency's instance": lambda m: setattr(_route(m, "/limited").dependant.dependencies[0].call, "calls", 1),
    "a factory endpoint's closure": lambda m: _route(m, "/made").endpoint.__closure__[0].cell_contents.append(1),
}


def _middleware(module: types.ModuleType, name: str) -> Any:
    """The app's middleware `name` in its built stack (each one's `app` is the next)."""
    layer = module.app.middleware_stack
    while type(layer).__name__ != name:
        layer = layer.app
    return layer


def _route(module: types.ModuleType, path: str) -> Any:
    return next(route for route in module.app.router.routes if getattr(route, "path", None) == path)


@pytest.mark.unit
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_to_what_the_app_keeps_changes_its_fingerprint(app_module, change):
    before = _fingerprint(app_module)
    assert before is not None and before == _fingerprint(app_module)  # taken twice alike
    CHANGES[change](app_module)
    assert _fingerprint(app_module) != before


@pytest.mark.unit
def test_the_frameworks_own_caches_are_not_the_apps(app_module):
    """What a framework object keeps for itself (here: SQLAlchemy's compiled statements, FastAPI's
    schema, a mapper's memoized paths) is not read: filling it changes nothing."""
    from sqlalchemy import select

    before = _fingerprint(app_module)
    with app_module.engine.connect() as connection:
        app_module.Base.metadata.create_all(connection)
        connection.execute(select(app_module.Branch).order_by(app_module.Branch.id)).all()
    assert len(app_module.engine._compiled_cache) > 0
    app_module.app.openapi()  # cached on the app object
    assert _fingerprint(app_module) == before


@pytest.mark.unit
def test_the_fingerprint_runs_none_of_the_apps_code(app_module):
    """No property, `__getattr__`, `__getattribute__` (the object's or its metaclass's) or method the
    app set on an object (an lru_cache's `cache_info`) is called, whatever module a class says it is of."""
    app_module.cached.cache_info = lambda: app_module.Lazy.touched.append("cache_info")
    app_module.Lazy.touched.clear()
    assert _fingerprint(app_module) is not None
    assert app_module.Lazy.touched == []


@pytest.mark.unit
def test_a_key_that_is_not_a_string_is_never_compared(app_module):
    """A crafted key hashing like an attribute name the walk looks up: cannot tell, and its `__eq__`
    never runs."""

    class Crafted:
        def __hash__(self):
            return hash("_state")

        def __eq__(self, other):
            app_module.Lazy.touched.append("key __eq__")
            return False

    app_module.app.state.__dict__[Crafted()] = 1
    app_module.Lazy.touched.clear()
    assert _fingerprint(app_module) is None
    assert app_module.Lazy.touched == []


UNREADABLE = {
    "a generator": "PENDING = (n for n in range(3))",
    "attributes that are not a dict": (
        "class Odd:\n    pass\n\n\nODD = Odd()\nODD.__dict__ = type('Spoof', (dict,), {})()"
    ),
    "a __dict__ of the app's": "class Fake:\n    @property\n    def __dict__(self):\n        return {}\n\n\nFAKE = Fake()",
}


@pytest.mark.unit
@pytest.mark.parametrize("held", sorted(UNREADABLE))
def test_what_the_walk_cannot_read_is_no_answer(app_module, held):
    """State the walk cannot read without running code that is not the interpreter's: cannot tell
    (taken as changed, so the template makes no stand-in read)."""
    exec(compile(UNREADABLE[held], "app.py", "exec"), app_module.__dict__)
    assert _fingerprint(app_module) is None


@pytest.mark.unit
def test_too_much_to_walk_is_no_answer(app_module, monkeypatch):
    monkeypatch.setattr(appstate, "MAX_OBJECTS", 10)
    assert _fingerprint(app_module) is None


# -- the template's stand-in reads (a trial fork: the sandbox tier) ---------------------------------


class _Host:
    """Stands in for `SandboxHost.stand_in_reads`: `read` is what one round of reads does to the app's
    module in this process (the trial runs it in a fork); each round is counted in the module."""

    def __init__(self, read: Any, finished: bool = True):
        self.read = read
        self.finished = finished

    def run(self, fn: Any, *, episode: Any, files: tuple[str, ...]) -> tuple[Any, str]:
        return fn(), ""  # as `SandboxHost.run` answers, without the guard (not installed here)

    def stand_in_reads(self, env: Any, names: list[str], seconds: float) -> bool:
        module = sys.modules[app_module_name(env.key)]
        self.read(module)
        return self.finished


@pytest.fixture
def loaded(app_module, monkeypatch) -> Any:
    """A loaded environment whose app is `app_module`'s, with two GET routes and a POST one."""
    monkeypatch.setattr(guard, "GUARD", Guard(frameworks=True), raising=False)
    monkeypatch.setattr(standin, "TRIAL_S", 0.5)
    assert app_module.__name__ == app_module_name(KEY)
    routes = {
        name: types.SimpleNamespace(method=method) for name, method in (("b", "GET"), ("a", "GET"), ("c", "POST"))
    }
    return types.SimpleNamespace(key=KEY, app=app_module.app, routes=routes)


@pytest.mark.sandbox
def test_reads_that_leave_the_app_as_it_was_are_made_in_the_template(loaded):
    rounds = []
    host = _Host(lambda module: rounds.append(os.getpid()))
    assert standin.keep_stand_in_reads(host, loaded) == ("a", "b")  # its GET routes
    assert rounds == [os.getpid()]  # here once (the trial's round was in its fork)


@pytest.mark.sandbox
def test_an_app_that_keeps_something_of_its_reads_gets_none(loaded):
    module = sys.modules[app_module_name(loaded.key)]
    rounds = []
    host = _Host(lambda m: (rounds.append(os.getpid()), m.Registry.seen.append("request")))
    assert standin.keep_stand_in_reads(host, loaded) == ()
    assert rounds == [] and module.Registry.seen == []  # the trial's change stayed in its fork


@pytest.mark.sandbox
def test_reads_that_do_not_end_in_time_are_not_made(loaded):
    started = time.monotonic()
    assert standin.keep_stand_in_reads(_Host(lambda m: time.sleep(30)), loaded) == ()
    assert time.monotonic() - started < 10  # the trial is killed past TRIAL_S (0.5 s here) and a second
    assert standin.keep_stand_in_reads(_Host(lambda m: None, finished=False), loaded) == ()


@pytest.mark.sandbox
def test_a_refusal_of_the_guard_during_the_trial_means_no_reads(loaded):
    host = _Host(lambda m: guard.GUARD.violations.append(guard.SandboxViolation("network", "refused")))
    assert standin.keep_stand_in_reads(host, loaded) == ()
    assert guard.GUARD.violations == []


@pytest.mark.sandbox
def test_an_app_changed_only_by_the_templates_own_reads_is_dropped(loaded):
    """Clean in the trial, changed here (an app that behaves differently the second time): the caller
    drops the built app (`Operations.build_shared`), so that no process starts from the changed one."""
    template = os.getpid()
    host = _Host(lambda m: m.Registry.seen.append(1) if os.getpid() == template else None)
    with pytest.raises(Failure, match="changed under its stand-in reads"):
        standin.keep_stand_in_reads(host, loaded)


@pytest.mark.sandbox
def test_reads_that_leave_something_on_the_event_loop_are_not_kept(loaded, monkeypatch):
    """A task a read started and left pending would run in an episode's first request: in the trial it
    means no reads; left by the template's own reads, the loop is cleared and the built app dropped."""
    import asyncio

    from worldsmith.runtime.sandbox import asgi

    loop = asyncio.new_event_loop()
    monkeypatch.setattr(asgi, "LOOP", loop)

    async def later() -> None:
        await asyncio.sleep(3600)

    try:
        leaving = _Host(lambda m: loop.create_task(later()))
        assert standin.keep_stand_in_reads(leaving, loaded) == ()
        assert asgi.loop_idle()  # the trial's task stayed in its fork
        template = os.getpid()
        leaving = _Host(lambda m: loop.create_task(later()) if os.getpid() == template else None)
        with pytest.raises(Failure, match="changed under its stand-in reads"):
            standin.keep_stand_in_reads(leaving, loaded)
        assert not loop._ready and not loop._scheduled  # nothing the task would do is scheduled any more
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


@pytest.mark.sandbox
def test_an_app_without_get_routes_or_not_built_gets_none(loaded):
    host = _Host(lambda m: pytest.fail("no reads expected"))
    loaded.routes = {"c": types.SimpleNamespace(method="POST")}
    assert standin.keep_stand_in_reads(host, loaded) == ()
    loaded.routes, loaded.app = {"a": types.SimpleNamespace(method="GET")}, None
    assert standin.keep_stand_in_reads(host, loaded) == ()
