"""art_rlvr's default RL run next to TRL's `GRPOTrainer`, what a user would train with instead:
same model folder, task (arith), reward (the scenario's own), LoRA (r 16, alpha 32, q/k/v/o),
group size (6), prompts per step (6, the very same prompts in the same order), steps (24),
learning rate (2e-4), temperature (1.0), completion budget (32 tokens), on CPU. TRL keeps its
own defaults otherwise (loss `dapo`, rewards scaled by the group's std, a linearly decaying
learning rate, no KL, gradient checkpointing on), generating with HF `generate`; one optimizer
step per batch (a group a microbatch, 6 accumulated). Both processes get the OpenMP spin count
art_rlvr sets for itself (`GOMP_SPINCOUNT`, art_rlvr/__init__.py), so a busy machine does not
punish one side's threads alone.

Both sides are scored by the project's own greedy evaluation on the whole val split, in this
process, at steps 0, 8, 16 and 24 (art_rlvr's checkpoints and TRL's adapters saved at those
steps are served by one TorchBackend and evaluated with `art_rlvr.evaluate`).

    uv run --group bench python benchmarks/trl_grpo.py [--seed 0] [--steps 24] [--out DIR]
        [--trl-scheduler linear|constant] [--trl-no-checkpointing] [--art KEY=VALUE ...] [--quick]

`--quick` (2 steps, 20 val items) checks the pipeline in minutes; its numbers mean nothing.
`--trl-no-checkpointing` runs TRL without gradient checkpointing (TRL's default recomputes each
forward in the backward to save memory, which a 135M model does not need): TRL at its fastest
on this budget, in a folder of its own. `--art lr_schedule=linear` (repeatable) adds a key to
art_rlvr's run, for an ablation: give it a fresh `--out` holding a copy of a finished TRL folder
(`trl-linear/`) to read TRL's side back instead of training it again.

Each side runs in its own process, one after the other (the art_rlvr CLI, then this script with
`--part trl`); a finished side is read back, not run again (delete its folder to measure again).
Prints per side: seconds a step (generation / training, medians), training seconds for all
steps (evaluations excluded), peak RSS, val accuracy at each evaluated step; then the ratios
(TRL / art_rlvr) of time a step and of time to the accuracy both reach. Writes results.json.
On a shared machine record the load average (printed at the start and end).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EVAL_EVERY = 8


def art_side(out: Path, seed: int, steps: int, quick: bool, extra: list[str]) -> dict[str, Any]:
    """The default RL run through the CLI (with `extra` keys, for an ablation); its per-step
    clocks from metrics.jsonl."""
    run_dir = out / "art"
    if not (run_dir / "summary.json").exists():
        shutil.rmtree(run_dir, ignore_errors=True)
        command = [
            sys.executable, "-m", "art_rlvr.run", "scenario=arith", "mode=rl", f"seed={seed}",
            f"n_batches={steps}", f"eval_every={EVAL_EVERY}", "eval_test=false",
            f"run_dir={run_dir}", *(["val_limit=20"] if quick else []), *extra,
        ]  # fmt: skip
        print("art_rlvr:", " ".join(command[1:]), flush=True)
        started = time.monotonic()
        subprocess.run(command, check=True)
        (out / "art_wall_seconds.txt").write_text(f"{time.monotonic() - started}\n")
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [e for e in events if e.get("event") == "train"]
    summary = json.loads((run_dir / "summary.json").read_text())
    model_dir = next((run_dir / ".art").glob("*/models/*"))
    return {
        "step_seconds": [e["seconds"] for e in train],
        "train_seconds": [e["train/seconds"] for e in train],
        "wall_seconds": float((out / "art_wall_seconds.txt").read_text()),
        "peak_rss_mb": summary.get("peak_rss_mb"),
        "own_val": {e["step"]: e["accuracy"] for e in events if e.get("event") == "eval"},
        "checkpoints": {s: str(model_dir / "checkpoints" / f"{s:04d}") for s in eval_steps(steps)},
    }


def eval_steps(steps: int) -> list[int]:
    return sorted({*range(0, steps, EVAL_EVERY), steps})


def trl_side(
    out: Path, seed: int, steps: int, scheduler: str, quick: bool, checkpointing: bool
) -> dict[str, Any]:
    trl_dir = out / trl_folder(scheduler, checkpointing)
    if not (trl_dir / "result.json").exists():
        shutil.rmtree(trl_dir, ignore_errors=True)
        command = [
            sys.executable, __file__, "--part", "trl", "--seed", str(seed), "--steps", str(steps),
            "--out", str(out), "--trl-scheduler", scheduler, *(["--quick"] if quick else []),
            *([] if checkpointing else ["--trl-no-checkpointing"]),
        ]  # fmt: skip
        print("TRL:", " ".join(command[1:]), flush=True)
        import art_rlvr  # noqa: F401  (sets GOMP_SPINCOUNT's default, as for any art_rlvr run)

        spins = os.environ["GOMP_SPINCOUNT"]
        subprocess.run(command, check=True, env={**os.environ, "GOMP_SPINCOUNT": spins})
    return json.loads((trl_dir / "result.json").read_text())


def trl_folder(scheduler: str, checkpointing: bool) -> str:
    return f"trl-{scheduler}" + ("" if checkpointing else "-no-checkpointing")


def run_trl(out: Path, seed: int, steps: int, scheduler: str, checkpointing: bool) -> None:
    """GRPOTrainer on art_rlvr's batches (the same prompts, in order); adapters saved at the
    evaluated steps; generation (generate + reward + old logprobs) timed apart from training."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from art_rlvr import DEFAULT_BASE_MODEL, LoraSettings, load_scenario
    from art_rlvr.backend.adapters.model_source import resolve_base_model
    from art_rlvr.config.run_config import RunConfig

    trl_dir = out / trl_folder(scheduler, checkpointing)
    trl_dir.mkdir(parents=True, exist_ok=True)
    cfg = RunConfig(scenario="arith", seed=seed)  # art_rlvr's defaults: the shared knobs
    scenario = load_scenario("arith", seed=seed)
    batches = [scenario.train_batch(cfg.rl.groups_per_batch, seed, b) for b in range(steps)]
    rows = [{"prompt": sc.messages(), "record": json.dumps(sc.x)} for b in batches for sc in b]

    def reward(prompts, completions, record, **_) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [
            scenario.reward(json.loads(r), t).reward for r, t in zip(record, texts, strict=True)
        ]

    path = resolve_base_model(DEFAULT_BASE_MODEL)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lora = LoraSettings(rank=cfg.lora_rank)
    args = GRPOConfig(
        output_dir=str(trl_dir / "trainer"),
        seed=seed,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        max_steps=steps,
        learning_rate=cfg.rl.learning_rate,
        lr_scheduler_type=scheduler,
        num_generations=cfg.group_size,
        per_device_train_batch_size=cfg.group_size,  # completions a microbatch: one group
        gradient_accumulation_steps=cfg.rl.groups_per_batch,  # one optimizer step per batch
        max_completion_length=cfg.max_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        shuffle_dataset=False,  # art_rlvr's batch b at step b
        dataloader_num_workers=0,
        **({} if checkpointing else {"gradient_checkpointing": False}),
    )
    peft = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    clocks: dict[str, list[float]] = {"generation": [], "step": []}
    step_began = [time.perf_counter()]

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            began = time.perf_counter()
            result = super()._generate_and_score_completions(inputs)
            clocks["generation"].append(time.perf_counter() - began)
            return result

    def save(trainer_model, step: int) -> None:
        trainer_model.save_pretrained(str(trl_dir / "adapters" / f"{step:04d}"))

    class Checkpoints(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            save(model, 0)
            step_began[0] = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            clocks["step"].append(time.perf_counter() - step_began[0])
            with (trl_dir / "progress.jsonl").open("a") as progress:  # read if cut short
                line = {"step": state.global_step, "seconds": clocks["step"][-1],
                        "generation": clocks["generation"][-1], "load": os.getloadavg()[0]}  # fmt: skip
                progress.write(json.dumps(line) + "\n")
            if state.global_step in eval_steps(steps):
                save(model, state.global_step)
            step_began[0] = time.perf_counter()  # the save is not a step's time

    trainer = Timed(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft,
        callbacks=[Checkpoints()],
    )
    started = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - started
    history = [h for h in trainer.state.log_history if "reward" in h]
    result = {
        "step_seconds": clocks["step"],
        "generation_seconds": clocks["generation"],
        "wall_seconds": total,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "train_reward": [h["reward"] for h in history],
        "config": {k: str(v) for k, v in args.to_dict().items() if k in TRL_KEYS},
        "checkpoints": {s: str(trl_dir / "adapters" / f"{s:04d}") for s in eval_steps(steps)},
    }
    (trl_dir / "result.json").write_text(json.dumps(result, indent=1))


TRL_KEYS = {"loss_type", "scale_rewards", "beta", "epsilon", "num_iterations", "lr_scheduler_type",
            "learning_rate", "num_generations", "per_device_train_batch_size",
            "gradient_accumulation_steps", "max_completion_length", "temperature", "optim",
            "weight_decay", "max_grad_norm", "warmup_ratio", "gradient_checkpointing"}  # fmt: skip


async def score(checkpoints: dict[str, dict[int, str]], seed: int, limit: int | None) -> dict:
    """Greedy val accuracy of every side's adapter at every step, on one TorchBackend."""
    import art

    from art_rlvr import DEFAULT_BASE_MODEL, SamplingConfig, TorchBackend, evaluate, load_scenario
    from art_rlvr.config.run_config import RunConfig

    cfg = RunConfig(scenario="arith", seed=seed)
    examples = load_scenario("arith", seed=seed).held_out("val", limit)
    out: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        backend = TorchBackend(path=tmp, seed=seed)
        try:
            for side, folders in checkpoints.items():
                model_dir = Path(tmp) / "bench" / "models" / side
                for step, folder in folders.items():
                    target = model_dir / "checkpoints" / f"{int(step):04d}"
                    target.mkdir(parents=True)
                    for name in ("adapter_model.safetensors", "adapter_config.json"):
                        shutil.copy(Path(folder) / name, target / name)
                model = art.TrainableModel(
                    name=side, project="bench", run_name=side, base_model=DEFAULT_BASE_MODEL
                )
                await model.register(backend)
                sampling = SamplingConfig(max_tokens=cfg.max_tokens, temperature=0.0)
                out[side] = {}
                for step in sorted(int(s) for s in folders):
                    report = await evaluate(model, examples, sampling=sampling, step=step)
                    out[side][step] = report.accuracy
        finally:
            await backend.close()
    return out


def first_at(val: dict[int, float], target: float) -> int | None:
    return next((s for s in sorted(val) if val[s] >= target - 1e-9), None)


def report(art: dict, trl: dict, val: dict[str, dict[int, float]], steps: int) -> dict:
    art_gen = [s - t for s, t in zip(art["step_seconds"], art["train_seconds"], strict=True)]
    trl_gen = trl["generation_seconds"]
    trl_train = [s - g for s, g in zip(trl["step_seconds"], trl_gen, strict=False)]
    sides = {
        "art_rlvr": (art["step_seconds"], art_gen, art["train_seconds"], art["peak_rss_mb"]),
        "TRL": (trl["step_seconds"], trl_gen, trl_train, trl["peak_rss_mb"]),
    }
    med = statistics.median
    print(f"{'':>9} {'s/step':>7} {'gen':>6} {'train':>6} {'total s':>8} {'RSS MB':>7}  val")
    for name, (step_s, gen, train, rss) in sides.items():
        curve = " ".join(f"{s}:{a:.2f}" for s, a in sorted(val[name].items()))
        print(
            f"{name:>9} {med(step_s):7.1f} {med(gen):6.1f} {med(train):6.1f} "
            f"{sum(step_s):8.0f} {rss or 0:7.0f}  {curve}"
        )
    target = min(max(val["art_rlvr"].values()), max(val["TRL"].values()))
    to_target = {}
    for name, (step_s, *_) in sides.items():
        at = first_at(val[name], target)
        to_target[name] = (at, sum(step_s[:at]) if at is not None else None)
    per_step = med(sides["TRL"][0]) / med(sides["art_rlvr"][0])
    print(f"TRL / art_rlvr, seconds a step (median): {per_step:.2f}x")
    (a_step, a_s), (t_step, t_s) = to_target["art_rlvr"], to_target["TRL"]
    if a_s and t_s:
        print(
            f"to val >= {target:.2f} (the lower of the two best): art_rlvr step {a_step} in "
            f"{a_s:.0f} s, TRL step {t_step} in {t_s:.0f} s: {t_s / a_s:.2f}x"
        )
    last = {name: val[name][steps] for name in sides}
    print(f"val after {steps} steps: art_rlvr {last['art_rlvr']:.2f}, TRL {last['TRL']:.2f}")
    return {
        "val": val,
        "seconds_per_step_ratio": per_step,
        "to_target": {"target": target, **to_target},
        "val_after": last,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--trl-scheduler", default="linear", choices=["linear", "constant"])
    parser.add_argument("--quick", action="store_true", help="2 steps, 20 val items: a smoke run")
    parser.add_argument("--part", choices=["all", "trl"], default="all")
    parser.add_argument(
        "--art",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a key for art_rlvr's run (repeatable), e.g. --art lr_schedule=linear; TRL's side "
        "is read back from --out when it is there",
    )
    parser.add_argument(
        "--trl-no-checkpointing",
        action="store_true",
        help="TRL without gradient checkpointing (its default recomputes the forward)",
    )
    args = parser.parse_args()
    steps = 2 if args.quick else args.steps
    out = args.out or Path("runs") / f"trl-grpo-s{args.seed}{'-quick' if args.quick else ''}"
    if args.part == "trl":
        run_trl(out, args.seed, steps, args.trl_scheduler, not args.trl_no_checkpointing)
        return
    out.mkdir(parents=True, exist_ok=True)
    print(f"load average at the start: {os.getloadavg()[0]:.2f}", flush=True)
    art = art_side(out, args.seed, steps, args.quick, args.art)
    trl = trl_side(
        out, args.seed, steps, args.trl_scheduler, args.quick, not args.trl_no_checkpointing
    )
    val = asyncio.run(
        score(
            {"art_rlvr": art["checkpoints"], "TRL": trl["checkpoints"]},
            args.seed,
            20 if args.quick else None,
        )
    )
    own = {int(s): a for s, a in art["own_val"].items()}
    if any(abs(own.get(s, a) - a) > 1e-9 for s, a in val["art_rlvr"].items()):
        print(f"note: art_rlvr's own evaluations {own} differ from the rescoring")
    result = report(art, trl, val, steps)
    result |= {
        "seed": args.seed,
        "art_keys": args.art,
        "trl_config": trl["config"],
        "load_end": os.getloadavg()[0],
    }
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}; {out / 'results.json'}")


if __name__ == "__main__":
    main()
