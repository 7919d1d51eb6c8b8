"""What a verifiers scenario says: which taskset, its config, the split, the harness and the
limits. Data only (no verifiers import), so the CLI checks it before anything heavy loads."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

PREFIX = "verifiers:"
HARNESS = "art_rlvr_harness"  # art_rlvr's in-process harness (harness.py), under this alias
SPLIT_NAMES = ("train", "val", "test")


class VerifiersSpec(BaseModel):
    """A `[verifiers]` table (or `scenario=verifiers:<id>` with defaults).

    `id`: the taskset, as verifiers' loader names it (an installed taskset id or an importable
    module exporting one `Taskset` subclass in `__all__`; `-` reads as `_`). `args`: the
    taskset's config fields; `env_args`: the Env's (a multi-turn env's own knobs). `splits`:
    per split, a count of tasks (taken in order after the seeded shuffle) or a `start:stop`
    range of that order; default 80/10/10. `harness`: the verifiers harness id that runs each
    episode (default art_rlvr's in-process one; `null` is verifiers' own chat program, which
    needs `uv`). `timeout_s` bounds one episode, `max_turns` its model calls per agent."""

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


def default_counts(n: int) -> dict[str, int | str]:
    held = max(1, n // 10) if n >= 3 else 0
    return {"train": n - 2 * held, "val": held, "test": held}
