"""What every record source shares: the split names and sizes, the error that names a file
and line, JSONL / JSONL.gz / parquet reading, and the seeded deal into disjoint splits."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

Records = dict[str, list[dict[str, object]]]
SPLITS = ("train", "val", "test")


class ScenarioFileError(ValueError):
    """A scenario definition or its data cannot be used; the message names file and line."""


class SplitSizes(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    train: int = Field(default=2000, ge=0)
    val: int = Field(default=100, ge=0)
    test: int = Field(default=200, ge=0)


def resolve(path: str, base_dir: Path) -> Path:
    """A data path as written in a scenario file: relative to that file's folder."""
    found = Path(path).expanduser()
    return found if found.is_absolute() else base_dir / found


def numbered_jsonl(path: Path) -> list[tuple[int, dict[str, object]]]:
    """(1-based line, object) for each non-blank line of a JSONL or JSONL.gz file (for a
    .parquet file: 1-based row, row)."""
    if not path.is_file():
        raise ScenarioFileError(f"{path}: data file not found")
    if path.suffix == ".parquet":
        return list(enumerate(parquet_rows(path), start=1))
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ScenarioFileError(
                        f"{path}:{number}: not valid JSON ({error.msg})"
                    ) from None
                if not isinstance(row, dict):
                    raise ScenarioFileError(
                        f"{path}:{number}: expected a JSON object, got {type(row).__name__}"
                    )
                rows.append((number, row))
    except (OSError, UnicodeDecodeError, EOFError) as error:
        raise ScenarioFileError(f"{path}: cannot read ({error})") from None
    return rows


def parquet_rows(path: Path) -> list[dict[str, object]]:
    import pyarrow.lib
    import pyarrow.parquet

    try:
        return pyarrow.parquet.read_table(path).to_pylist()
    except (OSError, pyarrow.lib.ArrowException) as error:
        raise ScenarioFileError(f"{path}: cannot read parquet ({error})") from None


def deal(records: list[dict[str, object]], sizes: SplitSizes, tag: str, seed: int) -> Records:
    """Seeded shuffle, then val, test and train in that order (smaller sets stay stable)."""
    shuffled = records[:]
    random.Random(f"{tag}:{seed}").shuffle(shuffled)
    val_end = min(sizes.val, len(shuffled))
    test_end = min(val_end + sizes.test, len(shuffled))
    return {
        "val": shuffled[:val_end],
        "test": shuffled[val_end:test_end],
        "train": shuffled[test_end : test_end + sizes.train],
    }
