"""Where scenario records come from: procedural generators and JSONL files.

A source returns plain dict records (opaque to the rest of the code) already split into
train / val / test. Splits are disjoint and depend only on the source parameters and the seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Records = dict[str, list[dict[str, Any]]]
SPLITS = ("train", "val", "test")


class ScenarioFileError(ValueError):
    """A scenario definition or its data cannot be used; the message names file and line."""


class SplitSizes(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    train: int = Field(default=2000, ge=0)
    val: int = Field(default=100, ge=0)
    test: int = Field(default=200, ge=0)


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


class JsonlSource(BaseModel):
    """Records from JSONL: one file with a split field, or one file per split."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["jsonl"] = "jsonl"
    path: str | None = None
    paths: dict[Literal["train", "val", "test"], str] | None = None
    required_fields: tuple[str, ...] = ()
    split_field: str | None = None
    splits: SplitSizes | None = None  # for a single file without split_field: seeded partition

    @model_validator(mode="after")
    def _check(self) -> JsonlSource:
        if (self.path is None) == (self.paths is None):
            raise ValueError("give exactly one of `path` or `paths`")
        return self


def arith_records(source: ArithSource, seed: int) -> Records:
    """Distinct problems drawn with a seeded RNG, dealt into disjoint splits."""
    rng = random.Random(f"arith:{seed}")
    sizes = source.splits
    wanted = sizes.train + sizes.val + sizes.test
    seen: set[tuple[int, str, int]] = set()
    problems: list[dict[str, Any]] = []
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


def read_jsonl(path: Path, required: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Parse a JSONL file; errors name the file and the 1-based line."""
    if not path.is_file():
        raise ScenarioFileError(f"{path}: data file not found")
    records = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ScenarioFileError(f"{path}:{number}: not valid JSON ({error.msg})") from None
            if not isinstance(record, dict):
                raise ScenarioFileError(
                    f"{path}:{number}: expected a JSON object, got {type(record).__name__}"
                )
            missing = [f for f in required if f not in record]
            if missing:
                raise ScenarioFileError(f"{path}:{number}: missing field(s) {missing}")
            records.append(record)
    return records


def jsonl_records(source: JsonlSource, base_dir: Path, seed: int) -> Records:
    def resolve(p: str) -> Path:
        path = Path(p).expanduser()
        return path if path.is_absolute() else base_dir / path

    if source.paths is not None:
        out: Records = {split: [] for split in SPLITS}
        for split, p in source.paths.items():
            out[split] = read_jsonl(resolve(p), source.required_fields)
        return out
    assert source.path is not None
    records = read_jsonl(resolve(source.path), source.required_fields)
    if source.split_field is not None:
        out = {split: [] for split in SPLITS}
        for record in records:
            split = record.get(source.split_field)
            if split not in out:
                raise ScenarioFileError(
                    f"{source.path}: record has {source.split_field}={split!r}; "
                    f"expected one of {SPLITS}"
                )
            out[split].append(record)
        return out
    sizes = source.splits or SplitSizes(train=len(records), val=0, test=0)
    shuffled = records[:]
    random.Random(f"jsonl:{seed}").shuffle(shuffled)
    val_end = min(sizes.val, len(shuffled))
    test_end = min(val_end + sizes.test, len(shuffled))
    return {
        "val": shuffled[:val_end],
        "test": shuffled[val_end:test_end],
        "train": shuffled[test_end : test_end + sizes.train],
    }


SourceLoader = Callable[[Any, Path, int], Records]
SOURCES: dict[str, tuple[type[BaseModel], SourceLoader]] = {
    "arith": (ArithSource, lambda s, _base, seed: arith_records(s, seed)),
    "jsonl": (JsonlSource, jsonl_records),
}
