"""Batch-invariant forwards on CPU (art_rlvr/backend/engine/invariant.py): a row's logits do not depend
on the rows beside it or its padding; training forwards are exactly what they were."""

import pytest
import torch

from art_rlvr.backend.adapters.registry import load_base
from art_rlvr.backend.engine import invariant

PROMPT = "What is 17 times 23? Answer with a number only please."


@pytest.fixture(scope="module")
def base():
    """A model of our own: the tests switch its attention implementation."""
    return load_base("embedded:SmolLM2-135M-Instruct", torch.device("cpu"), torch.float32)


def last_logits(model, rows: list[list[int]], **flags) -> torch.Tensor:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(
        input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1, **flags
    ).logits[:, -1]


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9, 13])
def test_padded_linear_rows_match_the_same_rows_among_sixteen(rows) -> None:
    layer = torch.nn.Linear(576, 1536)
    invariant.hook_linears(layer)
    x = torch.randn(16, 576, generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        reference = layer(x)
        out = layer(x[:rows].reshape(1, rows, 576))
    assert out.shape == (1, rows, 1536)
    assert torch.equal(out[0], reference[:rows])


def test_training_forwards_are_not_padded() -> None:
    layer = torch.nn.Linear(576, 192)
    invariant.hook_linears(layer)
    x = torch.randn(5, 576, requires_grad=True)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_a_prompt_gives_the_same_logits_alone_beside_others_and_padded(base) -> None:
    assert invariant.install(base.model)
    prompt = base.tokenizer(PROMPT)["input_ids"]
    flags = {invariant.FLAG: True}
    with torch.inference_mode():
        alone = last_logits(base.model, [prompt], **flags)[0]
        for neighbours in ([prompt], [prompt] * 3, [[1] * (len(prompt) + 5)], [[7, 8, 9]]):
            together = last_logits(base.model, [prompt, *neighbours], **flags)[0]
            assert torch.equal(together, alone), neighbours
        plain_alone = last_logits(base.model, [prompt])[0]
        plain_padded = last_logits(base.model, [prompt, [1] * (len(prompt) + 5)])[0]
    # without the flag it is ordinary sdpa, whose result moves with padding (what this fixes)
    assert not torch.equal(plain_alone, plain_padded)


def test_training_logits_are_unchanged_by_the_installed_attention(base) -> None:
    """Grad-mode forwards (training, scoring) run plain sdpa with the same mask: bit-identical."""
    ids = base.tokenizer([PROMPT, "2+2?"], padding=True, return_tensors="pt")
    inner = base.model
    inner.set_attn_implementation("sdpa")
    before = inner(**ids).logits
    assert invariant.install(inner)
    assert inner.config._attn_implementation == invariant.ATTENTION
    assert torch.equal(inner(**ids).logits, before)


@pytest.mark.parametrize(
    ("q_len", "kv_len", "causal"),
    [(1, 7, False), (1, 65, False), (3, 40, False), (40, 40, True), (9, 130, True)],
)
def test_attention_of_a_row_does_not_depend_on_the_rows_sharing_its_call(q_len, kv_len, causal):
    """The kernel behind grouping: a row's output is bit-identical alone and among 2-33 rows
    (sdpa's CPU kernel is not, at one query), and agrees with sdpa to float rounding."""
    gen = torch.Generator().manual_seed(q_len * kv_len)
    query = torch.randn(33, 9, q_len, 64, generator=gen)
    key, value = torch.randn(2, 33, 3, kv_len, 64, generator=gen)
    mask = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len) if causal else None
    with torch.inference_mode():
        alone = torch.cat(
            [invariant._attend(query[b : b + 1], key[b : b + 1], value[b : b + 1], mask, 0.125)
             for b in range(33)]
        )  # fmt: skip
        reference = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=0.125, enable_gqa=True
        )  # the mask, not is_causal: queries sit at the end of the keys
        assert (alone - reference).abs().max() < 1e-5
        for count in (2, 3, 4, 8, 33):
            rows = torch.randperm(33, generator=gen)[:count]
            together = invariant._attend(query[rows], key[rows], value[rows], mask, 0.125)
            assert torch.equal(together, alone[rows])


def test_rows_that_pad_alike_attend_in_one_group() -> None:
    """Decoding 5 rows whose prompts left-padded by 0, 2, 0, 2 and 3: three groups, each row's
    queries and keys its own, the contiguous rows as a slice (a view)."""
    pads = [0, 2, 0, 2, 3]
    visible = torch.tensor([[0] * p + [1] * (10 - p) for p in pads], dtype=torch.bool)
    query = torch.zeros(5, 9, 1, 64)
    groups = invariant._plan(visible[:, None, None, :], query, 10)
    assert [(members(g.batch), g.rows, g.keys, g.mask) for g in groups] == [
        ([0, 2], slice(0, 1), slice(0, 10), None),
        ([1, 3], slice(0, 1), slice(2, 10), None),
        ([4], slice(0, 1), slice(3, 10), None),
    ]
    assert isinstance(groups[2].batch, slice)


def members(index: slice | torch.Tensor) -> list[int]:
    return list(range(index.start, index.stop)) if isinstance(index, slice) else index.tolist()
