"""How a run ended (or that it has not): the status every run kind records in the catalog, and the
kinds of run that record theirs in the catalog's `run_records` table (`RunRecord`)."""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """A run's status. `running` while its process works; `completed`, `failed` (its error recorded) or
    `cancelled` (stopped by Ctrl-C or SIGTERM) once it ended; `crashed`: its process died without
    recording an end (killed, out of memory), told by the `on_crashed` hook or, for a run of this host,
    by its recorded process being gone (worldsmith/storage/run_owner.py)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CRASHED = "crashed"

    @property
    def ended(self) -> bool:
        return self is not RunStatus.RUNNING


class RunKind(StrEnum):
    """What a run did: the flow that made it (a training run's `config.kind` tells its three kinds apart), the
    choices of `runs ls --kind`. A `RunRecord` stands for the runs of a kind with no run table of its own
    (generation, curation), and for evaluation or training runs (GRPO, co-training, world model) refused
    before they opened theirs (an endpoint that does not answer, a set or a transitions file with nothing
    to train on)."""

    GENERATE = "generate"
    CURATE = "curate"
    EVALUATE = "evaluate"
    TRAIN = "train"
    COTRAIN = "cotrain"
    WORLD_MODEL = "world-model"
