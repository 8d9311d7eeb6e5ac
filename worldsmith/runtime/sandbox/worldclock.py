"""The world's clock: what the clock reads of generated code answer in a sandbox worker. Stdlib only.

A world's manifest fixes its "now" (`Manifest.clock`, ISO, UTC). While a worker serves a request of
an environment with a clock (`set_clock`), every clock read of its code answers that instant:
- tools and verifiers in stdlib workers: the `datetime` and `time` that `import` gives them (module
  views, worldsmith/runtime/sandbox/moduleview.py; `VIEW_OVERRIDES`): `datetime.now()`, `utcnow()`,
  `today()`, `date.today()`, `time.time()`, `time.time_ns()`, and `localtime()`, `gmtime()`,
  `ctime()`, `asctime()`, `strftime(fmt)` without a time argument; `worldsmith.runtime.now()`;
- apps (worldsmith/bundle/asgiapp.py rewrites their clock reads to `app_clock`);
- SQL on the worker's connections to episode databases (`bind_sql`): SQLite's date and time functions
  with 'now' or no time value (`datetime('now')`, `date()`, `strftime('%s', 'now')`, `julianday('now')`,
  `unixepoch()`...) and `CURRENT_TIMESTAMP`, `CURRENT_DATE`, `CURRENT_TIME` (SQLite resolves those
  keywords as functions too): application-defined functions of the same names, which override the
  built-ins on that connection and delegate to them with the instant in place of 'now'.
The world's time zone is UTC: naive datetimes are UTC (workers also run with TZ=UTC0).

The real time still reaches code through clocks that are not the time of day (`time.monotonic`,
`perf_counter`, `process_time`, `thread_time`, `clock_gettime` of those clocks) and, in a world
without an instant, through every read. Those are shifted by the request's skew (`set_clock`; 0 but
in the determinism probe, worldsmith/quality/probes.py), so a world whose results depend on them
replays differently under the probe (SQL's 'now' in a world without an instant too: its episode
connections read the shifted real time when made for a request with a skew). Reads this module cannot reach: `uuid.uuid1()` (its
nanoseconds differ between any two replays anyway) and the real classes' methods reached through an
instance (`datetime.now().now()`).
"""

from __future__ import annotations

import calendar
import datetime as _dt
import functools
import sqlite3
import time as _time
from collections.abc import Callable
from typing import Any

from worldsmith.runtime.sandbox.moduleview import refuse_change


class _State:
    """The clock of the request at hand: the world's instant (naive UTC) or None, and the skew."""

    instant: _dt.datetime | None = None
    epoch: float = 0.0  # the instant in seconds since the epoch
    skew_s: float = 0.0


_STATE = _State()


def parse_instant(text: str) -> _dt.datetime:
    """A manifest's clock (ISO; naive means UTC) as a naive UTC datetime. ValueError if it is not ISO."""
    instant = _dt.datetime.fromisoformat(text)
    if instant.tzinfo is not None:
        instant = instant.astimezone(_dt.UTC).replace(tzinfo=None)
    return instant


@functools.lru_cache(maxsize=64)
def _parsed(text: str) -> tuple[_dt.datetime, float]:
    instant = parse_instant(text)
    return instant, calendar.timegm(instant.timetuple()) + instant.microsecond / 1e6


def set_clock(instant: str | None, skew_s: float = 0.0) -> None:
    """The clock of the request the worker serves next: the world's instant (ISO; None: the real
    time) and the skew of every real-time source (seconds)."""
    _STATE.instant, _STATE.epoch = _parsed(instant) if instant else (None, 0.0)
    _STATE.skew_s = float(skew_s)


# -- Python ---------------------------------------------------------------------------------------


def world_now(tz: _dt.tzinfo | None = None) -> _dt.datetime:
    """The world's now: naive UTC (or in `tz`); without an instant, the real time shifted by the skew."""
    instant = _STATE.instant
    if instant is None:
        return _dt.datetime.now(tz) + _dt.timedelta(seconds=_STATE.skew_s)
    return instant if tz is None else instant.replace(tzinfo=_dt.UTC).astimezone(tz)


def now() -> _dt.datetime:
    """The world's current instant as a naive datetime in UTC: what `datetime.datetime.now()` answers
    inside the sandbox. Outside it (no world's clock set), the real local time."""
    return world_now()


def app_clock(which: str, tz: Any = None) -> Any:
    """What an app's rewritten clock read answers (worldsmith/bundle/asgiapp.py): `which` is
    "datetime.now", "datetime.utcnow", "datetime.today" or "date.today"."""
    value = world_now(tz if which == "datetime.now" else None)
    return value.date() if which == "date.today" else value


_REAL: list[tuple[type, type]] = []  # (a view's class, the real class it stands for), compared by identity


def _real_of(cls: type) -> type | None:
    for view_class, real in _REAL:
        if view_class is cls:
            return real
    return None


class _ClockClass(type):
    """Metaclass of the views' `datetime.datetime` and `datetime.date`: making one, `isinstance`,
    `issubclass`, `==` and `hash` answer as for the real class (values are real datetimes); the
    classes themselves are read-only. Classes generated code derives from them behave as usual."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        real = _real_of(cls)
        return real(*args, **kwargs) if real is not None else super().__call__(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        real = _real_of(cls)
        return isinstance(obj, real) if real is not None else super().__instancecheck__(obj)

    def __subclasscheck__(cls, subclass: type) -> bool:
        real = _real_of(cls)
        if real is not None:
            return isinstance(subclass, type) and issubclass(subclass, real)
        return super().__subclasscheck__(subclass)

    def __eq__(cls, other: object) -> bool:
        return other is cls or (other is not None and other is _real_of(cls))

    def __hash__(cls) -> int:
        return type.__hash__(_real_of(cls) or cls)

    def __setattr__(cls, name: str, value: Any) -> None:
        if _real_of(cls) is not None:
            refuse_change(f"modified module state: datetime.{cls.__name__}.{name} (the world's clock is read-only)")
        super().__setattr__(name, value)

    def __delattr__(cls, name: str) -> None:
        if _real_of(cls) is not None:
            refuse_change(f"modified module state: del datetime.{cls.__name__}.{name} (the world's clock is read-only)")
        super().__delattr__(name)


class WorldDatetime(_dt.datetime, metaclass=_ClockClass):
    """`datetime.datetime` as generated code imports it: its clock reads answer the world's now."""

    @classmethod
    def now(cls, tz: _dt.tzinfo | None = None) -> _dt.datetime:  # type: ignore[override]  # a real datetime, not a WorldDatetime
        return world_now(tz)

    @classmethod
    def utcnow(cls) -> _dt.datetime:  # type: ignore[override]  # a real datetime, not a WorldDatetime
        return world_now(_dt.UTC).replace(tzinfo=None)

    @classmethod
    def today(cls) -> _dt.datetime:  # type: ignore[override]  # a real datetime, not a WorldDatetime
        return world_now()


class WorldDate(_dt.date, metaclass=_ClockClass):
    """`datetime.date` as generated code imports it: `today()` is the world's date."""

    @classmethod
    def today(cls) -> _dt.date:  # type: ignore[override]  # a real date, not a WorldDate
        return world_now().date()


_REAL += [(WorldDatetime, _dt.datetime), (WorldDate, _dt.date)]
for _cls, _real in _REAL:
    type.__setattr__(_cls, "__name__", _real.__name__)
    type.__setattr__(_cls, "__qualname__", _real.__qualname__)
    type.__setattr__(_cls, "__module__", "datetime")


def time() -> float:
    """`time.time()`: the world's instant in seconds since the epoch."""
    return _STATE.epoch if _STATE.instant is not None else _time.time() + _STATE.skew_s


def time_ns() -> int:
    return round(_STATE.epoch * 1e9) if _STATE.instant is not None else _time.time_ns() + round(_STATE.skew_s * 1e9)


def gmtime(secs: float | None = None) -> _time.struct_time:
    return _time.gmtime(time() if secs is None else secs)


def localtime(secs: float | None = None) -> _time.struct_time:
    return _time.localtime(time() if secs is None else secs)


def ctime(secs: float | None = None) -> str:
    return _time.ctime(time() if secs is None else secs)


def asctime(t: Any = None) -> str:
    return _time.asctime(localtime() if t is None else t)


def strftime(format: str, t: Any = None) -> str:
    return _time.strftime(format, localtime() if t is None else t)


def _skewed(real: Callable[[], float]) -> Callable[[], float]:
    def read() -> float:
        return real() + _STATE.skew_s

    read.__name__ = read.__qualname__ = real.__name__
    return read


def _skewed_ns(real: Callable[[], int]) -> Callable[[], int]:
    def read() -> int:
        return real() + round(_STATE.skew_s * 1e9)

    read.__name__ = read.__qualname__ = real.__name__
    return read


#: Clocks of `clock_gettime` that tell the time of day: they answer the world's instant.
_TIME_OF_DAY = frozenset({_time.CLOCK_REALTIME, getattr(_time, "CLOCK_TAI", _time.CLOCK_REALTIME)})


def clock_gettime(clk_id: int) -> float:
    if clk_id in _TIME_OF_DAY:
        return time() + (_time.clock_gettime(clk_id) - _time.time())
    return _time.clock_gettime(clk_id) + _STATE.skew_s


def clock_gettime_ns(clk_id: int) -> int:
    return round(clock_gettime(clk_id) * 1e9)


#: What the views of `datetime` and `time` hold instead of the real attributes (see the module docstring).
VIEW_OVERRIDES: dict[str, dict[str, Any]] = {
    "datetime": {"datetime": WorldDatetime, "date": WorldDate},
    "time": {
        "time": time,
        "time_ns": time_ns,
        "gmtime": gmtime,
        "localtime": localtime,
        "ctime": ctime,
        "asctime": asctime,
        "strftime": strftime,
        "clock_gettime": clock_gettime,
        "clock_gettime_ns": clock_gettime_ns,
        **{
            name: _skewed(getattr(_time, name)) for name in ("monotonic", "perf_counter", "process_time", "thread_time")
        },
        **{
            f"{name}_ns": _skewed_ns(getattr(_time, f"{name}_ns"))
            for name in ("monotonic", "perf_counter", "process_time", "thread_time")
        },
    },
}


# -- SQL ------------------------------------------------------------------------------------------

#: SQLite's date and time functions, by name: the position of their time value ('now' when absent).
SQL_DATE_FUNCTIONS = {"date": 0, "time": 0, "datetime": 0, "julianday": 0, "unixepoch": 0, "strftime": 1}
#: The keywords SQLite reads as functions of no argument, and the built-in each equals at 'now'.
SQL_NOW_KEYWORDS = {"current_timestamp": "datetime", "current_date": "date", "current_time": "time"}

_BUILTINS: list[sqlite3.Connection] = []  # a private connection with the built-ins, made by `bind_sql`
_CACHED_ARGUMENT_CHARS = 64  # calls with longer text arguments are not remembered (bounded memory)


@functools.lru_cache(maxsize=8192)
def _cached_builtin(name: str, args: tuple[Any, ...]) -> Any:
    placeholders = ", ".join("?" * len(args))
    return _BUILTINS[0].execute(f"SELECT {name}({placeholders})", args).fetchone()[0]


def _builtin(name: str, args: tuple[Any, ...]) -> Any:
    """Built-in SQL function `name` on `args` (their time value no longer 'now'): a pure function,
    remembered for short arguments."""
    if all(not isinstance(a, (str, bytes)) or len(a) <= _CACHED_ARGUMENT_CHARS for a in args):
        return _cached_builtin(name, args)
    return _cached_builtin.__wrapped__(name, args)


@functools.cache
def _available_functions() -> tuple[str, ...]:
    """Those of SQL_DATE_FUNCTIONS this SQLite has (`unixepoch` is 3.38's)."""
    found = []
    for name in SQL_DATE_FUNCTIONS:
        try:
            _BUILTINS[0].execute(f"SELECT {name}('2000-01-01', '2000-01-01')")
        except sqlite3.OperationalError:
            continue
        found.append(name)
    return tuple(found)


def _sql_now() -> str:
    """'now' as SQL reads it: the world's instant (or the shifted real time), UTC, as SQLite writes times."""
    return world_now(_dt.UTC).replace(tzinfo=None).isoformat(" ")


def _sql_date_function(name: str, position: int) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        values = list(args)
        if len(values) == position:
            values.append(_sql_now())
        elif len(values) > position and isinstance(values[position], str) and values[position].lower() == "now":
            values[position] = _sql_now()
        return _builtin(name, tuple(values))

    return call


def _sql_keyword(builtin: str) -> Callable[[], Any]:
    return lambda: _builtin(builtin, (_sql_now(),))


def bind_sql(conn: sqlite3.Connection, clock: str | None) -> None:
    """Make `conn`'s SQL clock read the world's clock (see the module docstring): where the world has
    one (`clock`), or where the request at hand shifts the real time (the determinism probe); else
    `conn` keeps SQLite's own. Called by the worker, outside generated code, after `set_clock`, in the
    process that will use `conn`."""
    if not clock and not _STATE.skew_s:
        return
    if not _BUILTINS:
        _BUILTINS.append(sqlite3.connect(":memory:", check_same_thread=False))
    for name in _available_functions():
        function = _sql_date_function(name, SQL_DATE_FUNCTIONS[name])
        sqlite3.Connection.create_function(conn, name, -1, function, deterministic=True)
    for keyword, builtin in SQL_NOW_KEYWORDS.items():
        sqlite3.Connection.create_function(conn, keyword, 0, _sql_keyword(builtin), deterministic=True)
