"""`worldsmith data ...`: datasets from evaluation trajectories (SFT conversations, world-model transitions)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from worldsmith.agent.datasets import DatasetRow, sft_rows, transition_rows, turn_rows, write_rows
from worldsmith.agent.trajectories import read_jsonl
from worldsmith.cli.console import failure, say

app = typer.Typer(
    help="Datasets from evaluation trajectories: SFT conversations and world-model transitions.", no_args_is_help=True
)


def _write_dataset(rows: Sequence[DatasetRow], out: Path, name: str, empty: str, what: str) -> None:
    """Write `rows` as OUT/NAME.jsonl and .parquet and report them; exit 2 with `empty` when there are none."""
    if not rows:
        raise failure(f"{empty}: nothing to write")
    paths = write_rows(rows, out, name)
    say(f"{len(rows)} {what}: {paths['jsonl']}, {paths['parquet']}")


@app.command("sft")
def data_sft(
    trajectories: Annotated[Path, typer.Argument(help="trajectories.jsonl of an evaluation run.")],
    out: Annotated[Path, typer.Argument(help="Directory to write sft.jsonl and sft.parquet into.")],
    per_turn: Annotated[
        bool, typer.Option(help="One prompt/completion row per assistant turn instead of one conversation per episode.")
    ] = False,
    window: Annotated[
        int | None, typer.Option(help="Per-turn rows: history window of the prompt (default: full history).")
    ] = None,
) -> None:
    """Successful trajectories as chat-format SFT data (TRL SFTTrainer format)."""
    loaded = read_jsonl(trajectories)
    rows = turn_rows(loaded, window) if per_turn else sft_rows(loaded)
    _write_dataset(
        rows, out, "sft", f"no complete trajectory in {trajectories}", f"rows from {len(loaded)} trajectories"
    )


@app.command("transitions")
def data_transitions(
    trajectories: Annotated[Path, typer.Argument(help="trajectories.jsonl of an evaluation run.")],
    out: Annotated[Path, typer.Argument(help="Directory to write transitions.jsonl and transitions.parquet into.")],
) -> None:
    """Every tool call as a world-model transition: state, action, observation, database diff."""
    loaded = read_jsonl(trajectories)
    _write_dataset(
        transition_rows(loaded),
        out,
        "transitions",
        f"no tool call in {trajectories}",
        f"transitions from {len(loaded)} trajectories",
    )
