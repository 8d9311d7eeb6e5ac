"""Tamper detection: the module state generated code shares with later calls, fingerprinted and restored. Stdlib only.

`ModuleState` records the attribute tables of the allowed modules (and `TRUSTED_MODULES`), the
sandbox's stub modules and the restricted builtins once clean; `changed()` after each run of
generated code names what was rebound, added or removed, and puts the recorded values back. The
guard builds one (`guard.Guard.state`); the worker retires itself (strict isolation: the episode's
process) when it reports anything.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from operator import is_
from typing import Any

#: Module globals the standard library rebinds itself as it runs (uuid1's node and clock): not tampering.
_STDLIB_REBOUND = frozenset({("uuid", "_node"), ("uuid", "_last_timestamp")})


#: Modules the worker's own code calls after generated code ran (paths and files: episode
#: directories, snapshot files), fingerprinted with the allowed ones: a rebinding (say
#: `pathlib.os.path.exists`) is caught before trusted code meets it.
TRUSTED_MODULES = frozenset({"os", "posixpath", "genericpath", "stat"})


#: Where CPython 3.11 keeps a dict's entry count and its version tag (PEP 509: a value no other dict
#: had, given anew by every change of the dict), read through ctypes: a table whose tag is still the
#: one recorded is unchanged, so only changed tables are compared entry by entry.
_DICT_USED_OFFSET, _DICT_VERSION_OFFSET = 16, 24


def _version_tags_work() -> bool:
    """Whether this interpreter's dicts have version tags where `_DICT_VERSION_OFFSET` says (checked on
    a probe dict: its count where expected, its tag new after each change); else tables are compared whole."""
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11):
        return False
    probe: dict[str, int] = {}
    used = ctypes.c_ssize_t.from_address(id(probe) + _DICT_USED_OFFSET)
    tag = ctypes.c_uint64.from_address(id(probe) + _DICT_VERSION_OFFSET)
    seen = {tag.value}
    changes: tuple[Callable[[], None], ...] = (
        lambda: probe.__setitem__("a", 1),
        lambda: probe.__setitem__("a", 2),
        probe.clear,
    )
    for change in changes:
        change()
        if tag.value in seen or used.value != len(probe):
            return False
        seen.add(tag.value)
    return True


_VERSION_TAGS = _version_tags_work()


def _version_tag(table: dict[str, Any]) -> ctypes.c_uint64 | None:
    """A live view of `table`'s version tag (the table must outlive it), or None where tags are not read."""
    return ctypes.c_uint64.from_address(id(table) + _DICT_VERSION_OFFSET) if _VERSION_TAGS else None


class ModuleState:
    """A fingerprint of the attribute tables generated code shares with every later call in its
    worker: the `__dict__` of each loaded module of `modules` (allowed modules and their submodules),
    of the sandbox's stub modules and of the restricted builtins table, plus the fields of
    `decimal`'s template contexts. `changed()` after a call names what was rebound, added or
    removed, and puts the recorded values back (the worker's own code, e.g. its reply's `json.dumps`,
    meets clean modules until it is retired). Entries are compared by identity with the recorded
    keys and values, which are kept alive. A table whose version tag (`_version_tag`) is unchanged
    is skipped: the check costs a few microseconds, not a walk over every entry of every table."""

    def __init__(self, modules: frozenset[str], extra: dict[str, dict[str, Any]]):
        self.modules = modules
        self.extra = extra
        self._tables: list[tuple[str, dict[str, Any], tuple[str, ...], tuple[Any, ...]]] = []
        self._tags: list[tuple[ctypes.c_uint64 | None, int]] = []  # per table: its live tag, the tag recorded
        self._contexts: tuple[str, ...] = ()
        self._module_count = 0
        self.record()

    def _decimal_contexts(self) -> tuple[str, ...]:
        import decimal

        return tuple(repr(c) for c in (decimal.DefaultContext, decimal.BasicContext, decimal.ExtendedContext))

    def record(self) -> None:
        """Take the current tables as the clean state."""
        tables = {}
        for name, module in list(sys.modules.items()):
            if module is not None and name.split(".")[0] in self.modules:
                tables[name] = module.__dict__
        tables.update(self.extra)  # the stub `sqlite3` generated code imports, not the real one
        self._tables = [(name, table, tuple(table), tuple(table.values())) for name, table in sorted(tables.items())]
        self._tags = [self._tag(table) for _, table, _, _ in self._tables]
        self._contexts = self._decimal_contexts()
        self._module_count = len(sys.modules)

    @staticmethod
    def _tag(table: dict[str, Any]) -> tuple[ctypes.c_uint64 | None, int]:
        tag = _version_tag(table)
        return tag, tag.value if tag is not None else 0

    def changed(self) -> list[str]:
        """What was rebound since the clean state (`json.dumps`, `builtins.len`...), restored; [] if nothing."""
        tags = self._tags
        # a tag is None only where _VERSION_TAGS is False
        if _VERSION_TAGS and [tag.value for tag, _ in tags] == [then for _, then in tags]:  # type: ignore[union-attr]
            changed: list[str] = []  # no table changed (the common case), told without a walk over any table
        else:
            changed = self._changed_tables()
        contexts = self._decimal_contexts()
        if contexts != self._contexts:  # reported, not restored: the worker runs no decimal code of its own
            labels = ("DefaultContext", "BasicContext", "ExtendedContext")
            changed += [f"decimal.{label}" for label, now, then in zip(labels, contexts, self._contexts) if now != then]
        if not changed and len(sys.modules) != self._module_count:
            self.record()  # allowed modules imported during the call: clean, watched from now on
        return changed

    def _changed_tables(self) -> list[str]:
        """The entries of tables that differ from the clean state, restored (see `changed`)."""
        changed: list[str] = []
        for index, (name, table, keys, values) in enumerate(self._tables):
            tag, recorded_tag = self._tags[index]
            if tag is not None and tag.value == recorded_tag:  # not changed since recorded (nor restored)
                continue
            # identity only (`operator.is_`, in C): no `__eq__` of generated code runs here, and not
            # `id()`, whose audit event would call the guard's hook for every entry
            if len(table) == len(keys) and all(map(is_, table, keys)) and all(map(is_, table.values(), values)):
                self._tags[index] = self._tag(table)  # changed and changed back: the same entries
                continue
            recorded = dict(zip(keys, values, strict=True))
            names = [k for k in keys if k not in table or table[k] is not recorded[k]]
            names += [k for k in table if k not in recorded]
            tampered = [
                k
                for k in names
                if (name, k) not in _STDLIB_REBOUND
                # a submodule of `name` imported during the call becomes its attribute
                and not (k not in recorded and table.get(k) is not None and sys.modules.get(f"{name}.{k}") is table[k])
            ]
            if tampered:
                changed += [f"{name}.{k}" for k in tampered]
                table.clear()
                table.update(recorded)
            else:  # only the standard library's own rebinding: the new values are the clean state
                self._tables[index] = (name, table, tuple(table), tuple(table.values()))
            self._tags[index] = self._tag(table)
        return changed
