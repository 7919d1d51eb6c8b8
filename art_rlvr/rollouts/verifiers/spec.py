"""What a verifiers scenario says: which taskset, its config, the split, the harness and the
limits. Data only (no verifiers import), so the CLI checks it before anything heavy loads."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, field_validator

PREFIX = "verifiers:"
HARNESS = "art_rlvr_harness"  # art_rlvr's in-process harness (harness.py), under this alias
SPLIT_NAMES = ("train", "val", "test")
CORRECT_THRESHOLD = 1.0  # as art_rlvr.core.types's: a reward at or above it is correct
# seat settings art_rlvr does not honour, and why (a seat's other verifiers settings pass on)
SEAT_UNSUPPORTED = {
    "model": "every seat plays the policy being trained or evaluated",
    "client": "every seat calls the policy's endpoint",
    "runtime": "episodes run in a local subprocess runtime",
}


class VerifiersSpec(BaseModel):
    """A `[verifiers]` table (or `scenario=verifiers:<id>` with defaults).

    `id`: the taskset, as verifiers' loader names it (an installed taskset id or an importable
    module exporting one `Taskset` subclass in `__all__`; `-` reads as `_`). `args`: the
    taskset's config fields; `env_args`: the Env's (a multi-turn env's own knobs). `splits`:
    per split, a count of tasks (taken in order after the seeded shuffle) or a `start:stop`
    range of that order; default 80/10/10. `harness`: the verifiers harness id that runs each
    episode (default art_rlvr's in-process one; `null` is verifiers' own chat program, which
    needs `uv`). `timeout_s` bounds one episode, `max_turns` its model calls per agent.

    `seats`: per seat of the Env (verifiers' `[env.<seat>]`: `player0`, `golfer`, ...), its
    agent settings (`max_turns`, `sampling`, `timeout`, `harness` settings, ...); `agent` is
    `seats.agent`, the single-agent env's seat (verifiers' `[env.agent]`). `seat`: the seat
    whose turns train (default `agent`, else the first the Env declares); the others play the
    policy too, as the environment. `correct_threshold`: without a `correct` metric, a reward
    at or above it is correct (a rubric's rewards may be any real number: a poker payoff)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)
    env_args: dict[str, Any] = Field(default_factory=dict)
    splits: dict[str, int | str] | None = None
    shuffle_seed: int | None = 0
    harness: str = HARNESS
    harness_args: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = Field(default=300.0, gt=0)
    max_turns: int | None = Field(default=None, ge=1)
    agent: dict[str, Any] = Field(default_factory=dict)
    seats: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seat: str | None = None
    correct_threshold: FiniteFloat = CORRECT_THRESHOLD

    @property
    def seat_settings(self) -> dict[str, dict[str, Any]]:
        """Each seat's settings as the file gives them (`agent` is the seat named agent)."""
        return {**({"agent": self.agent} if self.agent else {}), **self.seats}

    @field_validator("splits")
    @classmethod
    def _known_splits(cls, value: dict[str, int | str] | None) -> dict[str, int | str] | None:
        if value is not None and (unknown := sorted(set(value) - set(SPLIT_NAMES))):
            raise ValueError(f"unknown split(s) {unknown}; the splits are {list(SPLIT_NAMES)}")
        return value


def is_verifiers_scenario(text: str) -> bool:
    """`scenario=verifiers:<id>`."""
    return text.startswith(PREFIX)


def split_ranges(spec: VerifiersSpec, n: int) -> dict[str, range]:
    """Each split's positions in the (shuffled) task order: counts are taken one after the
    other, `start:stop` strings are ranges; a split past the end is an error."""
    wanted = spec.splits or default_counts(n)
    ranges, cursor = {}, 0
    for split in SPLIT_NAMES:
        value = wanted.get(split, 0)
        if isinstance(value, str):
            start, colon, stop = value.partition(":")
            try:
                ranges[split] = range(int(start or 0), int(stop) if stop else n)
            except ValueError:
                raise ValueError(
                    f"splits.{split} = {value!r}: a count or a 'start:stop' range"
                ) from None
            if not colon:
                raise ValueError(f"splits.{split} = {value!r}: a count or a 'start:stop' range")
        else:
            ranges[split], cursor = range(cursor, cursor + value), cursor + value
    for split, r in ranges.items():
        if r.start < 0 or r.stop > n or r.start > r.stop:
            raise ValueError(
                f"splits.{split} asks for tasks {r.start}:{r.stop}; the taskset has {n}"
            )
    return ranges


def tasks_needed(spec: VerifiersSpec) -> int | None:
    """How many tasks, in the taskset's order, the splits read: what an infinite taskset is
    taken up to. None: a split reads to the end (or no splits are given)."""
    end = sys.maxsize
    stop = max((r.stop for r in split_ranges(spec, end).values()), default=0)
    return None if stop == end or spec.splits is None else stop


def seat_problem(spec: VerifiersSpec, seats: Sequence[str]) -> str | None:
    """Why the file's seat settings cannot be honoured for an Env with `seats`, or None: a
    seat it does not declare, or a setting art_rlvr does not honour (`SEAT_UNSUPPORTED`)."""
    declared = ", ".join(seats) or "none"
    for name, settings in spec.seat_settings.items():
        if name not in seats:
            section = "an `agent` section" if name == "agent" else f"seats.{name}"
            return (
                f"not supported: {section} for taskset {spec.id!r}, whose Env declares the "
                f"seat(s) {declared} (write seats.<seat>)"
            )
        for key in settings:
            if key in SEAT_UNSUPPORTED:
                return f"not supported: seats.{name}.{key} ({SEAT_UNSUPPORTED[key]})"
    if spec.seat is not None and spec.seat not in seats:
        return f"not supported: seat = {spec.seat!r}; taskset {spec.id!r} declares {declared}"
    return None


def trained_seat(spec: VerifiersSpec, seats: Sequence[str]) -> str:
    """The seat whose turns train: the one named, else `agent`, else the first declared."""
    return spec.seat or ("agent" if "agent" in seats or not seats else seats[0])


def default_counts(n: int) -> dict[str, int | str]:
    held = max(1, n // 10) if n >= 3 else 0
    return {"train": n - 2 * held, "val": held, "test": held}
