"""What an imported app keeps of its own between requests, as one comparable value. Stdlib only.

`fingerprint(namespace, module)` walks what the app's module (`module`, its `namespace`) holds: its
globals; the classes and functions it defines (their attributes, defaults and closures); the
attributes of every object reached that is not a framework's (`FRAMEWORKS`: the web stack, the ORM,
logging), the app's own included; the containers among them (dicts, lists, tuples, sets, deques,
bytearrays); what a framework object keeps for an app (`STORES`); and the app's code a framework
object calls (`LINKS`: the middleware chain, routes' endpoints, dependencies). Scalars are recorded
by value; a framework's object by its type and identity, not walked: a framework's own caches
(compiled statements, loading paths, validators) are not the app's. Two fingerprints taken in one
process differ when something the app keeps between requests changed in between.

The walk is structural: it reads objects through their base types' own slots and descriptors
(`type.__dict__[...]`, `dict.items`, ...) and compares classes by identity, never through an
attribute lookup, `isinstance`, `==`, `hash`, `repr` or iteration that an app's class or metaclass
could override, and it reads a dictionary by key only once all its keys are plain strings. What it
cannot read that way (an object of a C type it does not know, attributes that are not a plain dict,
malformed `__slots__`), and past `MAX_OBJECTS` objects, the answer is None: cannot tell, taken as
changed. The caller runs it as generated code all the same (`standin`): under the guard.
"""

from __future__ import annotations

import _random
import collections
import contextvars
import datetime
import decimal
import functools
import itertools
import sys
import threading
import types
import weakref
from collections.abc import Iterator, Sized
from typing import Any, cast

from worldsmith.errors import WorldsmithError

#: Objects walked at most; past it the fingerprint is None.
MAX_OBJECTS = 100_000
#: Strings and bytes longer than this are recorded by length and hash.
_LONG = 256
_SCALARS = frozenset(map(id, (type(None), bool, int, float, complex, str, bytes)))
#: Modules whose objects are recorded by identity, not walked: what they keep is their own cache.
FRAMEWORKS = frozenset(
    {"fastapi", "starlette", "pydantic", "pydantic_core", "sqlalchemy", "anyio", "typing", "typing_extensions"}
    | {"annotated_types", "asyncio", "logging", "abc", "_abc", "enum", "re", "sre_compile"}
)
#: What a framework object keeps for an app, walked all the same (`_store`).
STORES = ("Starlette's State (app.state)", "an app's or a router's attributes", "an SQLAlchemy session")
#: A framework object's attributes through which it calls the app's code (its middleware, endpoints,
#: dependencies), walked all the same.
LINKS = frozenset({"app", "endpoint", "dependant", "call", "dependencies", "dispatch_func", "routes"})
#: Attributes of an app or router that the web stack fills itself at its first request (the middleware
#: stack is built before the first fingerprint: `asgi.build_stack`).
_APP_CACHES = frozenset({"openapi_schema", "_openapi_routes_version"})
_PAIR = collections.namedtuple("_PAIR", "a b")
#: C types whose objects hold no state of their own, or none they change (recorded by identity).
_STATELESS = frozenset(
    map(
        id,
        (
            types.BuiltinFunctionType,
            types.ModuleType,
            types.CodeType,
            types.GetSetDescriptorType,
            types.MemberDescriptorType,
            types.WrapperDescriptorType,
            types.MethodDescriptorType,
            types.ClassMethodDescriptorType,
            types.MethodWrapperType,
            types.MappingProxyType,
            types.GenericAlias,  # list[str]
            types.UnionType,  # str | None
            type(Ellipsis),
            type(NotImplemented),
            range,
            slice,
            object,
            type(threading.Lock()),  # released between requests
            type(threading.RLock()),
            weakref.ReferenceType,  # the referent is not walked through it
            weakref.ProxyType,
            weakref.CallableProxyType,
            datetime.date,  # immutable values
            datetime.datetime,
            datetime.time,
            datetime.timedelta,
            datetime.timezone,
            decimal.Decimal,
            type(_PAIR.__dict__["a"]),  # a named tuple's field
            contextvars.ContextVar,  # its value lives in a context, and each request runs in a copy
        ),
    )
)
_type_dict = type.__dict__["__dict__"].__get__
_type_mro = type.__dict__["__mro__"].__get__
_type_module = type.__dict__["__module__"].__get__
_type_name = type.__dict__["__qualname__"].__get__


class CannotTell(WorldsmithError):
    """Something the walk cannot read without running code that is not the interpreter's (caught by
    `fingerprint`: its answer is then None)."""


def _plain(mapping: Any) -> Any:
    """`mapping` (a dict or a class's mappingproxy) if all its keys are plain strings, which a lookup
    compares without running any class's `__eq__`; CannotTell otherwise."""
    for key in mapping:  # iterating compares nothing
        if type(key) is not str:
            raise CannotTell("a dictionary with keys that are not strings")
    return mapping


def _mro(cls: type) -> tuple[type, ...]:
    mro: tuple[type, ...] = _type_mro(cls)
    return mro


#: The ids of each class's ancestors, by the class's id, during one walk (the class kept alive meanwhile).
_ANCESTORS: dict[int, tuple[type, frozenset[int]]] = {}


def _derives(cls: type, base: object) -> bool:
    """Whether `base` is in `cls`'s method resolution order (by identity: no metaclass's `__eq__`)."""
    known = _ANCESTORS.get(id(cls))
    if known is None:
        known = _ANCESTORS[id(cls)] = (cls, frozenset(map(id, _mro(cls))))
    return id(base) in known[1]


#: Classes whose namespaces hold only plain string keys, by id, during one walk (kept alive meanwhile).
_CHECKED: dict[int, type] = {}


def _class_dict(cls: type) -> Any:
    """`cls`'s own namespace (a mappingproxy), its keys plain strings."""
    if id(cls) not in _CHECKED:
        _plain(_type_dict(cls))
        _CHECKED[id(cls)] = cls
    return _type_dict(cls)


def _module(cls: type) -> str:
    """The module a class says it was defined in (its own `__module__`, read without any lookup)."""
    name = _type_module(cls)
    return name if type(name) is str else ""


def _framework(cls: type) -> bool:
    return _module(cls).partition(".")[0] in FRAMEWORKS


_LOADED: dict[tuple[str, str], object] = {}


def _loaded(module: str, name: str) -> object:
    """Object `name` of `module` if that module is loaded (the ORM, the web stack: not imported here)."""
    if (module, name) not in _LOADED:
        namespace = sys.modules.get(module)
        if namespace is None:
            return None
        _LOADED[module, name] = _plain(namespace.__dict__).get(name)
    return _LOADED[module, name]


def _has_dict(cls: type) -> bool:
    """Whether instances of `cls` have an attribute dictionary (a thread-local's: per thread)."""
    return _derives(cls, threading.local) or any(
        "__dict__" in _class_dict(base) for base in _mro(cls) if base is not object
    )


def _instance_dict(obj: object, cls: type) -> dict[str, Any]:
    """`obj`'s own attributes ({} if it has none; a thread-local's in this thread), read through the
    interpreter's own `__dict__` descriptor, keys plain strings; CannotTell if that is not what the
    class has, or if the attributes are not a plain dict."""
    if _derives(cls, threading.local):  # its own lookup answers "__dict__" itself, before any class's
        attributes = threading.local.__getattribute__(obj, "__dict__")  # type: ignore[arg-type]
    else:
        base = next((b for b in _mro(cls) if b is not object and "__dict__" in _class_dict(b)), None)
        if base is None:
            return {}
        descriptor = _class_dict(base)["__dict__"]
        if type(descriptor) is not types.GetSetDescriptorType and type(descriptor) is not types.MemberDescriptorType:
            raise CannotTell(f"{_type_name(base)}.__dict__ is not the interpreter's")
        attributes = descriptor.__get__(obj, base)
    if type(attributes) is not dict:
        raise CannotTell(f"a {_type_name(cls)}'s attributes are not a dict")
    return cast(dict[str, Any], _plain(attributes))


#: Each class's slot descriptors by name, by the class's id, during one walk (the class kept alive).
_SLOTS: dict[int, tuple[type, tuple[tuple[str, type, Any], ...]]] = {}


def _slot_descriptors(cls: type) -> tuple[tuple[str, type, Any], ...]:
    """(name, owner, descriptor) of each of `cls`'s `__slots__`; CannotTell for slots that are not names."""
    known = _SLOTS.get(id(cls))
    if known is None:
        found = []
        for base in _mro(cls):
            slots = _class_dict(base).get("__slots__", ())
            names = (slots,) if type(slots) is str else slots
            if (type(names) is not tuple and type(names) is not list) or any(type(n) is not str for n in names):
                raise CannotTell(f"{_type_name(base)}.__slots__ is not a sequence of names")
            for name in names:
                descriptor = _class_dict(base).get(name)
                if type(descriptor) is types.MemberDescriptorType:
                    found.append((name, base, descriptor))
        known = _SLOTS[id(cls)] = (cls, tuple(found))
    return known[1]


def _slots(obj: object, cls: type) -> Iterator[tuple[str, object]]:
    """The names and values of `obj`'s `__slots__` that are set."""
    for name, base, descriptor in _slot_descriptors(cls):
        try:
            yield name, descriptor.__get__(obj, base)
        except AttributeError:
            continue


def _attributes(
    obj: object, cls: type, only: frozenset[str] | None = None, leave: frozenset[str] = frozenset()
) -> list[object]:
    """`obj`'s attributes and slot values, names and values in turn (`only`: those names alone;
    `leave`: names not read)."""
    values: list[object] = []
    for name, value in [*dict.items(_instance_dict(obj, cls)), *_slots(obj, cls)]:
        if (only is None or name in only) and name not in leave:
            values += (name, value)
    return values


def _store(obj: object, cls: type) -> list[object] | None:
    """What a framework object keeps for an app (`STORES`) and the app's code it calls (`LINKS`);
    None if it is neither a store nor holds a link."""
    if _derives(cls, _loaded("starlette.datastructures", "State")):
        return [_instance_dict(obj, cls).get("_state")]
    for holder in (_loaded("starlette.applications", "Starlette"), _loaded("starlette.routing", "Router")):
        if _derives(cls, holder):  # an app or a router: what the app set on it, and its middleware, routes
            return _attributes(obj, cls, leave=_APP_CACHES)
    if _derives(cls, _loaded("sqlalchemy.orm.session", "Session")):
        attributes = _instance_dict(obj, cls)
        identity = attributes.get("identity_map")
        held = _instance_dict(identity, type(identity)) if identity is not None else {}
        counted = (held.get("_dict"), held.get("_modified"), attributes.get("_new"), attributes.get("_deleted"))
        # objects held, modified, pending and deleted, and whether a transaction is open
        return [
            *(len(cast(Sized, value)) if type(value) is dict or type(value) is set else -1 for value in counted),
            attributes.get("_transaction") is None,
        ]
    links = _attributes(obj, cls, only=LINKS)
    return links or None


def _read(owner: type, name: str, obj: object) -> Any:
    """Attribute `name` of `obj` as `owner`'s own descriptor reads it (no lookup through `obj`'s class)."""
    return _type_dict(owner)[name].__get__(obj, owner)


def _beneath(obj: Any, cls: type, namespace: dict[str, Any], module: str) -> list[object] | None:
    """What is walked beneath `obj` (of class `cls`), or None if it is recorded by identity alone."""
    if _derives(cls, dict):
        return [*_attributes(obj, cls), *(x for item in list(dict.items(obj)) for x in item)]
    for sequence in (list, tuple, collections.deque, set, frozenset):
        if _derives(cls, sequence):
            return [*_attributes(obj, cls), *_read(sequence, "__iter__", obj)()]
    if _derives(cls, bytearray):
        return [bytes(bytearray.__iter__(obj))]
    if _derives(cls, type):  # a class: the app's own are walked, with their attributes
        return [x for item in list(_class_dict(obj).items()) for x in item] if _module(obj) == module else None
    if cls is types.FunctionType:
        if _read(types.FunctionType, "__globals__", obj) is not namespace:  # not the app module's
            return None
        closure = _read(types.FunctionType, "__closure__", obj)
        cells = [_cell_contents(cell) for cell in (closure if type(closure) is tuple else ())]
        defaults = [_read(types.FunctionType, name, obj) for name in ("__defaults__", "__kwdefaults__")]
        return [*defaults, *_attributes(obj, cls), *cells]
    if cls is types.MethodType:
        return [_read(cls, "__self__", obj), _read(cls, "__func__", obj)]
    if cls is staticmethod or cls is classmethod:
        return [_read(cls, "__func__", obj)]
    if cls is property:
        return [_read(property, name, obj) for name in ("fget", "fset", "fdel")]
    if cls is functools._lru_cache_wrapper:
        return [functools._lru_cache_wrapper.cache_info(obj).currsize, *_attributes(obj, cls)]
    if cls is functools.partial:
        return [_read(functools.partial, name, obj) for name in ("func", "args", "keywords")]
    if _derives(cls, _random.Random):
        return [_random.Random.getstate(obj), *_attributes(obj, cls)]
    if cls is itertools.count:  # its next value and step, if they are numbers
        state = itertools.count.__reduce__(obj)[1]
        if any(id(type(value)) not in _SCALARS for value in state):
            raise CannotTell("an itertools.count of values that are not numbers")
        return list(state)
    if id(cls) in _STATELESS or cls is _loaded("zoneinfo", "ZoneInfo"):
        return None
    if _framework(cls):
        return _store(obj, cls)
    if not _has_dict(cls) and not any("__slots__" in _class_dict(base) for base in _mro(cls)):
        raise CannotTell(f"a {_type_name(cls)} keeps its state where it cannot be read")
    return _attributes(obj, cls)


def _cell_contents(cell: types.CellType) -> object:
    try:
        return _read(types.CellType, "cell_contents", cell)
    except ValueError:  # an empty cell
        return ("empty cell",)


def fingerprint(namespace: dict[str, Any], module: str) -> tuple[object, ...] | None:
    """What the app of module `module` (its namespace `namespace`) keeps between requests (see the
    module docstring), or None when it cannot tell (an object it cannot read, past MAX_OBJECTS)."""
    try:
        return _walk(namespace, module)
    except BaseException:  # noqa: BLE001 - CannotTell, or anything stranger than the walk knows
        return None
    finally:  # the walk's caches (by id: valid for one walk only)
        for cache in (_CHECKED, _ANCESTORS, _SLOTS):
            cache.clear()


def _walk(namespace: dict[str, Any], module: str) -> tuple[object, ...] | None:
    records: list[object] = []
    seen: dict[int, object] = {}  # by id, each object walked: kept alive, so that no id is reused meanwhile
    stack: list[object] = [namespace]
    while stack:
        obj = stack.pop()
        cls = type(obj)
        # records hold numbers, strings and bytes only: comparing them runs no class's __eq__
        if id(cls) in _SCALARS:
            if (cls is str or cls is bytes) and len(obj) > _LONG:  # type: ignore[arg-type]
                records.append((id(cls), len(obj), hash(obj)))  # type: ignore[arg-type]
            else:
                records.append((id(cls), float.__repr__(obj) if cls is float else obj))
            continue
        if id(obj) in seen:
            records.append(("seen", id(obj)))
            continue
        if len(seen) >= MAX_OBJECTS:
            return None
        seen[id(obj)] = obj
        beneath = _beneath(obj, cls, namespace, module)
        records.append((id(cls), id(obj)) if beneath is None else (id(cls), len(beneath)))
        if beneath is not None:
            stack.extend(reversed(beneath))
    return tuple(records)
