"""Scenario mixtures (`scenario=arith:2,gsm8k:1`): the spelling, the seeded draw of each RL
batch's groups by weight, and the loader that gives one `Scenario` or a `Mixture`."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from art_rlvr.scenarios.scenario import Example, Scenario, load_scenario, stream_item
from art_rlvr.scenarios.sources import SPLITS, ScenarioFileError


class MixtureEntry(BaseModel):
    """One scenario of `scenario=arith:2,gsm8k:1`: a built-in name or .toml path, its weight."""

    model_config = ConfigDict(frozen=True)

    name: str
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)


def parse_mixture(text: str) -> tuple[MixtureEntry, ...]:
    """`arith`, `arith,gsm8k` or `arith:2,gsm8k:1` -> entries (weight 1 where none is given).
    A ValueError names the bad part: an empty name, a weight that is no positive number, a
    scenario given twice. `verifiers:<taskset>` is one scenario (art_rlvr.rollouts.verifiers)."""
    if text.startswith("verifiers:"):
        return (MixtureEntry(name=text),)
    entries = []
    for part in (p.strip() for p in text.split(",")):
        name, colon, weight = part.rpartition(":")
        name = name.strip() if colon else part
        if not name:
            raise ValueError(f"empty scenario name in {text!r}; write e.g. arith:2,gsm8k:1")
        try:
            entries.append(MixtureEntry(name=name, weight=float(weight) if colon else 1.0))
        except ValueError:
            raise ValueError(
                f"bad weight {weight.strip()!r} for scenario {name!r}: a positive number, "
                "e.g. arith:2,gsm8k:1"
            ) from None
    names = [e.name for e in entries]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"scenario {twice[0]!r} given twice in {text!r}")
    return tuple(entries)


def mixture_draws(weights: Sequence[float], size: int, seed: int, batch: int) -> list[int]:
    """Which scenario each of the `size` groups of batch `batch` comes from, drawn by weight."""
    indices = range(len(weights))
    return random.Random(f"mixture:{seed}:{batch}").choices(indices, weights=weights, k=size)


@dataclass(frozen=True)
class Mixture:
    """Several scenarios trained together (`scenario=arith:2,gsm8k:1`): each RL batch draws its
    groups from them by weight, seeded; each one's records keep their own prompt and reward,
    and evaluations score each scenario apart (`Example.scenario` says whose a record is)."""

    scenarios: tuple[Scenario, ...]
    weights: tuple[float, ...]

    @property
    def name(self) -> str:
        return "+".join(t.name for t in self.scenarios)

    @property
    def splits(self) -> dict[str, list[Example]]:
        return {split: [s for t in self.scenarios for s in t.splits[split]] for split in SPLITS}

    @property
    def spec_max_tokens(self) -> int | None:
        """The largest `max_tokens` its scenarios ask for (each episode must fit)."""
        asked = [t.spec.max_tokens for t in self.scenarios if t.spec.max_tokens is not None]
        return max(asked) if asked else None

    def held_out(self, split: str, limit: int | None = None) -> list[Example]:
        """The first `limit` records of `split` of each scenario (a limit applies to each)."""
        return [s for t in self.scenarios for s in t.held_out(split, limit)]

    def train_batch(self, size: int, seed: int, batch: int) -> list[Example]:
        """RL batch `batch`: a scenario per group drawn by weight, then that scenario's next
        record in its own seeded stream. A pure function of (seed, batch): the streams'
        positions are counted from the draws of the batches before."""
        used = [0] * len(self.scenarios)
        for earlier in range(batch):
            for index in mixture_draws(self.weights, size, seed, earlier):
                used[index] += 1
        out = []
        for index in mixture_draws(self.weights, size, seed, batch):
            scenario = self.scenarios[index]
            out.append(
                stream_item(scenario.splits["train"], f"{seed}:{scenario.name}", used[index])
            )
            used[index] += 1
        return out


def load_scenarios(
    text: str, *, seed: int = 0, overrides: dict[str, object] | None = None
) -> Scenario | Mixture:
    """One scenario (`arith`), or a mixture (`arith:2,gsm8k:1`) whose members each get the
    `[source]` overrides."""
    entries = parse_mixture(text)
    scenarios = tuple(load_scenario(e.name, seed=seed, overrides=overrides) for e in entries)
    if len(scenarios) == 1:
        return scenarios[0]
    names = [t.name for t in scenarios]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ScenarioFileError(f"two scenarios of the mixture {text!r} are named {twice[0]!r}")
    return Mixture(scenarios=scenarios, weights=tuple(e.weight for e in entries))
