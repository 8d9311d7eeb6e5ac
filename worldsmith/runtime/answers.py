"""What bad input (a hostile or malformed bundle, a missing file) can make the trusted process
raise, answered in one line: the CLI's one handler (`cli/console.AnsweringGroup`) and the MCP
gateway (`serving/gateway.py`) answer with it instead of a traceback."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from worldsmith.failures import UserFixable
from worldsmith.runtime.errors import RuntimeFault, WorkerLost

#: Errors of a place that cannot be written: a read-only file system or home, no permission, a full disk.
_UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})

#: The longest line an answered error prints (a validation error can quote a whole document).
MAX_ANSWER = 2000


def one_line(text: str) -> str:
    """`text` on one line (whitespace runs collapsed), cut at `MAX_ANSWER` characters."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_ANSWER else line[:MAX_ANSWER] + " ..."


#: What Prefect's RuntimeError says when the ephemeral API server a flow starts without PREFECT_API_URL is slow.
EPHEMERAL_PREFECT_TIMEOUT = "Timed out while attempting to connect to ephemeral Prefect API"


def answer(exc: BaseException) -> str | None:
    """The one line that answers `exc`, or None when it is not something bad input (a hostile bundle,
    a missing file) can cause."""
    if isinstance(exc, UserFixable):
        return str(exc)  # an expected failure that states its own fix (e.g. the catalog's CatalogUnavailable)
    if isinstance(exc, RecursionError):
        return f"too deeply nested to handle: {exc}"
    if isinstance(exc, MemoryError):
        return "out of memory" + (f": {exc}" if str(exc) else " while handling the request")
    if isinstance(exc, ValidationError):
        first: Mapping[str, Any] = exc.errors()[0] if exc.error_count() else {}
        where = ".".join(str(part) for part in first.get("loc", ())) or exc.title
        return f"invalid {exc.title}: {exc.error_count()} error(s), first at {where}: {first.get('msg', exc)}"
    if isinstance(exc, PydanticSerializationError):  # e.g. a result nested deeper than JSON output allows
        return f"cannot print the result: {exc}"
    if isinstance(exc, subprocess.TimeoutExpired):
        command = exc.cmd if isinstance(exc.cmd, str) else " ".join(map(str, exc.cmd or ()))
        return f"timed out after {exc.timeout} s: {command}"
    if isinstance(exc, WorkerLost):
        return f"sandbox worker lost: {exc.reason}"
    if isinstance(exc, RuntimeFault):
        return f"runtime refused: {exc}"
    if isinstance(exc, RuntimeError) and EPHEMERAL_PREFECT_TIMEOUT in str(exc):  # Prefect's own, on a busy machine
        return (
            "the temporary Prefect server this command starts did not answer in time (a busy machine): set "
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120, or start the local stack with `worldsmith up`"
        )
    if isinstance(exc, FileExistsError) and exc.filename:  # a directory to make where a file is
        return f"cannot write into {exc.filename}: it exists and is not a directory; name another path"
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError)) and exc.filename:
        return f"cannot use {exc.filename}: {exc.strerror}; check the path"
    if isinstance(exc, OSError) and exc.errno in _UNWRITABLE and exc.filename:
        return (
            f"cannot use {exc.filename}: {exc.strerror}; check the path and its permissions (a writable "
            "WORLDSMITH_HOME for the home)"
        )
    return None
