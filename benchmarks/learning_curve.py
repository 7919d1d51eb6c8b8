"""Learning per CPU-minute: held-out accuracy against CPU time for RL-only and expert iteration
on arith, same seed, run one after the other; the area under each curve is the figure.

    uv run python benchmarks/learning_curve.py [--seed 0] [--quick] [--runs-dir runs]

Full: the default RL run (24 steps x 6 groups x 6, val every 8 steps) and the default EI run
(8 rounds x 16 scenarios x 6 attempts, val every 2 rounds), as in the README. --quick: 4 RL
steps and 2 EI rounds on 30 val items (a smoke run of a few minutes). Runs land in
runs/lc-{rl,ei}-s<seed>[-quick]; a finished run is read, not re-run (delete it to measure again).

Each run's `metrics.jsonl` has val evaluations with `cpu_seconds` (this process's CPU, robust to
the neighbours' load on a shared machine) and `wall_seconds`. Per run it prints the curve and:
  AUC      mean val accuracy over [0, T] (trapezoids between evaluations), T = the shorter run's
           last evaluation, so both are read over the same CPU budget;
  gain AUC AUC minus the run's starting accuracy: accuracy points gained, averaged over [0, T];
  per CPU-minute  (last - first val accuracy) / CPU minutes at the last evaluation.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

Curve = list[tuple[float, float]]  # (cpu seconds, val accuracy)


def run_args(mode: str, quick: bool) -> list[str]:
    if mode == "rl":
        return ["mode=rl", *(["n_batches=4", "eval_every=2"] if quick else [])]
    return ["mode=ei", *(["rounds=2", "eval_every_rounds=1"] if quick else [])]


def ensure_run(run_dir: Path, mode: str, seed: int, quick: bool) -> None:
    if (run_dir / "summary.json").exists():
        print(f"{run_dir} is finished: reading it", flush=True)
        return
    command = [
        sys.executable, "-m", "art_rlvr.run", "scenario=arith", f"seed={seed}",
        f"run_dir={run_dir}", "eval_test=false", *(["val_limit=30"] if quick else []),
        *run_args(mode, quick),
    ]  # fmt: skip
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)


def curve(run_dir: Path) -> Curve:
    """Val evaluations in order: (CPU seconds, accuracy); wall seconds where CPU was not logged."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r.get("event") == "eval" and r.get("split") == "val"]
    points = [(float(r.get("cpu_seconds", r["wall_seconds"])), float(r["accuracy"])) for r in evals]
    if len(points) < 2 or any(b[0] < a[0] for a, b in pairwise(points)):
        raise SystemExit(f"{run_dir}: needs >= 2 val evaluations from one session (resumed?)")
    return points


def at(points: Curve, t: float) -> float:
    """Accuracy at CPU time t, linear between evaluations, flat outside them."""
    if t <= points[0][0]:
        return points[0][1]
    for (t0, a0), (t1, a1) in pairwise(points):
        if t <= t1:
            return a0 + (a1 - a0) * (t - t0) / (t1 - t0)
    return points[-1][1]


def auc(points: Curve, horizon: float) -> float:
    """Mean accuracy over [0, horizon]; before the first evaluation the run is at its start."""
    knots = [0.0, *[t for t, _ in points if t < horizon], horizon]
    area = sum((b - a) * (at(points, a) + at(points, b)) / 2 for a, b in pairwise(knots))
    return area / horizon


def main(seed: int, quick: bool, runs_dir: Path) -> None:
    suffix = "-quick" if quick else ""
    curves: dict[str, Curve] = {}
    for mode in ("rl", "ei"):
        run_dir = runs_dir / f"lc-{mode}-s{seed}{suffix}"
        ensure_run(run_dir, mode, seed, quick)
        curves[mode] = curve(run_dir)
    horizon = min(points[-1][0] for points in curves.values())
    figures: dict[str, float] = {}
    for mode, points in curves.items():
        shown = ", ".join(f"{t / 60:.1f} min {a:.2f}" for t, a in points)
        figures[mode] = auc(points, horizon)
        gain = figures[mode] - points[0][1]
        per_minute = (points[-1][1] - points[0][1]) / (points[-1][0] / 60)
        print(
            f"{mode:2s}: AUC {figures[mode]:.3f} over the first {horizon / 60:.1f} CPU min "
            f"(gain AUC {gain:+.3f}); val {points[0][1]:.2f} -> {points[-1][1]:.2f} in "
            f"{points[-1][0] / 60:.1f} CPU min ({per_minute:+.3f} per CPU-minute); curve: {shown}"
        )
    print(f"EI / RL AUC ratio {figures['ei'] / figures['rl']:.2f} (same seed, same val set)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="4 RL steps, 2 EI rounds, 30 val")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    args = parser.parse_args()
    main(args.seed, args.quick, args.runs_dir)
