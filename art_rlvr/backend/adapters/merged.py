"""Decoding with an adapter folded into a copy of the weights it adapts.

peft runs every LoRA layer as the base product plus two rank-r products, a scale and an add:
with the default 120 rank-16 layers that is about 30 % of an fp32 decode step on CPU (223 ms
against 170 ms at 36 rows, docs/results.md). The engine instead decodes a batch with
`W + scale * B @ A` in place of `W` and the LoRA branch off: one product per layer, the same
arithmetic as peft's own `merge_adapter` (so a batch samples what the exported, merged model
samples). The merged copies are computed once per adapter version (a tensor's in-place version
counter moves when an optimizer step or a checkpoint load writes it) and the few most recently
served are kept; the base weights themselves are never touched, so training and the bare model
are bit-identical to before.

Only in fp32: in bf16 a LoRA delta below a weight's 8-bit mantissa step rounds away, and the
served model would not be the trained one. Adapters peft runs as variants (DoRA and kin) or with
a bias of their own keep peft's path.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from peft.tuners.lora import Linear as LoraLinear

__all__ = ["MergedWeights"]

MERGEABLE_DTYPES = (torch.float32, torch.float64)

Version = tuple[tuple[int, int, int, float], ...]


@dataclass
class Merged:
    """One adapter's folded weights, one per LoRA layer, and the version they were made from."""

    version: Version
    weights: list[torch.nn.Parameter]


class MergedWeights:
    """The folded weights of the `keep` most recently served adapters of one peft model."""

    def __init__(self, model: torch.nn.Module, *, keep: int = 2) -> None:
        self.model = model
        self.keep = keep
        self._cache: OrderedDict[str, Merged] = OrderedDict()
        self.builds = 0  # how many times a copy was (re)computed: what the tests count

    def layers(self, adapter: str) -> list[LoraLinear] | None:
        """The layers that hold `adapter`, or None where any of them cannot be folded."""
        layers = [
            m for m in self.model.modules() if isinstance(m, LoraLinear) and adapter in m.lora_A
        ]
        if not layers or not all(_foldable(layer, adapter) for layer in layers):
            return None
        return layers

    @contextlib.contextmanager
    def serving(self, adapter: str) -> Iterator[bool]:
        """Within the block, the model computes `adapter`'s outputs through folded weights.

        Yields False (and changes nothing) where the adapter cannot be folded; the caller then
        has peft run it as usual. The caller holds the model's lock for the whole block.
        """
        layers = self.layers(adapter)
        if layers is None:
            yield False
            return
        merged = self._merged(adapter, layers)
        bases = [_linear(layer) for layer in layers]
        originals = [base.weight for base in bases]
        disabled = [layer._disable_adapters for layer in layers]
        try:
            for layer, base, weight in zip(layers, bases, merged.weights, strict=True):
                base.weight = weight
                layer._disable_adapters = True  # peft's own switch: base layer only
            yield True
        finally:
            for layer, base, original, flag in zip(layers, bases, originals, disabled, strict=True):
                base.weight = original
                layer._disable_adapters = flag

    def forget(self, adapter: str) -> None:
        """Drop `adapter`'s copy (the adapter was deleted)."""
        self._cache.pop(adapter, None)

    def _merged(self, adapter: str, layers: list[LoraLinear]) -> Merged:
        version = _version(layers, adapter)
        entry = self._cache.pop(adapter, None)
        if entry is None or entry.version != version:
            entry = Merged(version, _fold(layers, adapter, entry))
            self.builds += 1
        self._cache[adapter] = entry
        while len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        return entry


def _foldable(layer: LoraLinear, adapter: str) -> bool:
    base = layer.get_base_layer()
    return (
        isinstance(base, torch.nn.Linear)
        and base.weight.dtype in MERGEABLE_DTYPES
        and adapter not in layer.lora_variant
        and not layer.lora_bias.get(adapter, False)
        and not layer.merged
        and not layer.fan_in_fan_out
    )


def _version(layers: list[LoraLinear], adapter: str) -> Version:
    """What the folded weights depend on: each factor's identity and in-place write count,
    and the scale."""
    return tuple(
        (
            id(layer.lora_A[adapter].weight),
            layer.lora_A[adapter].weight._version,
            layer.lora_B[adapter].weight._version,
            float(layer.scaling[adapter]),
        )
        for layer in layers
    )


def _linear(layer: LoraLinear) -> torch.nn.Linear:
    base = layer.get_base_layer()
    assert isinstance(base, torch.nn.Linear)  # `_foldable` checked it
    return base


def _fold(layers: list[LoraLinear], adapter: str, stale: Merged | None) -> list[torch.nn.Parameter]:
    """`W + (B @ A) * scale` per layer, peft's merge arithmetic; into the stale copy's
    buffers where there is one (no new allocation per training step)."""
    old = stale.weights if stale is not None else [None] * len(layers)
    with torch.inference_mode(False), torch.no_grad():
        folded = []
        for layer, buffer in zip(layers, old, strict=True):
            weight = _linear(layer).weight
            if buffer is None or buffer.shape != weight.shape:
                buffer = torch.nn.Parameter(torch.empty_like(weight), requires_grad=False)
            torch.add(weight, layer.get_delta_weight(adapter), out=buffer)
            folded.append(buffer)
        return folded
