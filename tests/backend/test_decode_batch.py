"""The engine's running batch (`art_rlvr.backend.engine.decode_batch`): its KV cache layers, and
finished rows kept as padding."""

import contextlib
import random

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from art_rlvr.backend.engine.decode_batch import (
    Batch,
    Request,
    Row,
    SpareLayer,
    join,
    retire,
    spare_cache,
)
from art_rlvr.backend.engine.types import SamplingParams


def states(rows: int, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(rows, 3, positions, 8), torch.randn(rows, 3, positions, 8)


@pytest.mark.parametrize("steps", [1, 80])
def test_a_spare_layer_holds_what_a_concatenating_layer_holds(steps) -> None:
    """Through a prefill, decode steps past the spare room, a retired row, dropped leading
    positions and left padding (a join): the same keys and values, bit for bit, as
    transformers' layer."""
    torch.manual_seed(0)
    spare, plain = SpareLayer(), DynamicLayer()
    rows = 4

    def update(k: torch.Tensor, v: torch.Tensor) -> None:
        (sk, sv), (pk, pv) = spare.update(k, v), plain.update(k, v)
        assert torch.equal(sk, pk) and torch.equal(sv, pv)

    update(*states(rows, 5))
    for step in range(steps):
        if step == 10:  # a row retires
            for layer in (spare, plain):
                layer.batch_select_indices(torch.tensor([0, 2, 3]))
            rows = 3
        if step == 20:  # a join left-pads the cache
            for layer in (spare, plain):
                assert layer.keys is not None and layer.values is not None
                pad = layer.keys.new_zeros((rows, 3, 2, 8))
                layer.keys = torch.cat([pad, layer.keys], dim=-2)
                layer.values = torch.cat([pad, layer.values], dim=-2)
        if step == 30:  # no row attends to the first 3 positions any more
            spare.drop_leading(3)
            assert plain.keys is not None and plain.values is not None
            plain.keys, plain.values = plain.keys[..., 3:, :], plain.values[..., 3:, :]
        update(*states(rows, 1))
    grown = 5 + steps + (2 if steps > 20 else 0) - (3 if steps > 30 else 0)
    assert spare.get_seq_length() == plain.get_seq_length() == grown


def test_a_decode_step_writes_in_place_until_the_spare_room_is_used() -> None:
    layer = SpareLayer()
    layer.update(*states(2, 4))
    first = layer._key_buffer
    assert first is not None
    room = first.shape[-2] - 4
    for _ in range(room):
        layer.update(*states(2, 1))
        assert layer._key_buffer is first  # no copy of what is held
    layer.update(*states(2, 1))
    assert layer._key_buffer is not first and layer.get_seq_length() == 4 + room + 1


@pytest.mark.parametrize("change", ["retire a row", "drop leading positions"])
def test_a_retired_row_or_dropped_positions_keep_writing_in_place(change) -> None:
    layer = SpareLayer()
    layer.update(*states(3, 6))
    if change == "retire a row":
        layer.batch_select_indices(torch.tensor([0, 2]))
    else:
        layer.drop_leading(2)
    kept = layer._key_buffer
    layer.update(*states(2 if change == "retire a row" else 3, 1))
    assert layer._key_buffer is kept


def test_the_engines_cache_makes_spare_layers() -> None:
    cache = spare_cache()
    cache.update(*states(1, 3), layer_idx=1)
    assert [type(layer) for layer in cache.layers] == [SpareLayer, SpareLayer]


def batch_of(widths: list[int]) -> Batch:
    """A running batch of one row per entry, each row left-padded to `max(widths)` from its
    own prompt width (rows of one width attend alike), with a two-layer cache and logits
    whose first entry is the row's tensor index."""
    width = max(widths)
    rows = [
        Row(Request(None, [1] * w, SamplingParams(), 1, lambda _: None), 0, random.Random(i))
        for i, w in enumerate(widths)
    ]
    attention = torch.tensor([[0] * (width - w) + [1] * w for w in widths])
    cache = spare_cache()
    for layer in range(2):
        cache.update(*states(len(widths), width), layer_idx=layer)
    logits = torch.zeros(len(widths), 5)
    logits[:, 0] = torch.arange(len(widths), dtype=torch.float32)
    batch = Batch(adapter=None, stack=contextlib.ExitStack())
    join(batch, rows, cache, attention, torch.full((len(widths),), width), logits)
    return batch


@pytest.mark.parametrize(
    ("widths", "keep", "multiple", "forward_rows", "slots"),
    [
        # one of 8 leaves: it stays as padding, 8 rows go on, no cache copy
        ([3] * 8, [0, 1, 2, 4, 5, 6, 7], 4, 8, [0, 1, 2, 4, 5, 6, 7]),
        # 4 of 8 leave: a whole multiple, dropped; the rest are the tensors again
        ([3] * 8, [0, 2, 4, 6], 4, 4, None),
        # 5 of 8 leave: 3 go on with one padding row (a multiple of 4)
        ([3] * 8, [1, 5, 6], 4, 4, [1, 2, 3]),
        # the padding row kept attends like a remaining row (width 3), not the lone width 5
        ([5, 3, 3, 3, 3, 3, 3, 3], [6, 7], 4, 4, [2, 3]),
        # without a multiple (not batch-invariant) every leaving row leaves at once
        ([3] * 8, [0, 1, 2, 4, 5, 6, 7], 1, 7, None),
        # a batch of 6 that loses 1: 6 rows are fewer than 8, all stay
        ([3] * 6, [0, 1, 2, 3, 4], 4, 6, [0, 1, 2, 3, 4]),
    ],
)
def test_retired_rows_stay_as_padding_up_to_the_multiple(
    widths, keep, multiple, forward_rows, slots
) -> None:
    batch = batch_of(widths)
    rows = [batch.rows[k] for k in keep]
    retire(batch, keep, multiple)
    assert batch.rows == rows
    assert batch.attention is not None and batch.attention.shape[0] == forward_rows
    assert all(layer.keys.shape[0] == forward_rows for layer in batch.cache.layers)
    assert batch.slots == slots
    assert batch.tensor_rows() == (slots if slots is not None else list(range(len(keep))))
    if forward_rows == len(widths):  # nothing dropped: the logits are the tensors' rows still
        assert batch.live_logits()[:, 0].tolist() == [float(k) for k in keep]
    # the next forward feeds each remaining row its own token, the padding rows token 0
    chosen = torch.tensor([100 + k for k in keep])
    ids = batch.forward_ids(chosen)
    assert ids.shape[0] == forward_rows
    assert ids[batch.tensor_rows()].tolist() == chosen.tolist()
    assert sorted(ids.tolist()) == sorted([0] * (forward_rows - len(keep)) + chosen.tolist())


def test_padding_rows_stay_in_place_through_a_join_and_leave_with_the_last_row() -> None:
    batch = batch_of([3] * 4)
    retire(batch, [0, 2, 3], 4)  # row 1 pads
    assert batch.slots == [0, 2, 3]
    newcomers = batch_of([2, 2])
    assert newcomers.cache is not None and newcomers.attention is not None
    join(
        batch,
        newcomers.rows,
        newcomers.cache,
        newcomers.attention,
        torch.full((2,), 2),
        torch.zeros(2, 5),
    )
    assert batch.slots == [0, 2, 3, 4, 5] and len(batch.rows) == 5
    assert batch.attention is not None and batch.attention.shape == (6, 3)
    assert batch.live_logits().shape[0] == 5
    retire(batch, [], 4)
    assert batch.rows == [] and batch.slots is None and batch.cache is None
