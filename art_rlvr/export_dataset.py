"""`python -m art_rlvr.export_dataset runs/<run> --out <dir>`: a run's stored rollouts as a
Hugging Face `datasets` folder.

A run keeps its rollouts in `trajectories/*.jsonl` (every evaluation, and the batches RL trained
on). This writes them as Parquet under `data/`, one split per kind of file (`train`, `val`,
`test`; any other file goes to `other`), with a `README.md` whose `configs` block names the
splits, so `datasets.load_dataset("<dir>")` loads it with no code of ours (and
`load_dataset("parquet", data_files=...)` reads any one file). Written next to `--out` and
renamed into place, so a failed export leaves no half folder; pyarrow writes it, `datasets` is
needed only to read it.

One row per rollout, in the conversational shape TRL and vf-eval use: `prompt` (the messages
before the first sampled turn) and `completion` (every message after it: assistant turns with
their tool calls, tool results, the environment's messages), then `reward`, `correct`,
`feedback`, `metrics` (every metric seen, a missing one null), `logs`, and where the row came
from: `source` (the file, e.g. `val_0000`), `step`, `example_id`, `sample` and `seed` (for
`mode=eval`'s samples), `prompt_hash`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from art_rlvr.export import ExportError, check_out_dir, cli_parser, staged
from art_rlvr.rundir.reader import RunFolderError, read_run_folder
from art_rlvr.rundir.stored import Message, StoredTrajectory, TrajectoryFileError

if TYPE_CHECKING:
    import pyarrow as pa

KINDS = ("train", "val", "test")
FILE = re.compile(r"^(?P<kind>[a-z]+)_(?P<step>\d+)")


class CalledFunction(TypedDict):
    name: str
    arguments: str


class ToolCallRow(TypedDict):
    id: str
    type: Literal["function"]
    function: CalledFunction


class MessageRow(TypedDict):
    """A message as `message_type` holds it."""

    role: str
    content: str
    tool_calls: list[ToolCallRow] | None
    tool_call_id: str | None
    name: str | None


class DatasetRow(TypedDict):
    """One rollout as `schema` holds it."""

    source: str
    step: int | None
    example_id: str | None
    sample: int | None
    seed: int | None
    prompt: list[MessageRow]
    completion: list[MessageRow]
    reward: float
    correct: bool
    feedback: str
    metrics: dict[str, float]
    logs: list[str]
    prompt_hash: str | None


def message_type() -> pa.DataType:
    import pyarrow as pa

    function = pa.struct([("name", pa.string()), ("arguments", pa.string())])
    call = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", function)])
    return pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.list_(call)),
            ("tool_call_id", pa.string()),
            ("name", pa.string()),
        ]
    )


def schema(metric_names: Sequence[str]) -> pa.Schema:
    import pyarrow as pa

    message = pa.list_(message_type())
    return pa.schema(
        [
            ("source", pa.string()),
            ("step", pa.int64()),
            ("example_id", pa.string()),
            ("sample", pa.int64()),
            ("seed", pa.int64()),
            ("prompt", message),
            ("completion", message),
            ("reward", pa.float64()),
            ("correct", pa.bool_()),
            ("feedback", pa.string()),
            ("metrics", pa.struct([(name, pa.float64()) for name in metric_names])),
            ("logs", pa.list_(pa.string())),
            ("prompt_hash", pa.string()),
        ]
    )


def message(m: Message) -> MessageRow:
    """A stored message in the export's one message shape (content as text)."""
    calls: list[ToolCallRow] = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in m.tool_calls
    ]
    return {
        "role": m.role,
        "content": m.content,
        "tool_calls": calls or None,
        "tool_call_id": m.tool_call_id,
        "name": m.name,
    }


def dataset_row(t: StoredTrajectory, source: str, step: int | None) -> DatasetRow:
    first = len(t.opening)
    messages = [message(m) for m in t.episode]
    return {
        "source": source,
        "step": step,
        "example_id": t.meta_str("scenario_id"),
        "sample": t.meta_int("sample"),
        "seed": t.meta_int("seed"),
        "prompt": messages[:first],
        "completion": messages[first:],
        "reward": t.reward,
        "correct": t.correct,
        "feedback": t.feedback,
        "metrics": {
            k: float(v)
            for k, v in t.metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        },
        "logs": list(t.logs),
        "prompt_hash": t.meta_str("prompt_hash"),
    }


def split_of(stem: str) -> tuple[str, int | None]:
    """`val_0004_rl_r0` -> ("val", 4); a name that is no train/val/test file -> ("other", None)."""
    match = FILE.match(stem)
    if match and match["kind"] in KINDS:
        return match["kind"], int(match["step"])
    return "other", None


def collect(run_dir: Path, only: Sequence[str] | None = None) -> dict[str, list[DatasetRow]]:
    """The run's stored rollouts by split."""
    folder = run_dir / "trajectories"
    if not folder.is_dir():
        raise ExportError(f"{run_dir} has no trajectories/ folder: is it a run folder?")
    try:
        run = read_run_folder(run_dir)
        files = list(run.trajectory_files)
        if only:
            missing = sorted(set(only) - {f.label for f in files})
            if missing:
                raise ExportError(
                    f"{folder} has no {missing}; it has {sorted(f.label for f in files)}"
                )
            files = [f for f in files if f.label in only]
        splits: dict[str, list[DatasetRow]] = {}
        for f in files:
            split, step = split_of(f.label)
            rows = [dataset_row(t, f.label, step) for t in run.trajectories(f, strict=True)]
            splits.setdefault(split, []).extend(rows)
    except (RunFolderError, TrajectoryFileError) as error:
        raise ExportError(str(error)) from None
    if not any(splits.values()):
        raise ExportError(f"{folder} holds no rollouts")
    return {k: v for k, v in splits.items() if v}


def card(splits: Mapping[str, Sequence[DatasetRow]], run: Path) -> str:
    """README.md: the `configs` block `datasets` reads, and what the folder is."""
    files = "\n".join(
        f"  - split: {name}\n    path: data/{name}-*.parquet" for name in sorted(splits)
    )
    counts = ", ".join(f"{name} {len(rows)}" for name, rows in sorted(splits.items()))
    return (
        f"---\nconfigs:\n- config_name: default\n  data_files:\n{files}\n---\n\n"
        f"# Rollouts of `{run.name}`\n\n"
        f"Exported by `python -m art_rlvr.export_dataset` from `{run}`: {counts} rows.\n"
        "Columns are described in art_rlvr's `art_rlvr/export_dataset.py`.\n"
    )


def export_rollouts(
    run: Path, out: Path, *, only: Sequence[str] | None = None, force: bool = False
) -> dict[str, int]:
    """Write the folder; returns the rows per split."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_out_dir(out, run, force=force)
    splits = collect(run, only)
    names = sorted({k for rows in splits.values() for r in rows for k in r["metrics"]})
    names = names or ["correct"]  # Parquet cannot hold a struct without fields
    table_schema = schema(names)
    with staged(out) as tmp:
        (tmp / "data").mkdir()
        for name, rows in splits.items():
            table = pa.Table.from_pylist(rows, schema=table_schema)
            pq.write_table(table, tmp / "data" / f"{name}-00000-of-00001.parquet")
        (tmp / "README.md").write_text(card(splits, run))
    return {name: len(rows) for name, rows in splits.items()}


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only", nargs="+", help="only these trajectories files, e.g. val_0000 (default: all)"
    )


def _parser() -> argparse.ArgumentParser:
    return cli_parser(
        "python -m art_rlvr.export_dataset",
        "Write a run's stored rollouts as a Hugging Face datasets folder.",
        "runs/arith-eval-s0",
        _options,
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        counts = export_rollouts(args.run, args.out, only=args.only, force=args.force)
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = ", ".join(f"{name} {n}" for name, n in sorted(counts.items()))
    print(f"exported {rows} rollouts to {args.out}")
    print(f"  load: datasets.load_dataset('{args.out}')")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
