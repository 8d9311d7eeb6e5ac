"""Trajectory files and scores."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from worldsmith.agent.loop import EpisodeConfig, run_episode
from worldsmith.agent.policies import RandomPolicy, ReferencePolicy
from worldsmith.agent.trajectories import pass_at_k, read_jsonl, scores, write_jsonl, write_parquet

pytestmark = pytest.mark.sandbox


def test_files_round_trip(runtime, golden, tmp_path):
    trajectories = [run_episode(runtime, golden, task, ReferencePolicy()) for task in golden.tasks[:3]]
    assert read_jsonl(write_jsonl(trajectories, tmp_path / "t.jsonl")) == trajectories
    table = pq.read_table(write_parquet(trajectories, tmp_path / "t.parquet"))
    assert table.num_rows == 3 and table.column("verdict").to_pylist() == ["complete"] * 3


def test_scores(runtime, golden):
    reference = [run_episode(runtime, golden, task, ReferencePolicy()) for task in golden.tasks]
    assert scores(reference).pass_at_1 == 1.0 and scores(reference).mean_reward == 1.0
    mixed = reference[:2] + [
        run_episode(runtime, golden, golden.tasks[0], RandomPolicy(), EpisodeConfig(seed=s)) for s in range(3)
    ]
    result = scores(mixed, k=2)
    assert result.tasks == 2 and 0.0 < result.pass_at_1 < 1.0 and result.pass_at_k >= result.pass_at_1
    assert result.model_dump()["pass@2"] == result.pass_at_k  # stored as pass@<k>


@pytest.mark.unit
def test_pass_at_k():
    assert pass_at_k(10, 0, 1) == 0.0 and pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25) and pass_at_k(4, 1, 2) == pytest.approx(0.5)
