"""Bytes per stored trajectory: the whole `art.Trajectory` (art_rlvr.rundir.stored, since 2026-11-25)
against the readable row written before (`runfiles.trajectory_row`, no token data), on real
rollouts of the embedded model with the default run's sampling (arith, groups of 6, 32 tokens,
temperature 1).

    uv run python benchmarks/stored_size.py [--groups 4]

Prints both sizes per trajectory, their ratio, the gzip sizes (what an archive costs), and the
size of ART's own zstd Parquet of the same groups (`model.log` writes one under `.art/`).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

import art
from art.utils.trajectory_logging import write_trajectory_groups_parquet

from art_rlvr import TorchBackend
from art_rlvr.config.run_config import RunConfig
from art_rlvr.core.outcome import completion_text, feedback_of, is_correct, turns
from art_rlvr.rollouts.rollout import rollout_group
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rundir.files import RunFiles
from art_rlvr.scenarios.scenario import load_scenario


def row_before(t: art.Trajectory) -> dict[str, Any]:
    """The row `runfiles.trajectory_row` wrote before 2026-11-25 (single-turn case: the messages
    before the reply, the reply's text as `completion`)."""
    messages = turns(t)
    return {
        "scenario_id": t.metadata.get("scenario_id"),
        "prompt_hash": t.metadata.get("prompt_hash"),
        "messages": messages[:-1],
        "completion": completion_text(t),
        "reward": t.reward,
        "correct": is_correct(t),
        "feedback": feedback_of(t),
        "metrics": dict(t.metrics),
        "logs": list(t.logs),
    }


async def main(groups: int) -> None:
    cfg = RunConfig()
    scenario = load_scenario("arith", seed=0)
    sampling = SamplingConfig(max_tokens=cfg.max_tokens, temperature=cfg.temperature)
    with tempfile.TemporaryDirectory() as tmp:
        backend = TorchBackend(path=Path(tmp) / "art", seed=0)
        model = art.TrainableModel(
            name="size", project="bench", base_model=cfg.base_model, run_name="size"
        )
        await model.register(backend)
        batch = [
            await rollout_group(model, s, cfg.group_size, sampling=sampling, seed=0)
            for s in scenario.splits["train"][:groups]
        ]
        path = RunFiles(Path(tmp) / "run").write_trajectories("train_0001", batch)
        now = path.read_bytes()
        parquet = Path(tmp) / "art.parquet"
        write_trajectory_groups_parquet(batch, parquet)
        art_parquet = parquet.stat().st_size
        before = "".join(
            json.dumps(row_before(t), default=str) + "\n" for g in batch for t in g.trajectories
        ).encode()
        await backend.close()
    n = sum(len(g.trajectories) for g in batch)
    print(f"{n} trajectories ({groups} groups of {cfg.group_size}, {cfg.max_tokens} tokens)")
    print(
        f"before (readable row):  {len(before) / n:8.0f} B/trajectory, gzip {len(gzip.compress(before)) / n:6.0f}"
    )
    print(
        f"now (whole trajectory): {len(now) / n:8.0f} B/trajectory, gzip {len(gzip.compress(now)) / n:6.0f}"
    )
    print(f"ART's Parquet (zstd):   {art_parquet / n:8.0f} B/trajectory")
    print(
        f"ratio now/before: {len(now) / len(before):.1f}x (gzip {len(gzip.compress(now)) / len(gzip.compress(before)):.1f}x)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4)
    asyncio.run(main(parser.parse_args().groups))
