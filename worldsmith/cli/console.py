"""Where the CLI prints, and its one error handler.

Tables, progress bars and status spinners go to stdout laid out at the terminal's width. Messages
(a line of output or an error) are printed as they are: never wrapped at the console width, so what
a user or a test reads does not depend on the terminal or on the length of a path in the message.
An error is its message on stderr and an exit status (2: the request was refused).

`AnsweringGroup` is the one place where what a hostile or malformed bundle can make a command raise
(too deep to handle, too big, data that does not validate, a step that timed out, the runtime
refusing it) becomes one line on stderr and exit 2 instead of a traceback, whichever command ran; so
does a fatal generation fault (the model endpoint refused the API key...), naming the setting, exit 1.
Those that state their own fix, raised inside a flow run the CLI started, are logged by Prefect's
engine with their traceback; `ExpectedFailures` keeps those records to their message.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from typer._click.core import Context  # typer vendors click: its Context, not the click package's
from typer._click.exceptions import UsageError  # typer vendors click and does not re-export this base
from typer.core import TyperGroup

from worldsmith.bundle.errors import BundleError
from worldsmith.failures import UserFixable
from worldsmith.llm.errors import GenerationFault
from worldsmith.runtime.answers import answer, one_line

console = Console()
errors = Console(stderr=True, soft_wrap=True)


def say(*objects: Any, highlight: bool | None = None) -> None:
    """Print a message on stdout as it is (rich markup applies; never wrapped at the console width)."""
    console.print(*objects, soft_wrap=True, highlight=highlight)


def failure(message: str, code: int = 2) -> typer.Exit:
    """Print `message` on stderr exactly (no markup, no wrapping) and return the exit to raise."""
    errors.print(message, markup=False, highlight=False)
    return typer.Exit(code)


def bundle_failure(title: str, exc: BundleError) -> typer.Exit:
    """A bundle that cannot be loaded or built: the title, each issue on its own line (one issue of the
    directory itself, on the title's line), exit 2."""
    if len(exc.issues) == 1 and title.endswith(f" {exc.issues[0].file}"):  # not there, not a bundle at all
        return failure(f"{title}: {exc.issues[0].problem}")
    errors.print(f"[bold red]{title}[/]")
    for issue in exc.issues:
        errors.print(f"  {issue}", markup=False, highlight=False)
    return typer.Exit(2)


@contextmanager
def refusals(*kinds: type[Exception]) -> Iterator[None]:
    """Turn an exception of `kinds` (default: a catalog refusal) into its message on stderr and exit 2."""
    if not kinds:
        from worldsmith.storage.publish import CatalogError  # the catalog loads with the commands that use it

        kinds = (CatalogError,)
    try:
        yield
    except kinds as exc:
        raise failure(str(exc)) from None


def _usage_failure(exc: UsageError, default_path: str) -> typer.Exit:
    """A usage error as one line naming the `--help` to read, exit 2."""
    where = exc.ctx.command_path if exc.ctx is not None else default_path
    return failure(one_line(f"{exc.format_message()} (see '{where} --help')"))


def states_its_fix(exc: BaseException) -> bool:
    """Whether `exc` is an expected failure whose message names the fix (UserFixable, a bundle's
    issues, a fatal generation fault), so its traceback tells a user nothing more."""
    return isinstance(exc, (UserFixable, BundleError)) or (isinstance(exc, GenerationFault) and exc.fatal)


class ExpectedFailures(logging.Filter):
    """On Prefect's flow- and task-run loggers (`quiet_expected_failures`): the record of a failure that
    states its fix (`states_its_fix`) keeps its message and loses its traceback, on the console and in
    the run's logs alike; any other exception (a bug, or bad input the CLI words itself) keeps it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and states_its_fix(exc):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_expected_failures() -> None:
    """Put `ExpectedFailures` on the loggers of the flow and task runs this process starts (once; it
    outlives Prefect's own logging set-up, which keeps loggers' filters)."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, ExpectedFailures) for f in logger.filters):
            logger.addFilter(ExpectedFailures())


class AnsweringGroup(TyperGroup):
    """The root command group: answers a `BundleError` with its issues, and a usage error (an unknown
    command, a bad or missing option) and the exceptions `answer` knows with one line, on stderr with
    exit 2, whichever command raised them; a fatal generation fault (run-wide: the endpoint's settings are
    wrong) with its one line naming the setting to fix, exit 1."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: Context | None = None, **extra: Any
    ) -> Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except UsageError as exc:  # raised while the root parses its own options (`worldsmith --bogus`)
            raise _usage_failure(exc, info_name or "worldsmith") from None

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:  # raised while a subcommand parses its arguments
            raise _usage_failure(exc, ctx.command_path) from None
        except BundleError as exc:
            raise bundle_failure("invalid bundle", exc) from None
        except GenerationFault as exc:
            if not exc.fatal:
                raise
            raise failure(one_line(str(exc)), code=1) from None
        except Exception as exc:  # `answer` decides; what it does not know propagates
            line = answer(exc)
            if line is None:
                raise
            raise failure(one_line(line), code=exc.exit_code if isinstance(exc, UserFixable) else 2) from None
