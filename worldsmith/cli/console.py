"""Where the CLI prints, and its one error handler.

Tables, progress bars and status spinners go to stdout laid out at the terminal's width. Messages
(a line of output or an error) are printed as they are: never wrapped at the console width, so what
a user or a test reads does not depend on the terminal or on the length of a path in the message.
An error is its message on stderr and an exit status (2: the request was refused).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console

from worldsmith.bundle.errors import BundleError

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
    """A bundle that cannot be loaded or built: the title, each issue on its own line, exit 2."""
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
