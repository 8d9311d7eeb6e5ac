"""Failures a user can fix: their message is the one line that names the fix, printed as it is by the
CLI's one handler (cli/console.AnsweringGroup through runtime/answers.answer) with `exit_code`:
2 for a bad setting or input, 1 for a failure of something the run depends on. Stdlib only."""

from __future__ import annotations

from worldsmith.errors import WorldsmithError


class UserFixable(WorldsmithError):
    """An expected failure whose message states its own fix; `exit_code` 2 (bad input) or 1 (a failure)."""

    exit_code: int = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
