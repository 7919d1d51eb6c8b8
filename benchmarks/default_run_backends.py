"""The default arith RL run (`python -m art_rlvr.run scenario=arith`, 24 steps) on
`backend=torch` and on `backend=tinker` against a local SkyRL engine, one after the other on
the same cores: validation accuracy by step, test accuracy, wall time, seconds a step and peak
memory (the run's process tree, and the engine's), and the ratios.

Run it from the checkout with the default environment; the tinker side runs in the tinker
extra's (`.venv-tinker`, synced by `uv run` on first use):

    uv run python benchmarks/default_run_backends.py [--sides torch tinker]

An engine already running (`TINKER_BASE_URL` set) is used as it is; otherwise one is started
with `--sample-max-num-sequences` (36: one RL step's 6 groups x 6 rollouts in one batch).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "torch": ["uv", "run", "--locked", "python", "-m", "art_rlvr.run"],
    "tinker": ["uv", "run", "--locked", "--extra", "tinker", "--no-dev", "python", "-m",
               "art_rlvr.run", "backend=tinker"],
}  # fmt: skip


class PeakRss:
    """Peak summed RSS of a process and its descendants, sampled twice a second in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_mb, self._done = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.5):
            try:
                root = psutil.Process(self.pid)
                tree = [root, *root.children(recursive=True)]
                total = sum(p.memory_info().rss for p in tree if p.is_running())
            except psutil.Error:
                continue
            self.peak_mb = max(self.peak_mb, total / 2**20)

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        return self.peak_mb


def run_side(side: str, run_dir: Path, extra: list[str], env: dict[str, str]) -> float:
    """One default run in its own folder; the peak RSS of its process tree (MB)."""
    if side == "tinker":
        env = {**env, "UV_PROJECT_ENVIRONMENT": str(REPO / ".venv-tinker")}
    words = ["scenario=arith", f"run_dir={run_dir}", "resume=false", *extra]
    process = subprocess.Popen([*COMMANDS[side], *words], cwd=REPO, env=env)
    peak = PeakRss(process.pid)
    if process.wait() != 0:
        raise SystemExit(f"{side}: the run exited with code {process.returncode}; see {run_dir}")
    return peak.stop()


def read_run(run_dir: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    evals = [r for r in rows if r.get("event") == "eval" and not r.get("tag")]
    return {
        "val": {int(r["step"]): float(r["accuracy"]) for r in evals if r["split"] == "val"},
        "test": next((float(r["accuracy"]) for r in evals if r["split"] == "test"), None),
        "step_seconds": [float(r["seconds"]) for r in rows if r.get("event") == "train"],
        "wall_s": float(summary["wall_seconds"]),
        "client_peak_rss_mb": float(summary["peak_rss_mb"]),
    }


def by_step(item: tuple[int | str, float]) -> int:
    return int(item[0])  # a step read back from results.json is a string


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| backend | wall s | s/step (median) | val accuracy by step | test | peak RSS MB "
             "(run; engine) |", "|---|---|---|---|---|---|"]  # fmt: skip
    for side, r in results.items():
        curve = ", ".join(f"{s}: {a:.2f}" for s, a in sorted(r["val"].items(), key=by_step))
        engine = f"; {r['engine_peak_rss_mb']:.0f}" if r.get("engine_peak_rss_mb") else ""
        test = "n/a" if r["test"] is None else f"{r['test']:.2f}"
        lines.append(
            f"| {side} | {r['wall_s']:.1f} | {statistics.median(r['step_seconds']):.1f} | {curve} "
            f"| {test} | {r['peak_rss_mb']:.0f}{engine} |"
        )
    if {"torch", "tinker"} <= results.keys():
        ratio = results["tinker"]["wall_s"] / results["torch"]["wall_s"]
        lines.append(f"\nwall time, tinker / torch: {ratio:.2f}x")
    return "\n".join(lines)


async def main() -> int:
    from art_rlvr.backend.external import skyrl

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", nargs="+", choices=sorted(COMMANDS), default=["torch", "tinker"])
    parser.add_argument("--sample-max-num-sequences", type=int, default=36)
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks/results/default_run_backends"
    )
    parser.add_argument("keys", nargs="*", help="extra key=value words for both runs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load {os.getloadavg()}")
    results: dict[str, dict[str, Any]] = {}
    for side in args.sides:
        run_dir = args.out / side
        if side == "torch" or os.environ.get("TINKER_BASE_URL"):
            peak = await asyncio.to_thread(run_side, side, run_dir, args.keys, dict(os.environ))
            results[side] = {**read_run(run_dir), "peak_rss_mb": peak}
        else:
            settings = skyrl.SkyRLSettings(
                port=0,
                state_dir=args.out / "skyrl-state",
                sample_max_num_sequences=args.sample_max_num_sequences,
            )
            async with skyrl.running(settings) as engine:
                print(f"engine up in {engine.started_s:.0f} s at {engine.base_url}", flush=True)
                engine_peak = PeakRss(engine.process.pid)
                env = {**os.environ, **engine.environment()}
                peak = await asyncio.to_thread(run_side, side, run_dir, args.keys, env)
                results[side] = {
                    **read_run(run_dir), "peak_rss_mb": peak, "engine_peak_rss_mb": engine_peak.stop()
                }  # fmt: skip
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    report = table(results)
    (args.out / "table.md").write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
