"""Trajectories on disk (JSON lines and Parquet) and the scores of a batch of them."""

from __future__ import annotations

import json
from collections import defaultdict
from math import comb
from pathlib import Path

from worldsmith.agent.loop import Trajectory
from worldsmith.jsonvalue import JsonScalar
from worldsmith.models.evaluation import EvaluationScores
from worldsmith.models.jsonlines import read_models, write_models
from worldsmith.models.verdict import Verdict


def write_jsonl(trajectories: list[Trajectory], path: Path) -> Path:
    """One trajectory per line, every field included."""
    return write_models(trajectories, path)


def read_jsonl(path: Path) -> list[Trajectory]:
    return read_models(Trajectory, path, "a trajectory")


def write_parquet(trajectories: list[Trajectory], path: Path) -> Path:
    """A flat table: scalar fields as columns, structured ones (messages, steps, tools, evidence,
    turn records, judge) as JSON text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows: list[dict[str, JsonScalar]] = []  # one flat row per trajectory
    for t in trajectories:
        row = t.model_dump(mode="json")
        rows.append(
            {
                k: json.dumps(v) if isinstance(v, (dict, list)) or (v is None and k == "judge") else v
                for k, v in row.items()
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of a task with `c` complete out of `n` samples (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def scores(trajectories: list[Trajectory], k: int = 1) -> EvaluationScores:
    """pass@1, pass@k, mean reward and turns, env_error, agent_error and format_error rates; env_error
    episodes are excluded from pass rates and rewards (they count against the env)."""
    by_task: dict[tuple[str, str], list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_task[(t.env_id, t.task_id)].append(t)
    scored = [t for t in trajectories if t.verdict != Verdict.env_error]
    passes_1, passes_k = [], []
    for samples in by_task.values():
        valid = [t for t in samples if t.verdict != Verdict.env_error]
        if not valid:
            continue
        complete = sum(t.verdict == Verdict.complete for t in valid)
        passes_1.append(pass_at_k(len(valid), complete, 1))
        passes_k.append(pass_at_k(len(valid), complete, min(k, len(valid))))
    total = len(trajectories) or 1
    return EvaluationScores(
        episodes=len(trajectories),
        tasks=len(by_task),
        k=k,
        pass_at_1=sum(passes_1) / len(passes_1) if passes_1 else 0.0,
        pass_at_k=sum(passes_k) / len(passes_k) if passes_k else 0.0,
        mean_reward=sum(t.reward or 0.0 for t in scored) / len(scored) if scored else 0.0,
        mean_turns=sum(t.turns for t in trajectories) / total,
        env_error_rate=sum(t.verdict == Verdict.env_error for t in trajectories) / total,
        agent_error_rate=sum(t.verdict == Verdict.agent_error for t in trajectories) / total,
        format_error_rate=sum(t.verdict == Verdict.format_error for t in trajectories) / total,
    )
