"""Errors raised while reading or validating a bundle: each names the file, the place and the problem."""

from __future__ import annotations

from dataclasses import dataclass

from worldsmith.errors import WorldsmithError


@dataclass(frozen=True)
class BundleIssue:
    """One defect of a bundle: `file`, an optional `line` (1-based) and what is wrong."""

    file: str
    problem: str
    line: int | None = None
    statement: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        text = f"{where}: {self.problem}"
        if self.statement:
            text += f"\n    in: {self.statement}"
        return text


class BundleError(WorldsmithError, ValueError):
    """A bundle that cannot be used; `issues` lists every defect found."""

    def __init__(self, issues: list[BundleIssue]):
        self.issues = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues) or "invalid bundle")

    @classmethod
    def single(cls, file: str, problem: str, line: int | None = None, statement: str | None = None) -> BundleError:
        return cls([BundleIssue(file=file, problem=problem, line=line, statement=statement)])
