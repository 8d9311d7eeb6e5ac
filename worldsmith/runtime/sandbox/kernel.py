"""Kernel-enforced confinement of a sandbox worker. Stdlib only (ctypes for the syscalls).

`confine` runs once in a fresh worker, after the modules generated code may use are loaded
and before any generated code runs. Each layer is applied if the kernel allows it and
reported as "on" or "off: <reason>"; see docs/security.md for what each one stops.

Order: network and IPC namespaces -> resource limits -> no_new_privs -> Landlock (filesystem, TCP,
signals) -> drop to an unprivileged uid/gid -> seccomp (syscall deny list).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import resource
import stat
import struct
from collections.abc import Callable, Sequence

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWIPC = 0x08000000

SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1

# Landlock filesystem rights by ABI version that introduced them.
_FS_RIGHTS = {1: (1 << 13) - 1, 2: 1 << 13, 3: 1 << 14, 5: 1 << 15}
FS_READ = (1 << 2) | (1 << 3)  # READ_FILE | READ_DIR


def _fail(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def new_network_namespace() -> None:
    """Move into an empty network namespace (only a downed loopback): no route anywhere."""
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
    if _libc.unshare(flags) != 0:
        raise _fail("unshare")


def new_ipc_namespace() -> None:
    """Move into an empty IPC namespace: SysV shared memory, message queues and semaphores and POSIX
    message queues made here are invisible to every other process and vanish with the worker."""
    if _libc.unshare(CLONE_NEWIPC) == 0:  # root, or already owning a new user namespace (see above)
        return
    if os.geteuid() == 0 or _libc.unshare(CLONE_NEWUSER | CLONE_NEWIPC) != 0:
        raise _fail("unshare")


#: Descriptors a process running generated code may hold (a zygote holds two more per kept process).
OPEN_FILES = 64


def set_limits(memory_bytes: int, file_bytes: int, cpu_seconds: int, open_files: int = OPEN_FILES) -> None:
    """Address space, file size, lifetime CPU, open files and core dumps; soft = hard so they cannot be lifted."""
    for limit, value in (
        (resource.RLIMIT_AS, memory_bytes),
        (resource.RLIMIT_FSIZE, file_bytes),
        (resource.RLIMIT_CPU, cpu_seconds),
        (resource.RLIMIT_NOFILE, open_files),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))


def no_new_privs() -> None:
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _fail("prctl(NO_NEW_PRIVS)")


def die_with_parent() -> None:
    """SIGKILL this process when the process that forked it ends (a zygote's children go with it)."""
    if _libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0) != 0:
        raise _fail("prctl(PDEATHSIG)")


def drop_privileges(uid: int, gid: int) -> None:
    """Become `uid`/`gid` with no supplementary groups and no capabilities; then forbid new processes."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError(errno.EPERM, "privilege drop did not take")


def forbid_processes() -> None:
    """RLIMIT_NPROC 0: this (unprivileged) process can create no process or thread."""
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))


def landlock_abi() -> int:
    abi: int = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 0:
        raise _fail("landlock")
    return abi


def landlock(read_paths: list[str], write_paths: list[str], *, read_fds: Sequence[int] = ()) -> int:
    """Allow only reading `read_paths` (and the files or directories open as `read_fds`) and full
    access to `write_paths`; no TCP bind/connect, no signals or abstract sockets outside this process
    (by ABI). Returns the ABI used."""
    abi = landlock_abi()
    fs = sum(bits for version, bits in _FS_RIGHTS.items() if version <= abi)
    net = 0b11 if abi >= 4 else 0
    scoped = 0b11 if abi >= 6 else 0
    attr = struct.pack("=QQQ", fs, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buf, len(attr), 0)
    if ruleset < 0:
        raise _fail("landlock_create_ruleset")
    try:
        for fd in read_fds:
            _allow(ruleset, fd, FS_READ, str(fd))
        for paths, rights in ((read_paths, FS_READ), (write_paths, fs)):
            for path in paths:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                try:
                    _allow(ruleset, fd, rights, path)
                finally:
                    os.close(fd)
        if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise _fail("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


def _allow(ruleset: int, fd: int, rights: int, what: str) -> None:
    """Add a rule granting `rights` beneath the file or directory open as `fd` (files: file rights only)."""
    is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
    rule = ctypes.create_string_buffer(struct.pack("=Qi", rights if is_dir else rights & 0b111, fd), 12)
    if _libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, rule, 0) != 0:
        raise _fail(f"landlock_add_rule({what})")


# --- seccomp ------------------------------------------------------------------------------

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Syscalls a worker never needs: networking, process creation, exec, tracing, namespaces,
# mounts, identity and limit changes, kernel modules, signalling other processes, SysV IPC and
# POSIX message queues (objects that outlive the process and join workers), and watching the file
# system (inotify, fanotify: what other episodes' processes make and open, by name).
_DENIED = {
    "x86_64": {
        "socket": 41,
        "connect": 42,
        "accept": 43,
        "bind": 49,
        "listen": 50,
        "socketpair": 53,
        "accept4": 288,
        "clone": 56,
        "fork": 57,
        "vfork": 58,
        "execve": 59,
        "execveat": 322,
        "kill": 62,
        "tkill": 200,
        "tgkill": 234,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "mount": 165,
        "umount2": 166,
        "unshare": 272,
        "setns": 308,
        "chroot": 161,
        "pivot_root": 155,
        "setuid": 105,
        "setgid": 106,
        "setreuid": 113,
        "setregid": 114,
        "setresuid": 117,
        "setresgid": 119,
        "setgroups": 116,
        "setrlimit": 160,
        "prlimit64": 302,
        "bpf": 321,
        "perf_event_open": 298,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "io_uring_setup": 425,
        "userfaultfd": 323,
        "kexec_load": 246,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "personality": 135,
        "shmget": 29,
        "shmat": 30,
        "shmctl": 31,
        "semget": 64,
        "semop": 65,
        "semctl": 66,
        "msgget": 68,
        "msgsnd": 69,
        "msgrcv": 70,
        "msgctl": 71,
        "semtimedop": 220,
        "mq_open": 240,
        "mq_unlink": 241,
        "mq_timedsend": 242,
        "mq_timedreceive": 243,
        "mq_notify": 244,
        "mq_getsetattr": 245,
        "inotify_init": 253,
        "inotify_init1": 294,
        "inotify_add_watch": 254,
        "fanotify_init": 300,
        "fanotify_mark": 301,
    },
    "aarch64": {
        "socket": 198,
        "socketpair": 199,
        "bind": 200,
        "listen": 201,
        "accept": 202,
        "connect": 203,
        "accept4": 242,
        "clone": 220,
        "execve": 221,
        "execveat": 281,
        "kill": 129,
        "tkill": 130,
        "tgkill": 131,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "mount": 40,
        "umount2": 39,
        "unshare": 97,
        "setns": 268,
        "chroot": 51,
        "pivot_root": 41,
        "setuid": 146,
        "setgid": 144,
        "setreuid": 145,
        "setregid": 143,
        "setresuid": 147,
        "setresgid": 149,
        "setgroups": 159,
        "setrlimit": 164,
        "prlimit64": 261,
        "bpf": 280,
        "perf_event_open": 241,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "io_uring_setup": 425,
        "userfaultfd": 282,
        "kexec_load": 104,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "personality": 92,
        "mq_open": 180,
        "mq_unlink": 181,
        "mq_timedsend": 182,
        "mq_timedreceive": 183,
        "mq_notify": 184,
        "mq_getsetattr": 185,
        "msgget": 186,
        "msgctl": 187,
        "msgrcv": 188,
        "msgsnd": 189,
        "semget": 190,
        "semctl": 191,
        "semtimedop": 192,
        "semop": 193,
        "shmget": 194,
        "shmctl": 195,
        "shmat": 196,
        "inotify_init1": 26,
        "inotify_add_watch": 27,
        "fanotify_init": 262,
        "fanotify_mark": 263,
    },
}
_CLONE3 = 435  # same number on both: answered ENOSYS so libc falls back to (denied) clone

_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


#: What a strict-isolation worker (the zygote, which never runs generated code itself) keeps of the
#: deny list: it forks one confined process per run of generated code, and kills it if it overruns.
ZYGOTE_ALLOWED = frozenset({"clone", "fork", "vfork", "kill", "tkill", "tgkill", "setrlimit", "prlimit64"})


def seccomp_program(machine: str, allowed: frozenset[str] = frozenset()) -> list[tuple[int, int, int, int]]:
    """The BPF program: kill on a foreign architecture, EPERM for denied syscalls but `allowed`,
    allow the rest."""
    arch = _AUDIT_ARCH[machine]
    denied = sorted(number for name, number in _DENIED[machine].items() if name not in allowed)
    prog = [
        (_BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (_BPF_JEQ_K, 1, 0, arch),
        (_BPF_RET_K, 0, 0, _RET_KILL_PROCESS),
        (_BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":  # x32 ABI numbers carry bit 30
        prog += [(_BPF_JGE_K, 0, 1, 0x40000000), (_BPF_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)]
    prog += [(_BPF_JEQ_K, 0, 1, _CLONE3), (_BPF_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS)]
    for number in denied:
        prog += [(_BPF_JEQ_K, 0, 1, number), (_BPF_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)]
    prog.append((_BPF_RET_K, 0, 0, _RET_ALLOW))
    return prog


@functools.cache
def _compiled_filter(machine: str, allowed: frozenset[str]) -> _SockFprog:
    """The BPF program as the kernel takes it, built once per process (forked ones inherit it)."""
    prog = seccomp_program(machine, allowed)
    filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), filters)
    fprog._keep = filters  # the program's memory lives as long as fprog
    return fprog


def seccomp(allowed: frozenset[str] = frozenset()) -> int:
    """Install the syscall filter (needs no_new_privs); filters stack, so a process can only add
    denials to what it inherited. Returns how many syscalls it denies."""
    machine = platform.machine()
    if machine not in _AUDIT_ARCH:
        raise OSError(errno.ENOSYS, f"no seccomp table for {machine}")
    fprog = _compiled_filter(machine, allowed)
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise _fail("prctl(SECCOMP)")
    return len(_DENIED[machine]) - len(allowed & _DENIED[machine].keys())


_BPF_JSET_K = 0x45
_CLONE_VM, _CLONE_VFORK, _CLONE_THREAD = 0x100, 0x4000, 0x10000


def thread_filter_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The BPF program of `forbid_threads`: EPERM for a `clone` sharing the caller's memory
    (CLONE_THREAD, CLONE_VM, CLONE_VFORK) and for `vfork`, ENOSYS for `clone3` (libc falls back to
    clone); a plain fork and everything else allowed (the filters below it still apply)."""
    clone, vfork = _DENIED[machine]["clone"], _DENIED[machine].get("vfork")  # aarch64 has no vfork
    prog = [
        (_BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (_BPF_JEQ_K, 1, 0, _AUDIT_ARCH[machine]),
        (_BPF_RET_K, 0, 0, _RET_KILL_PROCESS),
        (_BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    prog += [(_BPF_JEQ_K, 0, 1, _CLONE3), (_BPF_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS)]  # its flags are not readable
    if vfork is not None:
        prog += [(_BPF_JEQ_K, 0, 1, vfork), (_BPF_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)]
    prog += [
        (_BPF_JEQ_K, 0, 3, clone),
        (_BPF_LD_W_ABS, 0, 0, 16),  # seccomp_data.args[0], its low word: clone's flags on both machines
        (_BPF_JSET_K, 0, 1, _CLONE_THREAD | _CLONE_VM | _CLONE_VFORK),
        (_BPF_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
        (_BPF_RET_K, 0, 0, _RET_ALLOW),
    ]
    return prog


def forbid_threads() -> None:
    """No thread, no process sharing this one's memory, from now on in this process and all it forks
    (a seccomp filter on clone's flags): the template (`template.py`) installs it before it runs an
    app's code, so nothing that code started can outlive the run there. OSError without seccomp."""
    machine = platform.machine()
    if machine not in _AUDIT_ARCH:
        raise OSError(errno.ENOSYS, f"no seccomp table for {machine}")
    prog = thread_filter_program(machine)
    filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), filters)
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise _fail("prctl(SECCOMP)")


def _attempt(layers: dict[str, str], name: str, action: Callable[[], object]) -> None:
    """Apply one layer, recording "on (detail)" or "off: reason" under `name`."""
    try:
        detail = action()
        layers[name] = "on" + (f" ({detail})" if detail else "")
    except OSError as exc:
        layers[name] = f"off: {exc}"


def confine(
    *,
    uid: int,
    memory_bytes: int,
    file_bytes: int,
    cpu_seconds: int,
    read_paths: list[str],
    write_paths: list[str],
    zygote: bool = False,
    open_files: int = OPEN_FILES,
) -> dict[str, str]:
    """Apply every layer the kernel allows; returns {layer: "on ..." | "off: reason"}. A `zygote`
    (strict isolation) keeps fork and kill (ZYGOTE_ALLOWED): its children take the rest with
    `confine_run` before any generated code runs in them."""
    layers: dict[str, str] = {}

    def attempt(name: str, action: Callable[[], object]) -> None:
        _attempt(layers, name, action)

    attempt("netns", new_network_namespace)
    attempt("ipcns", new_ipc_namespace)
    attempt("rlimits", lambda: set_limits(memory_bytes, file_bytes, cpu_seconds, open_files))
    attempt("no_new_privs", no_new_privs)
    # Landlock before the uid drop: the rules' paths are opened with the starting user's rights.
    attempt("landlock", lambda: f"ABI {landlock(read_paths, write_paths)}")
    if zygote:
        prepare_run(read_paths)
    if os.geteuid() == 0:

        def unprivileged() -> str:
            drop_privileges(uid, uid)
            return f"uid {uid}"

        attempt("unprivileged_uid", unprivileged)
    else:
        layers["unprivileged_uid"] = f"on (started as uid {os.geteuid()})"
    if zygote:
        layers["no_processes"] = "on (in each run's process; the zygote forks them)"
    elif os.geteuid() != 0:
        attempt("no_processes", forbid_processes)
    else:
        layers["no_processes"] = "off: still root"
    allowed = ZYGOTE_ALLOWED if zygote else frozenset()
    attempt("seccomp", lambda: f"{seccomp(allowed)} syscalls denied" + (" to the zygote" if zygote else ""))
    return layers


#: A zygote's read paths, opened before it dropped privileges (its children, unprivileged, may not be
#: able to open them again) and kept open for the Landlock rules of `confine_run`.
RUN_READ_FDS: list[int] = []


def prepare_run(read_paths: list[str]) -> None:
    """In a zygote, before its privileges drop: what `confine_run` needs, prepared once (the read
    paths opened, the seccomp program built), so forked processes only install it."""
    RUN_READ_FDS[:] = [os.open(path, os.O_PATH | os.O_CLOEXEC) for path in read_paths]
    if platform.machine() in _AUDIT_ARCH:
        _compiled_filter(platform.machine(), frozenset())


def confine_run(write_paths: list[str]) -> dict[str, str]:
    """The layers a process forked from a zygote adds before generated code runs in it: Landlock
    narrowed to reading the zygote's read paths (`prepare_run`) and full access to `write_paths`
    (its episode's directory), no new processes, and the whole seccomp deny list (stacked on the
    zygote's)."""
    layers: dict[str, str] = {}
    _attempt(layers, "open_files", lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES)))
    _attempt(layers, "landlock", lambda: f"ABI {landlock([], write_paths, read_fds=RUN_READ_FDS)}")
    if os.geteuid() != 0:
        _attempt(layers, "no_processes", forbid_processes)
    _attempt(layers, "seccomp", lambda: f"{seccomp()} syscalls denied")
    return layers
