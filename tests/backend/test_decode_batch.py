"""The engine's running batch (`art_rlvr.backend.decode_batch`): its KV cache layers."""

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from art_rlvr.backend.decode_batch import SpareLayer, spare_cache


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
