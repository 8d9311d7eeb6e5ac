"""What the guard's audit hook refuses while generated code runs. Stdlib only.

Data, read by `guard.Guard._audit`: in workers of stdlib environments, audit events by prefix
(`DENIED_EVENT_PREFIXES`), imports of modules that reach out of the process or into the interpreter
(`DENIED_IMPORTS`) and changes of attributes that rebind code or classes (`SENSITIVE_SETATTR`); in
workers of ASGI environments, whose web stack runs in the same window, only what reaches out of the
worker or changes files (`FRAMEWORK_DENIED_PREFIXES`). `limit_for` names the limit a refused event
is reported under.
"""

from __future__ import annotations

#: Audit events refused while generated code runs (workers of stdlib environments), by prefix.
DENIED_EVENT_PREFIXES = (
    "os.",
    "subprocess.",
    "socket.",
    "ctypes.",
    "sys.",
    "cpython.",
    "gc.",
    "marshal.",
    "pickle.",
    "shutil.",
    "tempfile.",
    "glob.",
    "mmap.",
    "fcntl.",
    "resource.",
    "signal.",
    "syslog.",
    "urllib.",
    "http.",
    "ftplib.",
    "smtplib.",
    "imaplib.",
    "poplib.",
    "nntplib.",
    "telnetlib.",
    "webbrowser.",
    "pty.",
    "sqlite3.",
    "builtins.input",
    "builtins.breakpoint",
    "code.__new__",
    "function.__new__",
    "setopencodehook",
)
#: The limit a refused event is reported under, by prefix (the first that matches; else `limit_for`'s default).
EVENT_LIMITS = {
    "socket.": "network",
    "subprocess.": "subprocess",
    "os.system": "subprocess",
    "os.exec": "subprocess",
    "os.posix_spawn": "subprocess",
    "os.spawn": "subprocess",
    "os.fork": "process",
    "os.forkpty": "process",
    "ctypes.": "native_code",
    "sqlite3.": "database",
}
#: Top-level modules whose import (the audit hook's `import` event) is refused, whoever imports them.
DENIED_IMPORTS = frozenset(
    {
        "ctypes",
        "_ctypes",
        "subprocess",
        "_posixsubprocess",
        "socket",
        "_socket",
        "ssl",
        "_ssl",
        "select",
        "selectors",
        "multiprocessing",
        "_multiprocessing",
        "mmap",
        "pty",
        "fcntl",
        "resource",
        "signal",
        "_signal",
        "gc",
        "importlib",
        "_imp",
        "builtins",
        "inspect",
        "code",
        "codeop",
        "marshal",
        "pickle",
        "_pickle",
        "shutil",
        "tempfile",
        "threading",
        "_thread",
        "asyncio",
        "urllib",
        "http",
        "posix",
        "os",
        "pwd",  # the host's users (e.g. `os.path.expanduser('~root')`), read by libc without an audit event
        "grp",
    }
)
# In workers of ASGI environments the web stack runs inside the same window as the app's code and
# needs introspection, os and sys; there the hook refuses only what reaches out of the worker or
# changes files (the kernel layers stay the boundary either way).
FRAMEWORK_DENIED_PREFIXES = (
    "socket.",
    "subprocess.",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    "os.remove",
    "os.unlink",
    "os.rename",
    "os.rmdir",
    "os.mkdir",
    "os.chmod",
    "os.chown",
    "os.truncate",
    "os.link",
    "os.symlink",
    "os.putenv",
    "os.unsetenv",
    "ctypes.",
    "pty.",
    "webbrowser.",
    "urllib.Request",
    "http.client.",
    "ftplib.",
    "smtplib.",
    "imaplib.",
    "poplib.",
    "nntplib.",
    "telnetlib.",
    "shutil.",
    "sqlite3.connect",
    "sys.addaudithook",
    "sys.settrace",
    "sys.setprofile",
    "setopencodehook",
    "builtins.input",
    "builtins.breakpoint",
)
#: Attributes whose change (object.__setattr__ / __delattr__ events) is refused: they rebind code or classes.
SENSITIVE_SETATTR = frozenset(
    {
        "__code__",
        "__globals__",
        "__closure__",
        "__defaults__",
        "__kwdefaults__",
        "__builtins__",
        "__class__",
        "__bases__",
        "__dict__",
        "__getattribute__",
    }
)


def limit_for(event: str) -> str:
    """The limit a refused audit event is reported under (`EVENT_LIMITS`, else "forbidden_operation")."""
    for prefix, limit in EVENT_LIMITS.items():
        if event.startswith(prefix):
            return limit
    return "forbidden_operation"
