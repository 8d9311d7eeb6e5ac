"""Host paths are blind to generated code. Stdlib only.

The functions of `os` that report on a path without opening it (existence, size, times, owner,
link targets, directory entries, file-system figures) are replaced, in the `os` module itself, by
ones that first ask a gate: what generated code may not see answers as if it did not exist
(`FileNotFoundError`, `EBADF` for a descriptor, `os.access` False), what it may see is passed on to the real
function. CPython audits only some of these calls (`os.listdir`, `os.scandir`, the xattr calls) and
none of `stat`, `lstat`, `access`, `readlink`, `statvfs`, `pathconf`; Landlock does not cover them
either. Every route of the standard library (`os.path.exists`/`getsize`/`realpath`..., `pathlib.Path`
`.stat()`/`.exists()`/`.iterdir()`/`.resolve()`..., `os.walk`, `linecache`) looks them up as
attributes of `os` when it runs, so they all meet the gate; the import system keeps the real
functions (it calls `posix` directly).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

#: Functions of `os` that report on a path (or, where they accept one, an open descriptor).
PATH_FUNCTIONS = ("stat", "lstat", "access", "readlink", "statvfs", "pathconf", "getxattr")
#: ... of them, those whose path may be left out (the current directory).
OPTIONAL_PATH_FUNCTIONS = ("listdir", "scandir", "listxattr")
#: Functions of `os` that report on an open descriptor.
DESCRIPTOR_FUNCTIONS = ("fstat", "fstatvfs", "fpathconf")

#: What a gated function answers for what may not be seen, where it answers rather than raises.
ABSENT_ANSWERS = {"access": False}

#: The gate: given what a call names (a path as str, bytes or path-like, or a descriptor) and its
#: `dir_fd` (None if not given), the value to call the real function with, or None where the caller
#: must not see it. It returns its argument unchanged while no generated code runs.
Gate = Callable[[Any, Any], Any]


#: The sets of `os` naming which functions take `dir_fd`, a descriptor, ...: a gated function joins
#: those its real one is in (code that asks, such as `shutil`, keeps its answers).
CAPABILITY_SETS = ("supports_dir_fd", "supports_fd", "supports_follow_symlinks", "supports_effective_ids")


def blind(module: Any, gate: Gate) -> None:
    """Replace the path-reporting functions of `module` (the `os` module) by gated ones; once per process."""
    for name in PATH_FUNCTIONS + OPTIONAL_PATH_FUNCTIONS + DESCRIPTOR_FUNCTIONS:
        real = getattr(module, name, None)
        if real is None:
            continue
        gated = _gated(real, gate, name)
        for capabilities in (getattr(module, c, set[Callable[..., Any]]()) for c in CAPABILITY_SETS):
            if real in capabilities:
                capabilities.add(gated)
        setattr(module, name, gated)


def _absent(target: Any) -> OSError:
    """What a hidden path or descriptor raises: not found, or a bad descriptor."""
    if isinstance(target, int):
        return OSError(errno.EBADF, os.strerror(errno.EBADF))
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))


def _gated(real: Callable[..., Any], gate: Gate, name: str) -> Callable[..., Any]:
    keyword = "fd" if name in DESCRIPTOR_FUNCTIONS else "path"
    optional = name in OPTIONAL_PATH_FUNCTIONS
    answers = name in ABSENT_ANSWERS
    answer = ABSENT_ANSWERS.get(name)

    def gated(*args: Any, **kwargs: Any) -> Any:
        if args and not (optional and args[0] is None):
            target, rest = args[0], args[1:]
        elif kwargs.get(keyword) is not None:
            target, rest = kwargs.pop(keyword), ()
        elif optional:  # the current directory, as the real function would take it
            if gate(".", kwargs.get("dir_fd")) is None:
                raise _absent(".")
            return real(*args, **kwargs)
        else:  # the path is missing: the real function says so
            return real(*args, **kwargs)
        passed = gate(target, kwargs.get("dir_fd"))
        if passed is None:
            if answers:
                return answer
            raise _absent(target)
        return real(passed, *rest, **kwargs)

    gated.__name__ = gated.__qualname__ = real.__name__
    gated.__doc__ = real.__doc__
    return gated
