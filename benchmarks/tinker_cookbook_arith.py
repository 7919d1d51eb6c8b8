"""tinker-cookbook's arithmetic RL recipe beside `art_rlvr.run backend=tinker`, on one local
SkyRL engine, with the same model, task, group size, batch, steps, LoRA rank, loss and
learning rate; one table: seconds a step, held-out accuracy by step, time to the accuracy both
reach.

Run it in the tinker extra's environment (docs/scaling.md):

    UV_PROJECT_ENVIRONMENT=.venv-tinker uv run --locked --extra tinker --no-dev \
        python benchmarks/tinker_cookbook_arith.py --seeds 0 1 2 --steps 8

The task is the recipe's (`tinker_cookbook.recipes.math_rl.arithmetic_env`): x, y drawn as its
`ArithmeticDataset` draws them, the few-shot turn, "What is x + y?", reward correct + 0.1 x
(format - 1). The cookbook side is the recipe's own `rl.train.main` with its dataset builder
and, for held-out accuracy, its own `RLTestSetEvaluator` over `--held-out` problems (100) drawn the same way
from a seed no training batch uses; art_rlvr runs the same conversation and reward through an
ART rollout function (benchmarks/cookbook_arithmetic/rollout.py) and evaluates the same
problems. Both evaluate by sampling at temperature 1, as the recipe's evaluator does
(`eval_temperature=1.0` on our side). The two runs of a seed go one after the other on the
same engine, the order alternating by seed (the recipe draws its batches by index and does not
seed its sampling, so its seeds differ in sampling only); "seconds a step" is each side's own step clock
(sampling, training, saving the step's weights), evaluations excluded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ROLLOUT = REPO / "benchmarks" / "cookbook_arithmetic" / "rollout.py"
MODEL = "embedded:SmolLM2-135M-Instruct"
RENDERER = "qwen3_instruct"
HELD_OUT_SEED = 1_000_003  # ArithmeticDataset seeds its rng with the batch index: none is this


def draw(seed: int, count: int) -> list[tuple[int, int]]:
    """Problems as the recipe's `ArithmeticDataset.get_batch` draws them (x, y in [0, 100])."""
    import numpy as np

    rng = np.random.RandomState(seed)
    return [(int(rng.randint(0, 101)), int(rng.randint(0, 101))) for _ in range(count)]


def write_scenario(
    folder: Path, train: list[tuple[int, int]], held_out: list[tuple[int, int]]
) -> Path:
    """Our scenario for the recipe's task: records from the same draws, the rollout function."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("val", held_out)):
        lines = [json.dumps({"id": f"{name}-{i}", "x": x, "y": y}) for i, (x, y) in enumerate(rows)]
        (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    toml = folder / "cookbook_arithmetic.toml"
    toml.write_text(
        'name = "cookbook_arithmetic"\n'
        'description = "tinker-cookbook\'s arithmetic env as an ART rollout function"\n'
        'id_field = "id"\n'
        '[source]\ntype = "jsonl"\npaths = { train = "train.jsonl", val = "val.jsonl" }\n'
        f'[rollout]\nfunction = "{ROLLOUT}:rollout"\n'
    )
    return toml


async def cookbook_run(args: argparse.Namespace, log_path: Path, base_url: str) -> None:
    """The recipe's training loop with its arithmetic dataset and a held-out evaluator."""
    from tinker_cookbook import renderers
    from tinker_cookbook.recipes.math_rl import arithmetic_env
    from tinker_cookbook.rl.metric_util import RLTestSetEvaluator
    from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
    from tinker_cookbook.rl.train import Config, main
    from tinker_cookbook.rl.types import RLDataset
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    renderer = renderers.get_renderer(RENDERER, tokenizer=get_tokenizer(MODEL))
    prefix = arithmetic_env.ArithmeticEnv.standard_fewshot_prefix()

    class HeldOut(RLDataset):
        def get_batch(self, index: int) -> list[ProblemGroupBuilder]:
            env = partial(arithmetic_env.ArithmeticEnv, convo_prefix=prefix, renderer=renderer)
            return [
                ProblemGroupBuilder(env_thunk=partial(env, x, y), num_envs=1)
                for x, y in draw(HELD_OUT_SEED, args.held_out)
            ]

        def __len__(self) -> int:
            return 1

    config = Config(
        learning_rate=args.learning_rate,
        dataset_builder=arithmetic_env.ArithmeticDatasetBuilder(
            batch_size=args.groups_per_batch,
            model_name_for_tokenizer=MODEL,
            renderer_name=RENDERER,
            n_batches=args.steps + 1,  # it evaluates before a batch: the last one shows step N
            group_size=args.group_size,
        ),
        model_name=MODEL,
        recipe_name="recipe_math_rl",
        renderer_name=RENDERER,
        lora_rank=args.lora_rank,
        max_tokens=args.max_tokens,
        log_path=str(log_path),
        base_url=base_url,
        eval_every=args.eval_every,
        save_every=0,
        loss_fn=args.loss_fn,
        evaluator_builders=[lambda: RLTestSetEvaluator(HeldOut(), max_tokens=args.max_tokens)],
    )
    await main(config)


def cookbook_rows(log_path: Path, steps: int) -> tuple[list[float], dict[int, float]]:
    """Step seconds (the iteration's clock less its evaluation, which the recipe runs inside
    the iteration before the batch) and held-out accuracy by step, from its metrics.jsonl."""
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    seconds = [
        r["time/total"] - r.get("time/run_evaluations_parallel", 0.0)
        for r in rows
        if "time/total" in r and "env/all/correct" in r
    ][:steps]
    accuracy = {
        int(r["step"]): float(r["test/env/all/correct"])
        for r in rows
        if "test/env/all/correct" in r
    }
    return seconds, accuracy


def ours_run(args: argparse.Namespace, seed: int, scenario_file: Path, run_dir: Path) -> None:
    words = [
        "backend=tinker", f"scenario={scenario_file}", f"run_dir={run_dir}", f"seed={seed}",
        f"n_batches={args.steps}", f"groups_per_batch={args.groups_per_batch}",
        f"group_size={args.group_size}", f"learning_rate={args.learning_rate}",
        f"lora_rank={args.lora_rank}", f"max_tokens={args.max_tokens}", f"loss_fn={args.loss_fn}",
        "scale_rewards=false", "temperature=1.0", "eval_temperature=1.0", "eval_test=false",
        f"eval_every={args.eval_every}",
    ]  # fmt: skip
    subprocess.run([sys.executable, "-m", "art_rlvr.run", *words], check=True)


def ours_rows(run_dir: Path) -> tuple[list[float], dict[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    seconds = [r["seconds"] for r in rows if r.get("event") == "train"]
    accuracy = {
        int(r["step"]): float(r["accuracy"])
        for r in rows
        if r.get("event") == "eval" and r.get("split") == "val" and not r.get("tag")
    }
    return seconds, accuracy


def time_to(accuracy: dict[int, float], seconds: list[float], target: float) -> float | None:
    """Training seconds until the first evaluation at or above `target`."""
    for step in sorted(accuracy):
        if accuracy[step] >= target - 1e-9:
            return sum(seconds[:step])
    return None


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| seed | side | s/step (median) | held-out accuracy by step | time to shared acc |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        curve = ", ".join(f"{s}: {a:.2f}" for s, a in sorted(r["accuracy"].items()))
        reach = "n/a" if r["time_to"] is None else f"{r['time_to']:.0f} s (to {r['target']:.2f})"
        lines.append(f"| {r['seed']} | {r['side']} | {r['s_step']:.1f} | {curve} | {reach} |")
    for side in ("tinker-cookbook", "art_rlvr"):
        mine = [r for r in results if r["side"] == side]
        finals = [r["accuracy"][max(r["accuracy"])] for r in mine if r["accuracy"]]
        steps = [r["s_step"] for r in mine]
        lines.append(
            f"| mean | {side} | {statistics.mean(steps):.1f} | final {statistics.mean(finals):.2f} "
            f"over {len(finals)} seed(s) | |"
        )
    return "\n".join(lines)


async def main() -> int:
    from art_rlvr.backend.external import skyrl
    from art_rlvr.backend.external.tinker import register_embedded_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--groups-per-batch", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--loss-fn", default="cispo")
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--held-out", type=int, default=100, help="held-out problems")
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "tinker_cookbook_arith"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    register_embedded_tokenizer(MODEL)
    scenario_file = write_scenario(
        args.out / "scenario", draw(7, 400), draw(HELD_OUT_SEED, args.held_out)
    )
    settings = skyrl.SkyRLSettings(
        port=0, state_dir=args.out / "skyrl-state", sample_max_num_sequences=32
    )
    results: list[dict[str, Any]] = []
    started = time.monotonic()
    async with skyrl.running(settings) as engine:
        os.environ.update(engine.environment())
        print(f"engine up in {engine.started_s:.0f} s at {engine.base_url}", flush=True)
        for seed in args.seeds:
            sides = (
                ["tinker-cookbook", "art_rlvr"]
                if seed % 2 == 0
                else ["art_rlvr", "tinker-cookbook"]
            )
            for side in sides:
                if side == "tinker-cookbook":
                    log_path = args.out / f"cookbook-s{seed}"
                    await cookbook_run(args, log_path, engine.base_url)
                    seconds, accuracy = cookbook_rows(log_path, args.steps)
                else:
                    run_dir = args.out / f"art_rlvr-s{seed}"
                    await asyncio.to_thread(ours_run, args, seed, scenario_file, run_dir)
                    seconds, accuracy = ours_rows(run_dir)
                results.append({"seed": seed, "side": side, "seconds": seconds, "accuracy": accuracy,
                                "s_step": statistics.median(seconds)})  # fmt: skip
                print(f"seed {seed} {side}: {results[-1]}", flush=True)
                (args.out / "results.json").write_text(json.dumps(results, indent=1))
    for seed in args.seeds:
        pair = [r for r in results if r["seed"] == seed]
        target = min(max(r["accuracy"].values()) for r in pair)
        for r in pair:
            r["target"], r["time_to"] = target, time_to(r["accuracy"], r["seconds"], target)
    settings_line = (
        f"{MODEL} on SkyRL {skyrl.SKYRL_VERSION} (JAX, CPU), {args.steps} steps x "
        f"{args.groups_per_batch} groups x {args.group_size}, lr {args.learning_rate}, LoRA rank "
        f"{args.lora_rank}, {args.loss_fn}, max_tokens {args.max_tokens}, held-out {args.held_out} "
        f"sampled at T=1 every {args.eval_every} steps; {time.monotonic() - started:.0f} s in all"
    )
    report = f"{settings_line}\n\n{table(results)}\n"
    (args.out / "table.md").write_text(report)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
