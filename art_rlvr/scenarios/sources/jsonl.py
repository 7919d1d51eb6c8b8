"""The `jsonl` source: records from JSONL, one file with a split field, one file per split,
or one file dealt into seeded splits."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from art_rlvr.scenarios.sources.base import (
    SPLITS,
    Records,
    ScenarioFileError,
    SplitSizes,
    deal,
    numbered_jsonl,
    resolve,
)


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


def read_jsonl(path: Path, required: tuple[str, ...] = ()) -> list[dict[str, object]]:
    """The objects of a JSONL file, each with the `required` fields; errors name file and line."""
    records = []
    for number, record in numbered_jsonl(path):
        missing = [f for f in required if f not in record]
        if missing:
            raise ScenarioFileError(f"{path}:{number}: missing field(s) {missing}")
        records.append(record)
    return records


def jsonl_records(source: JsonlSource, base_dir: Path, seed: int) -> Records:
    if source.paths is not None:
        out: Records = {split: [] for split in SPLITS}
        for split, p in source.paths.items():
            out[split] = read_jsonl(resolve(p, base_dir), source.required_fields)
        return out
    assert source.path is not None
    records = read_jsonl(resolve(source.path, base_dir), source.required_fields)
    if source.split_field is not None:
        out = {split: [] for split in SPLITS}
        for record in records:
            named = record.get(source.split_field)
            if named not in out:
                raise ScenarioFileError(
                    f"{source.path}: record has {source.split_field}={named!r}; "
                    f"expected one of {SPLITS}"
                )
            out[named].append(record)
        return out
    sizes = source.splits or SplitSizes(train=len(records), val=0, test=0)
    return deal(records, sizes, "jsonl", seed)
