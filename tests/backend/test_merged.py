"""Decoding through folded adapter weights (art_rlvr/backend/adapters/merged.py): the same numbers as
peft's own merge, rebuilt whenever the adapter is written, and the model untouched outside."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from peft.utils import get_peft_model_state_dict
from transformers import LlamaConfig, LlamaForCausalLM

from art_rlvr.backend.adapters.merged import MergedWeights
from art_rlvr.backend.adapters.registry import load_base

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def lora(**extra) -> LoraConfig:
    return LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, task_type="CAUSAL_LM", **extra)


def randomise(model, adapter: str, seed: int) -> None:
    """Non-zero B factors (peft starts them at zero, which would make every test trivial)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if f"lora_B.{adapter}." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)


@pytest.fixture(scope="module")
def peft_model():
    """The embedded model with two adapters of its own."""
    base = load_base("embedded:SmolLM2-135M-Instruct", torch.device("cpu"), torch.float32)
    torch.manual_seed(0)
    model = get_peft_model(base.model, lora(), adapter_name="one")
    model.add_adapter("two", lora())
    randomise(model, "one", 1)
    randomise(model, "two", 2)
    model.set_adapter("one")
    return model


def tiny(dtype: torch.dtype = torch.float32):
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(dtype).eval()


IDS = torch.tensor([[1, 17, 42, 99, 7, 3, 11, 64]])


def logits(model) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=IDS).logits


def base_weights(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if "base_layer" in n}


def test_folded_weights_compute_what_peft_merge_computes(peft_model) -> None:
    merged = MergedWeights(peft_model)
    unmerged = logits(peft_model)
    weights = {n: (p, p.clone()) for n, p in base_weights(peft_model).items()}
    with merged.serving("one") as folded:
        assert folded
        served = logits(peft_model)
    # outside the block: the same parameter objects, the same values, the same outputs
    after = base_weights(peft_model)
    assert all(after[n] is p and torch.equal(p, copy) for n, (p, copy) in weights.items())
    assert torch.equal(logits(peft_model), unmerged)
    # peft's own merge of the same adapter gives these logits bit for bit
    peft_model.merge_adapter(["one"])
    try:
        assert torch.equal(logits(peft_model), served)
    finally:
        peft_model.unmerge_adapter()
    # and they are the unmerged model's up to float rounding
    assert torch.allclose(served, unmerged, atol=1e-4)
    assert not torch.equal(served, logits(peft_model.get_base_model()))  # the adapter counts


@pytest.mark.parametrize("write", ["optimizer step", "checkpoint load"])
def test_a_written_adapter_is_folded_again(peft_model, write) -> None:
    merged = MergedWeights(peft_model)
    with merged.serving("one"):
        before = logits(peft_model)
    with merged.serving("one"):
        assert torch.equal(logits(peft_model), before)
    assert merged.builds == 1  # served twice, folded once
    saved = {
        k: v.clone() for k, v in get_peft_model_state_dict(peft_model, adapter_name="one").items()
    }
    params = [p for n, p in peft_model.named_parameters() if ".one." in n]
    if write == "optimizer step":
        for param in params:
            param.requires_grad_(True)
        optimizer = torch.optim.AdamW(params, lr=1e-2)
        peft_model(input_ids=IDS).logits.square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    else:
        changed = {k: v * 1.5 for k, v in saved.items()}
        set_peft_model_state_dict(peft_model, changed, adapter_name="one")
    try:
        with merged.serving("one"):
            now = logits(peft_model)
        assert merged.builds == 2
        assert not torch.allclose(now, before, atol=1e-4)
        assert torch.allclose(now, logits(peft_model), atol=1e-4)  # the unmerged adapter's
    finally:
        set_peft_model_state_dict(peft_model, saved, adapter_name="one")


def test_the_most_recent_adapters_are_kept(peft_model) -> None:
    merged = MergedWeights(peft_model, keep=1)
    try:
        for adapter in ("one", "two", "one"):
            peft_model.set_adapter(adapter)
            expected = logits(peft_model)
            with merged.serving(adapter):
                assert torch.allclose(logits(peft_model), expected, atol=1e-4)
    finally:
        peft_model.set_adapter("one")
    assert merged.builds == 3  # "two" pushed "one" out


@pytest.mark.parametrize(
    ("dtype", "extra"),
    [(torch.bfloat16, {}), (torch.float32, {"use_dora": True})],
    ids=["bf16 (a delta would round away)", "DoRA (not a plain delta)"],
)
def test_what_cannot_be_folded_runs_through_peft(dtype, extra) -> None:
    model = get_peft_model(tiny(dtype), lora(**extra), adapter_name="one")
    randomise(model, "one", 3)
    expected = logits(model)
    merged = MergedWeights(model)
    with merged.serving("one") as folded:
        assert not folded
        assert torch.equal(logits(model), expected)
    assert merged.builds == 0


async def test_an_engine_decoding_folded_samples_what_peft_samples(model, backend, make_engine):
    """`TorchBackend`'s engine (adapters folded) against `fold_adapters=False`'s, on a trainee's
    adapter with non-zero B: the same greedy tokens, logprobs equal up to rounding."""
    from art_rlvr.backend.engine.generation import SamplingParams

    trainee = backend._trainees[model.name]
    base = trainee.base
    state = get_peft_model_state_dict(base.model, adapter_name=trainee.adapter)
    saved = {k: v.clone() for k, v in state.items()}
    assert base.merged is not None
    builds = base.merged.builds
    randomise(base.model, trainee.adapter, 5)
    folded, plain = make_engine(), make_engine(fold=False)
    try:
        prompts = [
            base.tokenizer.apply_chat_template(
                [{"role": "user", "content": f"What is {a} + {b}?"}], add_generation_prompt=True
            )["input_ids"]
            for a, b in ((3, 4), (12, 9), (7, 18))
        ]
        greedy = SamplingParams(max_tokens=8, temperature=0)
        for prompt in prompts:
            (a,) = await folded.generate(prompt, greedy, adapter=trainee.adapter)
            (b,) = await plain.generate(prompt, greedy, adapter=trainee.adapter)
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert base.merged.builds == builds + 1  # the folded engine folded, once
    finally:
        folded.close()
        plain.close()
        set_peft_model_state_dict(base.model, saved, adapter_name=trainee.adapter)
