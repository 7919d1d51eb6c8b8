"""Code written only against ART's public API runs on TorchBackend unchanged."""

import json

import art
import torch
from art.pipeline_trainer import PipelineTrainer
from art.pipeline_tuner.config import PipelineRuntimeConfig

from art_rlvr import TorchBackend

PROMPTS = [f"Respond with one word: yes, no or maybe. Case {i}." for i in range(6)]


def reward(text: str) -> float:
    """Prefers "maybe", and otherwise varies with the text, so that a group of 4 sampled
    replies almost never has zero variance (PipelineTrainer discards those groups, and a run
    with too few left would end before `max_steps`)."""
    word = (text.strip().split() or [""])[0].strip(".,!?'\"").lower()
    return 1.0 if word == "maybe" else sum(ord(c) for c in text) % 97 / 100


async def rollout_fn(
    model: art.TrainableModel, example: dict, _config: None
) -> art.TrajectoryGroup:
    """One request with n completions, as in ART's own PipelineTrainer example. It records the
    step it sampled at and the name it sampled from, to show that each step's weights serve
    the rollouts that follow it."""
    messages = [{"role": "user", "content": example["prompt"]}]
    name = model.get_inference_name()
    example.get("seen", []).append((await model.get_step(), name))
    response = await model.openai_client().chat.completions.create(
        messages=messages, model=name, max_tokens=4, n=4, logprobs=True
    )
    return art.TrajectoryGroup(
        [
            art.Trajectory(
                messages_and_choices=[*messages, c], reward=reward(c.message.content or "")
            )
            for c in response.choices
        ]
    )


async def eval_fn(model: art.TrainableModel, step: int, _config: None) -> list[art.Trajectory]:
    messages = [{"role": "user", "content": PROMPTS[0]}]
    response = await model.openai_client().chat.completions.create(
        messages=messages, model=model.get_inference_name(step), max_tokens=4, temperature=0
    )
    choice = response.choices[0]
    return [
        art.Trajectory(
            messages_and_choices=[*messages, choice], reward=reward(choice.message.content or "")
        )
    ]


def pipeline(model, backend, seen: list, steps: int) -> PipelineTrainer:
    """ART's PipelineTrainer with its default evaluation and checkpoint cadence (evaluate at
    start and every 20 steps, `save_checkpoint` only then); only the sizes are made small."""
    return PipelineTrainer(
        model=model,
        backend=backend,
        rollout_fn=rollout_fn,
        scenarios=[{"prompt": p, "seen": seen} for p in PROMPTS * 4],
        config=None,
        eval_fn=eval_fn,
        learning_rate=1e-4,
        max_steps=steps,
        pipeline=PipelineRuntimeConfig(num_rollout_workers=2, min_batch_size=1, max_batch_size=2),
        log_interval_seconds=3600,
    )


def adapter_weights(trainee) -> list[torch.Tensor]:
    return [
        p.detach().cpu()
        for n, p in trainee.base.model.named_parameters()
        if f".{trainee.adapter}." in n
    ]


async def test_pipeline_trainer_defaults_advance_serve_and_resume(
    backend, make_model, art_path
) -> None:
    """19 of 20 steps are `save_checkpoint=False` under ART's defaults: each must still
    advance the step and serve its weights, and a restarted backend must find the step."""
    model = await make_model("pipe")
    seen: list[tuple[int, str]] = []
    await pipeline(model, backend, seen, steps=3).train(handle_signals=False)
    assert await model.get_step() == 3
    assert model.get_inference_name() == f"{model.name}@3"
    assert all(name == f"{model.name}@{step}" for step, name in seen)
    # which steps the two workers start rollouts at is ART's scheduling (queued groups of step 0
    # may feed steps 1 and 2): rollouts after training used a later step, and each step's own
    # weights answer to its name (the policy span names the step that sampled)
    assert {step for step, _ in seen} - {0}, seen
    for step in (1, 2, 3):
        response = await model.openai_client().chat.completions.create(
            messages=[{"role": "user", "content": PROMPTS[0]}],
            model=f"{model.name}@{step}",
            max_tokens=2,
        )
        assert response.choices[0].model_extra["policy_token_spans"][0]["policy_version"] == step
    history = art_path / "tests" / "models" / model.run_name / "history.jsonl"
    evaluated = [json.loads(line) for line in history.read_text().splitlines()]
    # ART's evaluation checks every Choice's policy spans; one missing fails the evaluation
    assert any(key.startswith("val/") for row in evaluated for key in row), evaluated
    folder = art_path / "tests" / "models" / model.run_name / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["0000", "0001", "0002", "0003"]
    assert [p.parent.name for p in folder.glob("*/optimizer.pt")] == ["0000"]  # no eval step yet

    restarted = TorchBackend(path=art_path, seed=0)
    again = art.TrainableModel(
        name=model.name, project=model.project, run_name=model.run_name, base_model=model.base_model
    )
    try:
        await again.register(restarted)
        assert await again.get_step() == 3 and again.get_inference_name() == f"{model.name}@3"
        trained = adapter_weights(backend._trainees[model.name])
        restored = adapter_weights(restarted._trainees[model.name])
        assert all(torch.equal(a, b) for a, b in zip(trained, restored, strict=True))
        seen.clear()
        await pipeline(again, restarted, seen, steps=1).train(handle_signals=False)
        assert await again.get_step() == 4 and again.get_inference_name() == f"{model.name}@4"
        assert seen and all(step >= 3 for step, _ in seen)
    finally:
        await restarted.close()


async def test_classic_art_loop_train_and_log(backend, make_model, art_path) -> None:
    """gather_trajectory_groups -> backend.train -> model.log, as ART's notebooks do."""
    model = await make_model("classic")
    groups = await art.gather_trajectory_groups(
        [rollout_fn(model, {"prompt": p}, None) for p in PROMPTS[:3]], pbar_desc="gather"
    )
    result = await backend.train(model, groups, learning_rate=1e-4)
    await model.log(groups, metrics=result.metrics, step=result.step, split="train")
    history = art_path / "tests" / "models" / model.run_name / "history.jsonl"
    assert history.is_file() and '"train/' in history.read_text()
    assert result.step == 1
