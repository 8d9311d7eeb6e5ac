"""What an imported app keeps of its own between requests, as one comparable value. Stdlib only.

`fingerprint(namespace, module)` walks what the app's module (`module`, its `namespace`) holds: its
globals; the classes and functions it defines (their attributes, defaults and closures); the
attributes of every object reached that is not a framework's (`FRAMEWORKS`: the web stack, the ORM,
logging), the app's own included; the containers among them (dicts, lists, tuples, sets, deques,
bytearrays); and what a framework object keeps for an app (`STORES`). Scalars are recorded by value;
a framework's object by its type and identity, not walked: a framework's own caches (compiled
statements, loading paths, validators) are not the app's. Two fingerprints taken in one process
differ when something the app keeps between requests changed in between.

The walk is structural: it reads objects through their base types' own slots and descriptors
(`type.__dict__[...]`, `object.__getattribute__`, `dict.items`, ...), never through an attribute
lookup, `isinstance`, `repr`, `hash` or iteration that an app's class or metaclass could override, so
none of the app's code runs. What it cannot read (an object of a C type it does not know, an
instance dictionary that is not a dict, malformed `__slots__`), and past `MAX_OBJECTS` objects, the
answer is None: cannot tell, taken as changed.
"""

from __future__ import annotations

import _random
import collections
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
_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes})
#: Modules whose objects are recorded by identity, not walked: what they keep is their own cache.
FRAMEWORKS = frozenset(
    {"fastapi", "starlette", "pydantic", "pydantic_core", "sqlalchemy", "anyio", "typing", "typing_extensions"}
    | {"annotated_types", "asyncio", "logging", "abc", "_abc", "enum", "re", "sre_compile"}
)
#: What a framework object keeps for an app, walked all the same (`_store`).
STORES = ("Starlette's State (app.state)", "an app's or a router's attributes", "an SQLAlchemy session")
#: Attributes of an app or router that the web stack fills itself at its first request.
_APP_CACHES = frozenset({"middleware_stack", "openapi_schema", "_openapi_routes_version"})
#: C types whose objects hold no state of their own (recorded by identity).
_STATELESS = frozenset(
    {
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
        type(Ellipsis),
        type(NotImplemented),
        range,
        slice,
        object,
        types.NoneType,
        type(threading.Lock()),  # released between requests
        type(threading.RLock()),
        weakref.ReferenceType,  # the referent is not walked through it
        weakref.ProxyType,
        weakref.CallableProxyType,
    }
)
_type_dict = type.__dict__["__dict__"].__get__
_type_mro = type.__dict__["__mro__"].__get__
_type_module = type.__dict__["__module__"].__get__
_type_name = type.__dict__["__qualname__"].__get__
_object_attribute = object.__getattribute__


def _mro(cls: type) -> tuple[type, ...]:
    mro: tuple[type, ...] = _type_mro(cls)
    return mro


def _module(cls: type) -> str:
    """The module a class says it was defined in (its own `__module__`, read without any lookup)."""
    name = _type_module(cls)
    return name if type(name) is str else ""


def _framework(cls: type) -> bool:
    return _module(cls).partition(".")[0] in FRAMEWORKS


def _loaded(module: str, name: str) -> type | None:
    """Class `name` of `module` if that module is loaded (the ORM, the web stack: not imported here)."""
    namespace = sys.modules.get(module)
    found = dict.get(_object_attribute(namespace, "__dict__"), name) if namespace is not None else None
    return found if type(found) is type or (found is not None and type in _mro(type(found))) else None


class CannotTell(WorldsmithError):
    """Something the walk cannot read without running code that is not the interpreter's (caught by
    `fingerprint`: its answer is then None)."""


def _has_dict(cls: type) -> bool:
    """Whether instances of `cls` have an attribute dictionary (a thread-local's: per thread)."""
    return any("__dict__" in _type_dict(base) for base in _mro(cls) if base is not object) or threading.local in _mro(
        cls
    )


def _instance_dict(obj: object, cls: type) -> dict[str, Any]:
    """`obj`'s own attributes ({} if it has none; a thread-local's in this thread), read through the
    interpreter's own `__dict__` descriptor; CannotTell if that is not what the class has, or if the
    attributes are not a plain dict."""
    if threading.local in _mro(cls):  # its own lookup answers "__dict__" itself, before any class's
        attributes = threading.local.__getattribute__(obj, "__dict__")  # type: ignore[arg-type]
    else:
        base = next((b for b in _mro(cls) if b is not object and "__dict__" in _type_dict(b)), None)
        if base is None:
            return {}
        descriptor = _type_dict(base)["__dict__"]
        if type(descriptor) not in (types.GetSetDescriptorType, types.MemberDescriptorType):
            raise CannotTell(f"{_type_name(base)}.__dict__ is not the interpreter's")
        attributes = descriptor.__get__(obj, base)
    if type(attributes) is not dict:
        raise CannotTell(f"a {_type_name(cls)}'s attributes are not a dict")
    return attributes


def _slots(obj: object, cls: type) -> Iterator[object]:
    """The values of `obj`'s `__slots__` that are set; CannotTell for slots that are not names."""
    for base in _mro(cls):
        slots = _type_dict(base).get("__slots__", ())
        names = (slots,) if type(slots) is str else slots
        if type(names) not in (tuple, list) or any(type(name) is not str for name in names):
            raise CannotTell(f"{_type_name(base)}.__slots__ is not a sequence of names")
        for name in names:
            descriptor = _type_dict(base).get(name)
            if type(descriptor) is types.MemberDescriptorType:
                try:
                    yield descriptor.__get__(obj, base)
                except AttributeError:
                    continue


def _attributes(obj: object, cls: type, leave: frozenset[str] = frozenset()) -> list[object]:
    """`obj`'s attributes and slot values, names and values in turn (`leave`: names not read)."""
    values: list[object] = []
    for name, value in list(dict.items(_instance_dict(obj, cls))):
        if name not in leave:
            values += (name, value)
    return [*values, *_slots(obj, cls)]


def _store(obj: object, cls: type, mro: tuple[type, ...]) -> list[object] | None:
    """What a framework object keeps for an app (`STORES`), or None if it is no store."""
    state = _loaded("starlette.datastructures", "State")
    if state is not None and state in mro:
        return [dict.get(_instance_dict(obj, cls), "_state")]
    for holder in (_loaded("starlette.applications", "Starlette"), _loaded("starlette.routing", "Router")):
        if holder is not None and holder in mro:  # an app or a router: what the app set on it
            return _attributes(obj, cls, leave=_APP_CACHES)
    session = _loaded("sqlalchemy.orm.session", "Session")
    if session is not None and session in mro:
        attributes = _instance_dict(obj, cls)
        identity = dict.get(attributes, "identity_map")
        held = _instance_dict(identity, type(identity)) if identity is not None else {}
        counted = (held.get("_dict"), held.get("_modified"), attributes.get("_new"), attributes.get("_deleted"))
        # objects held, modified, pending and deleted, and whether a transaction is open
        return [
            *(len(cast(Sized, value)) if type(value) in (dict, set) else -1 for value in counted),
            attributes.get("_transaction") is None,
        ]
    return None


def _read(owner: type, name: str, obj: object) -> Any:
    """Attribute `name` of `obj` as `owner`'s own descriptor reads it (no lookup through `obj`'s class)."""
    return _type_dict(owner)[name].__get__(obj, owner)


def _beneath(obj: Any, cls: type, module: str) -> list[object] | None:
    """What is walked beneath `obj` (of class `cls`), or None if it is recorded by identity alone."""
    mro = _mro(cls)
    if dict in mro:
        return [*_attributes(obj, cls), *(x for item in list(dict.items(obj)) for x in item)]
    for sequence in (list, tuple, collections.deque, set, frozenset):
        if sequence in mro:
            return [*_attributes(obj, cls), *_read(sequence, "__iter__", obj)()]
    if bytearray in mro:
        return [bytes(bytearray.__iter__(obj))]
    if type in mro:  # a class: the app's own are walked, with their attributes
        return [x for item in list(_type_dict(obj).items()) for x in item] if _module(obj) == module else None
    if cls is types.FunctionType:
        if dict.get(_read(types.FunctionType, "__globals__", obj), "__name__") != module:
            return None
        closure = _read(types.FunctionType, "__closure__", obj)
        cells = [_cell_contents(cell) for cell in (closure if type(closure) is tuple else ())]
        defaults = [_read(types.FunctionType, name, obj) for name in ("__defaults__", "__kwdefaults__")]
        return [*defaults, *_attributes(obj, cls), *cells]
    if cls is types.MethodType:
        return [_read(cls, "__self__", obj), _read(cls, "__func__", obj)]
    if cls in (staticmethod, classmethod):
        return [_read(cls, "__func__", obj)]
    if cls is property:
        return [_read(property, name, obj) for name in ("fget", "fset", "fdel")]
    if functools._lru_cache_wrapper in mro:
        return [functools._lru_cache_wrapper.cache_info(obj).currsize, *_attributes(obj, cls)]
    if functools.partial in mro:
        return [_read(functools.partial, name, obj) for name in ("func", "args", "keywords")]
    if _random.Random in mro:
        return [_random.Random.getstate(obj), *_attributes(obj, cls)]
    if cls is itertools.count:  # its next value and step, if they are numbers
        state = itertools.count.__reduce__(obj)[1]
        if any(type(value) not in _SCALARS for value in state):
            raise CannotTell("an itertools.count of values that are not numbers")
        return list(state)
    if cls in _STATELESS:
        return None
    if _framework(cls):
        return _store(obj, cls, mro)
    if not _has_dict(cls) and not any("__slots__" in _type_dict(base) for base in mro):
        raise CannotTell(f"a {_type_name(cls)} keeps its state where it cannot be read")
    return _attributes(obj, cls)


def _cell_contents(cell: types.CellType) -> object:
    try:
        return _read(types.CellType, "cell_contents", cell)
    except ValueError:  # an empty cell
        return ("empty cell",)


def fingerprint(namespace: dict[str, Any], module: str) -> tuple[object, ...] | None:
    """What the app of module `module` keeps between requests (see the module docstring), or None
    when it cannot tell (an object it cannot read, past MAX_OBJECTS objects)."""
    try:
        return _walk(namespace, module)
    except Exception:  # noqa: BLE001 - CannotTell, or an object stranger than the walk knows: cannot tell
        return None


def _walk(namespace: dict[str, Any], module: str) -> tuple[object, ...] | None:
    records: list[object] = []
    seen: dict[int, object] = {}  # by id, each object walked: kept alive, so that no id is reused meanwhile
    stack: list[object] = [namespace]
    while stack:
        obj = stack.pop()
        cls = type(obj)
        # records hold numbers, strings and bytes only: comparing them runs no class's __eq__
        if cls in _SCALARS:
            if cls in (str, bytes) and len(obj) > _LONG:  # type: ignore[arg-type]
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
        beneath = _beneath(obj, cls, module)
        records.append((id(cls), id(obj)) if beneath is None else (id(cls), len(beneath)))
        if beneath is not None:
            stack.extend(reversed(beneath))
    return tuple(records)
