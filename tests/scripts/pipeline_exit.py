"""ART's PipelineTrainer example, made small, on TorchBackend in its own process: the shutdown
test's subject. It ends as the example does (`await backend.close()`, then `asyncio.run`
returns and the interpreter exits), after printing the threads still alive.

usage: python pipeline_exit.py ART_PATH STEPS
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("WEAVE_DISABLED", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = [f"Respond with one word: yes, no or maybe. Case {i}." for i in range(4)]


def reward(text: str) -> float:
    """Varies with the text, so a group is almost never of one reward (PipelineTrainer drops
    those)."""
    return sum(ord(c) for c in text) % 97 / 100


async def rollout_fn(model, example: dict, _config: None):
    import art

    messages = [{"role": "user", "content": example["prompt"]}]
    response = await model.openai_client().chat.completions.create(
        messages=messages, model=model.get_inference_name(), max_tokens=4, n=4
    )
    return art.TrajectoryGroup(
        [
            art.Trajectory(
                messages_and_choices=[*messages, c], reward=reward(c.message.content or "")
            )
            for c in response.choices
        ]
    )


async def main(art_path: Path, steps: int) -> None:
    import art
    from art.pipeline_trainer import PipelineTrainer
    from art.pipeline_tuner.config import PipelineRuntimeConfig

    from art_rlvr import DEFAULT_BASE_MODEL, TorchBackend

    backend = TorchBackend(path=art_path, seed=0)
    model = art.TrainableModel(
        name="pipe", project="tests", run_name="pipe", base_model=DEFAULT_BASE_MODEL
    )
    await model.register(backend)
    trainer = PipelineTrainer(
        model=model,
        backend=backend,
        rollout_fn=rollout_fn,
        scenarios=[{"prompt": p} for p in PROMPTS * 4],
        config=None,
        learning_rate=1e-4,
        max_steps=steps,
        eval_at_start=False,
        pipeline=PipelineRuntimeConfig(num_rollout_workers=2, min_batch_size=1, max_batch_size=2),
        log_interval_seconds=3600,
    )
    await trainer.train()
    await backend.close()
    print("step", await model.get_step(), flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
    alive = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    print("alive:", ",".join(alive), flush=True)
