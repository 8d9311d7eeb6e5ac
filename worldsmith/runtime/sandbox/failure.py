"""`Failure`: how the worker's code says an operation did not succeed. Stdlib only.

Raised anywhere below a request (running generated code, an operation, a forked process's reply);
the request loop (`worker.Worker.handle`) turns it into the reply's `status`, `error` and `limit`.
"""

from __future__ import annotations

from worldsmith.runtime.sandbox.messages import Status


class Failure(Exception):
    """An operation's outcome that is not a success: becomes the reply's status/error/limit."""

    def __init__(self, status: Status, error: str, limit: str | None = None, refused_module: str | None = None):
        super().__init__(error)
        self.status, self.error, self.limit, self.refused_module = status, error, limit, refused_module
