"""What an imported app keeps of its own between requests, as one comparable value. Stdlib only.

`fingerprint(namespace, module)` walks what the app's module (`module`, its `namespace`) holds: its
globals; the classes and functions it defines (their attributes, defaults and closures); instances of
its classes; the containers among them (dicts, lists, tuples, sets, deques, bytearrays); and the
stores a framework object keeps for an app (`STORES`: Starlette's `app.state`, an SQLAlchemy session's
identity map and pending changes, a `functools` cache's size, a `threading.local`). Scalars are
recorded by value; any other object by its type and identity, not walked: a framework's own caches
(compiled statements, loading paths, validators) are not the app's. Two fingerprints taken in one
process differ when something the app keeps between requests changed in between.

Objects are read without running their code (`object.__getattribute__`, the class's own `__dict__`):
a property or `__getattr__` of the app's is never called. Past `MAX_OBJECTS` objects the answer is
None: too much to tell, taken as changed.
"""

from __future__ import annotations

import collections
import functools
import threading
import types
from collections.abc import Iterator
from typing import Any

#: Objects walked at most; past it the fingerprint is None.
MAX_OBJECTS = 100_000
#: Strings and bytes longer than this are recorded by hash.
_LONG = 256
_SCALARS = (type(None), bool, int, float, complex, str, bytes)


def _instance_dict(obj: object) -> dict[str, Any]:
    """`obj`'s own attributes, read without calling any of its code ({} if it has none; a
    thread-local's in this thread)."""
    try:
        if isinstance(obj, threading.local):
            attributes = threading.local.__getattribute__(obj, "__dict__")
        else:
            attributes = object.__getattribute__(obj, "__dict__")
    except (AttributeError, TypeError):
        return {}
    return attributes if isinstance(attributes, dict) else {}


def _slots(obj: object) -> Iterator[object]:
    """The values of `obj`'s `__slots__` that are set."""
    for cls in type(obj).__mro__:
        for name in cls.__dict__.get("__slots__", ()):
            descriptor = cls.__dict__.get(name)
            if isinstance(descriptor, types.MemberDescriptorType):
                try:
                    yield descriptor.__get__(obj, cls)
                except AttributeError:
                    continue


def _starlette_state(obj: object) -> dict[str, Any] | None:
    """The values a Starlette `State` holds (`app.state`), or None if `obj` is none."""
    if type(obj).__name__ == "State":
        values = _instance_dict(obj).get("_state")
        return values if isinstance(values, dict) else None
    return None


def _session(obj: object) -> tuple[int, int, int, int] | None:
    """An SQLAlchemy session's identity map and pending changes, by size, or None if `obj` is none."""
    cls = type(obj)
    if not all(hasattr(cls, name) for name in ("identity_map", "new", "dirty", "deleted", "expire_all")):
        return None
    try:
        return (len(obj.identity_map), len(obj.new), len(obj.dirty), len(obj.deleted))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - not a session after all
        return None


def _stores(obj: object) -> list[object] | None:
    """What a framework object `obj` keeps for the app (`STORES`), or None if it is no store."""
    state = _starlette_state(obj)
    if state is not None:
        return [state]
    holder = _starlette_state(_instance_dict(obj).get("state"))  # an app (FastAPI, Starlette) and its state
    if holder is not None:
        return [holder]
    session = _session(obj)
    if session is not None:
        return [session]
    if isinstance(obj, functools._lru_cache_wrapper):
        return [obj.cache_info().currsize, getattr(obj, "__wrapped__", None)]
    if isinstance(obj, threading.local):
        return [_instance_dict(obj)]
    if isinstance(obj, functools.partial):
        return [obj.func, obj.args, obj.keywords]
    return None


#: The framework objects whose stores are walked, by how they are recognised (`_stores`).
STORES = ("starlette State (app.state)", "SQLAlchemy session", "functools cache", "threading.local", "partial")


def _owned(value: object, module: str) -> bool:
    """Whether `value` is the app's: a class or function its module defines, or an instance of such a class."""
    if isinstance(value, (type, types.FunctionType)):
        return value.__dict__.get("__module__", getattr(value, "__module__", None)) == module
    return type(value).__module__ == module


def _cells(function: types.FunctionType) -> list[object]:
    """What a function's closure holds (an empty cell as a marker)."""
    contents: list[object] = []
    for cell in function.__closure__ or ():
        try:
            contents.append(cell.cell_contents)
        except ValueError:
            contents.append(("empty cell",))
    return contents


def _children(obj: object, module: str) -> list[object] | None:
    """What is walked beneath `obj`, or None if `obj` is recorded by identity alone."""
    if isinstance(obj, dict):
        return [*_instance_dict(obj).values(), *(x for item in list(dict.items(obj)) for x in item)]
    if isinstance(obj, list):
        return [*_instance_dict(obj).values(), *list.__iter__(obj)]
    if isinstance(obj, tuple):
        return [*_instance_dict(obj).values(), *tuple.__iter__(obj)]
    if isinstance(obj, collections.deque):
        return [*_instance_dict(obj).values(), *collections.deque.__iter__(obj)]
    if not _owned(obj, module):
        return _stores(obj)
    if isinstance(obj, type):
        return [x for item in list(type.__dict__["__dict__"].__get__(obj).items()) for x in item]
    if isinstance(obj, types.FunctionType):
        return [obj.__defaults__, obj.__kwdefaults__, _instance_dict(obj), *_cells(obj)]
    return [_instance_dict(obj), *_slots(obj)]


def fingerprint(namespace: dict[str, Any], module: str) -> tuple[object, ...] | None:
    """What the app of module `module` keeps between requests (see the module docstring), or None past
    MAX_OBJECTS objects."""
    records: list[object] = []
    seen: dict[int, object] = {}  # by id, each object walked: kept alive, so that no id is reused meanwhile
    stack: list[object] = [namespace]
    while stack:
        obj = stack.pop()
        if type(obj) in _SCALARS:  # exactly: a subclass's repr could be the app's code
            if isinstance(obj, (str, bytes)) and len(obj) > _LONG:
                records.append((type(obj).__name__, len(obj), hash(obj)))
            else:
                records.append(repr(obj))
            continue
        if id(obj) in seen:
            records.append(("seen", id(obj)))
            continue
        if len(seen) >= MAX_OBJECTS:
            return None
        seen[id(obj)] = obj
        # a container by its contents alone (the walk makes some of them: their ids mean nothing)
        container = isinstance(obj, (dict, list, tuple, collections.deque, set, frozenset, bytearray))
        records.append(type(obj).__qualname__ if container else (type(obj).__qualname__, id(obj)))
        if isinstance(obj, (set, frozenset)):
            members = set.__iter__(obj) if isinstance(obj, set) else frozenset.__iter__(obj)
            records.append(frozenset(x if type(x) in _SCALARS else (type(x).__qualname__, id(x)) for x in members))
        elif isinstance(obj, bytearray):
            records.append((len(obj), hash(bytes(obj))))
        else:
            children = _children(obj, module)
            if children is not None:
                records.append(len(children))
                stack.extend(reversed(children))
    return tuple(records)
