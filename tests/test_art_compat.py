"""Code written only against ART's public API runs on TorchBackend unchanged."""

import art
from art.pipeline_trainer import PipelineTrainer

PROMPTS = [f"Respond with one word: yes, no or maybe. Case {i}." for i in range(6)]


def reward(text: str) -> float:
    """Prefers "maybe", and otherwise varies with the text, so that a group of 4 sampled
    replies almost never has zero variance (PipelineTrainer discards those groups, and a run
    with too few left would end before `max_steps`)."""
    word = (text.strip().split() or [""])[0].strip(".,!?'\"").lower()
    return 1.0 if word == "maybe" else sum(ord(c) for c in text) % 97 / 100


async def rollout_fn(
    model: art.TrainableModel, scenario: dict, _config: None
) -> art.TrajectoryGroup:
    """One request with n completions, as in ART's own PipelineTrainer example."""
    messages = [{"role": "user", "content": scenario["prompt"]}]
    response = await model.openai_client().chat.completions.create(
        messages=messages, model=model.get_inference_name(), max_tokens=4, n=4, logprobs=True
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


async def test_pipeline_trainer_runs_on_torch_backend(backend, make_model) -> None:
    model = await make_model("pipe")
    trainer = PipelineTrainer(
        model=model,
        backend=backend,
        rollout_fn=rollout_fn,
        scenarios=[{"prompt": p} for p in PROMPTS * 6],
        config=None,
        eval_fn=eval_fn,
        learning_rate=1e-4,
        loss_fn="cispo",
        max_steps=2,
        eval_every_n_steps=1,
        eval_at_start=True,
        log_interval_seconds=3600,
    )
    await trainer.train(handle_signals=False)
    assert await model.get_step() == 2
    assert model.get_inference_name() == f"{model.name}@2"


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
