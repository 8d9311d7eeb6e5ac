"""The bundle-directory argument that commands share, and loading it (or refusing with the issues)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.errors import BundleError
from worldsmith.bundle.loader import load_bundle
from worldsmith.cli.console import bundle_failure

BundleArg = Annotated[Path, typer.Argument(help="Bundle directory.", exists=False)]


def load_bundle_arg(path: Path) -> Bundle:
    """The bundle at `path`; exit 2 with its issues when it is not a valid bundle."""
    try:
        return load_bundle(path)
    except BundleError as exc:
        raise bundle_failure(f"invalid bundle {path}", exc) from None
