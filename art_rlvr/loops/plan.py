"""A run is a list of phases: `eval`, `rl`, `gepa`, `ei`. Each `mode=` is a named list.

`phases=gepa,rl:8,ei,rl:8` spells one: `rl:N` is N RL steps (bare `rl`: `rl_batches_per_round`),
`ei:N` N expert-iteration rounds (bare `ei`: one), `gepa` one GEPA search within
`max_metric_calls`, `eval` a val evaluation. A mode is its preset (`preset`): `mode=rl` is
`rl:<n_batches>`, `mode=gepa_rl rounds=2` is `gepa,rl:8,gepa,rl:8`; `spell` writes a list back
in the same words, so what config.json and the start line show can be typed as `phases=`.

Pure and light (pydantic only): the config validates a list before ART loads, and a resumed
run recomputes the same list from the same config. Each phase carries its `round`, which names
its files (`gepa/round_<r>/`), seeds its GEPA search and numbers its EI rounds; `numbered`
assigns it from the list alone, so a preset and its spelling typed back run the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from art_rlvr.core.text import did_you_mean

PhaseKind = Literal["eval", "rl", "gepa", "ei"]
KINDS: tuple[PhaseKind, ...] = get_args(PhaseKind)
COUNTED: dict[PhaseKind, str] = {"rl": "RL steps", "ei": "expert-iteration rounds"}


class PlanEntry(BaseModel):
    """One phase of a run: its kind, its round (see `numbered`) and, for `rl` and `ei`, how
    many steps or rounds it runs (`count`; 1 for `gepa` and `eval`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: PhaseKind
    round: int = Field(default=0, ge=0)
    count: int = Field(default=1, ge=0)

    @property
    def label(self) -> str:
        """Unique in its list: the key of its evaluation in the schedule's state."""
        return f"{self.kind}_r{self.round}"

    @property
    def word(self) -> str:
        """How `phases=` spells it."""
        if self.kind == "rl" or (self.kind == "ei" and self.count != 1):
            return f"{self.kind}:{self.count}"
        return self.kind


class PhaseError(ValueError):
    """A `phases=` list that does not parse, phrased for the command line."""


def numbered(kinds: Sequence[tuple[PhaseKind, int]]) -> tuple[PlanEntry, ...]:
    """(kind, count) pairs -> phases with their rounds. A phase's round is the number of RL
    phases before it (an EI phase: the round of the RL phase it follows), and never below the
    round after the last phase of its kind, so that labels and GEPA folders are unique. The
    GEPA + RL schedule's `gepa_r0 rl_r0 ei_r0 gepa_r1 ...` falls out of this rule."""
    phases: list[PlanEntry] = []
    rl_before = 0
    following: dict[PhaseKind, int] = {}  # the first round a next phase of that kind may take
    for kind, count in kinds:
        base = rl_before - 1 if kind == "ei" else rl_before
        round = max(base, following.get(kind, 0), 0)
        phases.append(PlanEntry(kind=kind, round=round, count=count))
        following[kind] = round + (count if kind == "ei" else 1)
        rl_before += kind == "rl"
    return tuple(phases)


def parse_phases(text: str, *, rl_steps: int) -> tuple[PlanEntry, ...]:
    """`gepa,rl:8,ei,rl:8` -> phases; a bare `rl` runs `rl_steps` steps, a bare `ei` one round."""
    words = [w.strip() for w in text.split(",")]
    if not all(words):
        raise PhaseError(f"phases={text!r}: an empty entry; write e.g. phases=gepa,rl:8,ei")
    kinds: list[tuple[PhaseKind, int]] = []
    for word in words:
        name, colon, raw = (part.strip() for part in word.partition(":"))
        kind = next((k for k in KINDS if k == name), None)
        if kind is None:
            hint = did_you_mean(name, KINDS)
            raise PhaseError(f"phases: no phase {name!r}{hint}; one of {', '.join(KINDS)}")
        if not colon:
            kinds.append((kind, rl_steps if kind == "rl" else 1))
            continue
        if kind not in COUNTED:
            raise PhaseError(
                f"phases: {word!r}: {kind} takes no count (one {kind} per entry; GEPA's budget "
                "is max_metric_calls)"
            )
        if not raw.isdigit():
            raise PhaseError(f"phases: {word!r}: the count of {COUNTED[kind]} must be a number")
        kinds.append((kind, int(raw)))
    return numbered(kinds)


def spell(phases: Sequence[PlanEntry]) -> str:
    """The `phases=` words of a list (`parse_phases` reads them back to the same phases)."""
    return ",".join(p.word for p in phases)


def plan(
    rounds: int, *, gepa: bool, skip_first_gepa: bool, expert_iteration: bool, rl_steps: int
) -> tuple[PlanEntry, ...]:
    """The GEPA + RL (+ EI) schedule's preset: `rounds` x (GEPA, `rl_steps` RL steps, one EI
    round), GEPA left out of round 0 with `skip_first_gepa`."""
    kinds: list[tuple[PhaseKind, int]] = []
    for r in range(rounds):
        if gepa and not (r == 0 and skip_first_gepa):
            kinds.append(("gepa", 1))
        kinds.append(("rl", rl_steps))
        if expert_iteration:
            kinds.append(("ei", 1))
    return numbered(kinds)


def kinds_of(phases: Sequence[PlanEntry]) -> set[PhaseKind]:
    return {p.kind for p in phases}
