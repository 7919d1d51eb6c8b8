"""Real training steps on the real embedded model through ART's public API."""

import logging
import math
import os
from pathlib import Path

import art
import pytest
import torch

from art_rlvr import SamplingConfig, TorchBackend, gather_groups, rollout
from art_rlvr.backend.adapters import registry as A
from art_rlvr.backend.training.train import TrainingDataError

PROMPT = [
    {"role": "system", "content": "Reply with one word."},
    {"role": "user", "content": "Say yes."},
]


def adapter_params(backend, model) -> dict[str, torch.Tensor]:
    trainee = backend._trainees[model.name]
    return {
        n: p.detach().clone()
        for n, p in trainee.base.model.named_parameters()
        if f".{trainee.adapter}." in n
    }


async def contrast_groups(model, scenario, n_groups=2) -> list[art.TrajectoryGroup]:
    """Real sampled groups, with rewards forced apart so each group carries signal."""
    groups = await gather_groups(
        model,
        scenario.splits["train"][:n_groups],
        4,
        sampling=SamplingConfig(max_tokens=12),
        seed=1,
    )
    for g in groups:
        for i, t in enumerate(g.trajectories):
            t.reward = float(i % 2)
    return groups


async def test_rl_step_changes_weights_served_output_and_checkpoints(
    backend, make_model, scenario, art_path: Path
) -> None:
    model = await make_model("rl")
    assert model.get_inference_name() == f"{model.name}@0"
    sc = scenario.splits["val"][0]
    greedy = SamplingConfig(max_tokens=16, temperature=0)
    before_params = adapter_params(backend, model)
    groups = await contrast_groups(model, scenario)
    result = await backend.train(model, groups, learning_rate=5e-3)
    assert result.step == 1 and await model.get_step() == 1
    m = result.metrics
    assert m["groups_used"] == 2 and m["groups_skipped"] == 0 and m["tokens"] > 0
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0 and m["seconds"] > 0
    assert abs(m["ratio_mean"] - 1) < 0.05  # served logprobs match the trainer's recomputation
    after_params = adapter_params(backend, model)
    assert any(not torch.equal(before_params[k], after_params[k]) for k in before_params)
    assert model.get_inference_name() == f"{model.name}@1"
    old = await rollout(model, sc, sampling=greedy, step=0)
    new = await rollout(model, sc, sampling=greedy)
    old_ids = old.messages_and_choices[-1].model_extra["token_ids"]
    new_ids = new.messages_and_choices[-1].model_extra["token_ids"]
    assert old_ids != new_ids  # a big step on a tiny model changes the greedy output
    folder = art_path / "tests" / "models" / model.run_name / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["0000", "0001"]
    assert (folder / "0001" / "adapter_model.safetensors").is_file()
    assert (folder / "0001" / "optimizer.pt").is_file() and not (
        folder / "0000" / "optimizer.pt"
    ).exists()
    async with backend.exact_adapter_lease(model, 0):
        assert model.get_inference_name() == f"{model.name}@0"
        leased = await rollout(model, sc, sampling=greedy)
        assert leased.messages_and_choices[-1].model_extra["token_ids"] == old_ids
    assert model.get_inference_name() == f"{model.name}@1"
    await model.delete_checkpoints()
    assert sorted(p.name for p in folder.iterdir()) == ["0001"]


async def test_save_checkpoint_false_still_advances_and_serves(
    backend, make_model, scenario, art_path: Path, caplog
) -> None:
    """ART's semantics: the step advances and its weights are served either way; without
    `save_checkpoint` only the optimizer state is not written."""
    model = await make_model("nosave")
    before = adapter_params(backend, model)
    result = await backend.train(
        model, await contrast_groups(model, scenario, 1), learning_rate=5e-3, save_checkpoint=False
    )
    assert result.step == 1 and await model.get_step() == 1
    assert model.get_inference_name() == f"{model.name}@1"
    after = adapter_params(backend, model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    step = art_path / "tests" / "models" / model.run_name / "checkpoints" / "0001"
    assert (step / "adapter_model.safetensors").is_file() and not (step / "optimizer.pt").exists()
    with caplog.at_level(logging.WARNING, logger="art_rlvr.backend.adapters.registry"):
        A.restore(backend._trainees[model.name], 1)  # as a resume from this folder would
        (step.parent / "0000" / "optimizer.pt").unlink()
        A.restore(backend._trainees[model.name], 1)
    said = [r.getMessage() for r in caplog.records if r.name.startswith("art_rlvr")]
    assert said == [
        f"{model.name} resumes at step 1 with the optimizer state of step 0 (the last saved "
        "checkpoint)",
        f"{model.name} resumes at step 1 with a fresh optimizer state (no checkpoint holds one)",
    ]
    assert adapter_params(backend, model).keys() == after.keys()
    assert all(torch.equal(after[k], v) for k, v in adapter_params(backend, model).items())


async def test_all_equal_groups_are_skipped_and_reported(backend, make_model, scenario) -> None:
    model = await make_model("skip")
    groups = await gather_groups(
        model, scenario.splits["train"][:2], 3, sampling=SamplingConfig(max_tokens=8), seed=2
    )
    for g in groups:
        for t in g.trajectories:
            t.reward = 1.0
    before = adapter_params(backend, model)
    result = await backend.train(model, groups, learning_rate=1e-2)
    assert result.metrics["groups_skipped"] == 2 and result.metrics["groups_used"] == 0
    after = adapter_params(backend, model)
    assert all(torch.equal(before[k], after[k]) for k in before)


async def test_sft_lowers_loss_on_its_batch(backend, make_model) -> None:
    model = await make_model("sft")
    data = [
        art.Trajectory(
            messages_and_choices=[*PROMPT, {"role": "assistant", "content": "Affirmative."}]
        )
        for _ in range(4)
    ]
    losses = []
    for _ in range(3):
        async for metrics in backend._train_sft(
            model, data, art.TrainSFTConfig(learning_rate=2e-3, batch_size=4)
        ):
            losses.append(metrics["loss"])
    assert losses[-1] < losses[0] * 0.8
    step = await model.get_step()
    await model.train_sft(data, config=art.TrainSFTConfig(learning_rate=2e-3, batch_size=2))
    assert await model.get_step() == step + 1


async def test_sft_masks_only_assistant_tokens(backend) -> None:
    from art_rlvr.backend.training.train import sft_samples

    tokenizer = next(iter(backend._bases.values())).tokenizer
    t = art.Trajectory(
        messages_and_choices=[*PROMPT, {"role": "assistant", "content": "Affirmative."}]
    )
    (sample,), _ = sft_samples([t], tokenizer, assistant_turns="all")
    target = tokenizer.decode(
        [i for i, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    )
    assert target.startswith("Affirmative.") and "Say yes" not in target


@pytest.mark.parametrize(
    "lengths", [[5, 5], [1, 6], [2, 7, 4], [9]], ids=["equal", "one-token", "three", "single"]
)
def test_the_training_mask_leaves_no_query_blind_and_hides_pads(lengths) -> None:
    """Every position sees itself (a fully masked left-pad row gave NaN gradients under SDPA
    on CUDA); real tokens see exactly their causal prefix and never a pad."""
    from art_rlvr.backend.training.train import _left_pad, padded_causal_bias

    _, attention = _left_pad([[7] * n for n in lengths], pad=0)
    allowed = padded_causal_bias(attention, torch.float32)[:, 0] == 0
    width = attention.shape[1]
    assert allowed.diagonal(dim1=1, dim2=2).all()
    for row, n in enumerate(lengths):
        real = slice(width - n, width)
        expected = torch.ones(n, n, dtype=torch.bool).tril()
        assert torch.equal(allowed[row, real, real], expected)
        assert not allowed[row, real, : width - n].any()


async def test_batched_training_logprobs_match_each_row_alone(backend) -> None:
    """The padded batch the GRPO step sees gives each row the logprobs it has alone."""
    from art_rlvr.backend.training.train import completion_logprobs

    base = next(iter(backend._bases.values()))
    prompts = [list(range(100, 100 + n)) for n in (30, 12, 21)]
    completions = [list(range(500, 500 + n)) for n in (3, 17, 9)]
    with base.lock, torch.no_grad(), base.model.disable_adapter():
        batched, mask = completion_logprobs(base.model, prompts, completions, pad=2)
        for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            alone, _ = completion_logprobs(base.model, [p], [c], pad=2)
            assert int(mask[row].sum()) == len(c)
            assert torch.allclose(batched[row, -len(c) :], alone[0], atol=1e-4)


@pytest.mark.parametrize(
    ("case", "error", "message"),
    [
        ("empty", TrainingDataError, "no trajectory groups"),
        ("no_choice", TrainingDataError, "no sampled Choice"),
        ("nan", TrainingDataError, "non-finite reward"),
        ("bad_lr", ValueError, "learning_rate"),
        ("bad_loss", ValueError, "loss_fn"),
    ],
)
async def test_bad_training_input_is_a_clear_error(
    backend, make_model, model, case, error, message
) -> None:
    plain = art.Trajectory(
        messages_and_choices=[*PROMPT, {"role": "assistant", "content": "yes"}], reward=1.0
    )
    other = art.Trajectory(
        messages_and_choices=[*PROMPT, {"role": "assistant", "content": "no"}], reward=0.0
    )
    kwargs: dict = {"learning_rate": 1e-4}
    groups = {
        "empty": [],
        "no_choice": [art.TrajectoryGroup([plain, other])],
        "nan": [art.TrajectoryGroup([plain.model_copy(update={"reward": float("nan")}), other])],
        "bad_lr": [art.TrajectoryGroup([plain, other])],
        "bad_loss": [art.TrajectoryGroup([plain, other])],
    }[case]
    if case == "bad_lr":
        kwargs["learning_rate"] = -1.0
    if case == "bad_loss":
        kwargs["loss_fn"] = "magic"
    step = await model.get_step()
    with pytest.raises(error, match=message):
        await backend.train(model, groups, **kwargs)
    assert await model.get_step() == step


async def test_a_plain_model_marked_trainable_is_refused_by_name(tmp_path) -> None:
    """`art.Model(trainable=True)` has no base model or LoRA to train: registering it says so
    (it used to fail later, inside the adapter code), before any model loads."""
    backend = TorchBackend(path=tmp_path, seed=0)
    try:
        model = art.Model(name="plain", project="t", trainable=True)
        with pytest.raises(TypeError, match=r"'plain'.*art\.TrainableModel"):
            await backend.register(model)
    finally:
        await backend.close()


async def test_unknown_art_kwargs_warn_not_crash(backend, make_model, scenario) -> None:
    model = await make_model("kw")
    groups = await contrast_groups(model, scenario, n_groups=1)
    with pytest.warns(UserWarning, match="plot_tensors"):
        result = await backend.train(
            model, groups, learning_rate=1e-5, plot_tensors=True, loss_fn="ppo", kl_penalty_coef=0.1
        )
    assert result.step == 1 and result.metrics["kl"] >= 0


async def test_new_backend_resumes_at_last_step(tmp_path, scenario) -> None:
    first = TorchBackend(path=tmp_path, seed=0)
    model = art.TrainableModel(
        name="resume", project="p", run_name="resume", base_model="embedded:SmolLM2-135M-Instruct"
    )
    await model.register(first)
    await first.train(model, await contrast_groups(model, scenario, 1), learning_rate=1e-3)
    trained = adapter_params(first, model)
    await first.close()
    second = TorchBackend(path=tmp_path, seed=0)
    again = art.TrainableModel(
        name="resume", project="p", run_name="resume", base_model="embedded:SmolLM2-135M-Instruct"
    )
    await again.register(second)
    try:
        assert await again.get_step() == 1 and again.get_inference_name() == "resume@1"
        restored = adapter_params(second, again)
        assert all(torch.allclose(trained[k], restored[k]) for k in trained)
        assert second._trainees["resume"].optimizer.state  # optimizer state came back too
    finally:
        await second.close()
    assert not [
        p
        for p in (tmp_path / "p" / "models" / "resume" / "checkpoints").iterdir()
        if p.name.startswith(".")
    ]
    assert os.access(tmp_path, os.W_OK)
