"""The trainer callback that ends training at a stop request (Ctrl-C or SIGTERM), at a step boundary.
It needs nothing of the orchestration stack (no catalog, no store), so the warm-up and the device kit's
training use it too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback


class StopWhenRequested(TrainerCallback):
    """Ends training at the next step boundary once `requested()` is true (a stop request: Ctrl-C or
    SIGTERM, worldsmith/flows/interruption.py): the step in flight finishes, its metrics and any
    checkpoint it saves are kept, no further step starts. One process only: launched processes are
    stopped by their launcher (training/launch.py), never asked to agree on a step."""

    def __init__(self, requested: Callable[[], bool]):
        self.requested = requested

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.requested():
            control.should_training_stop = True
