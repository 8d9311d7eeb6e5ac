"""How a generator call can fail. Stdlib only."""

from __future__ import annotations


class GenerationFault(Exception):
    """A generator call that produced nothing usable. `kind` names why; `text` is the raw output
    (if any), fed back to the model in the next attempt of the stage's repair loop."""

    kind = "fault"

    def __init__(self, message: str, *, text: str = ""):
        super().__init__(message)
        self.text = text


class OutputFault(GenerationFault):
    """The model answered, but not with what was asked: bad JSON, truncated, schema violation."""

    kind = "output"


class TransientFault(GenerationFault):
    """The endpoint failed (429, 5xx, timeout, connection) and kept failing through the retries."""

    kind = "transient"
