"""The procedural `arith` source: distinct integer problems `a op b` from a seeded RNG."""

from __future__ import annotations

import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from art_rlvr.scenarios.sources.base import Records, ScenarioFileError, SplitSizes


class ArithSource(BaseModel):
    """Integer arithmetic `a op b`; subtraction keeps a >= b unless negatives are allowed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["arith"] = "arith"
    ops: tuple[Literal["+", "-", "*"], ...] = ("+", "-")
    min_value: int = 10
    max_value: int = 99
    mul_max_value: int = 9
    allow_negative: bool = False
    splits: SplitSizes = SplitSizes()

    @model_validator(mode="after")
    def _check(self) -> ArithSource:
        if not self.ops:
            raise ValueError("ops must name at least one of + - *")
        if self.min_value > self.max_value:
            raise ValueError(f"min_value {self.min_value} > max_value {self.max_value}")
        return self


def arith_records(source: ArithSource, seed: int) -> Records:
    """Distinct problems drawn with a seeded RNG, dealt into disjoint splits."""
    rng = random.Random(f"arith:{seed}")
    sizes = source.splits
    wanted = sizes.train + sizes.val + sizes.test
    seen: set[tuple[int, str, int]] = set()
    problems: list[dict[str, object]] = []
    attempts = 0
    while len(problems) < wanted:
        attempts += 1
        if attempts > wanted * 50:
            raise ScenarioFileError(
                f"arith: only {len(problems)} distinct problems exist for these ranges; "
                f"asked for {wanted}"
            )
        op = rng.choice(source.ops)
        hi = source.mul_max_value if op == "*" else source.max_value
        lo = min(source.min_value, hi) if op != "*" else 2
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        if op == "-" and not source.allow_negative and a < b:
            a, b = b, a
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        problems.append({"id": f"arith-{a}{op}{b}", "a": a, "op": op, "b": b, "answer": answer})
    val_end = sizes.val
    test_end = val_end + sizes.test
    return {
        "val": problems[:val_end],
        "test": problems[val_end:test_end],
        "train": problems[test_end:],
    }
