"""An expert-iteration round's records in the run folder, written by one call from every loop
that runs EI rounds (`mode=ei` and the schedule's EI phase), so both leave the same files:

- `trajectories/train_RRRR<tag>.jsonl`: the round's clean attempts;
- `trajectories/hinted_RRRR<tag>.jsonl`: its hinted attempts (only when there were any);
- `ei/round_RRRR.json`: the round buffer (examples, RL groups, hint records, stats);
- `ei/hints.jsonl`: one line per hint record, `{"round": r, **HintRecord}`.

Call it before the round trains (before the buffer goes into the state): every write replaces
what a killed earlier try of the same round left, so a redone round never duplicates a line.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from art_rlvr.ei.data import RoundBuffer

if TYPE_CHECKING:
    from art_rlvr.ei.expert import RoundOutput
    from art_rlvr.rundir.files import RunFiles

HINTS = "ei/hints.jsonl"


def round_name(round_index: int) -> str:
    return f"round_{round_index:04d}"


def write_round_records(files: RunFiles, output: RoundOutput, *, tag: str = "") -> None:
    """Write a collected round's trajectories, buffer and hint lines (see the module doc).

    `tag` is appended to the trajectory file names where the round number alone would clash
    with another phase's files (the schedule passes e.g. "_ei": `train_0000_ei`)."""
    buffer = output.buffer
    r = buffer.round
    files.write_trajectories(f"train_{r:04d}{tag}", output.clean_groups)
    if output.hinted_groups:
        files.write_trajectories(f"hinted_{r:04d}{tag}", output.hinted_groups)
    files.write_json(f"ei/{round_name(r)}.json", buffer.model_dump(mode="json"))
    write_hint_lines(files, buffer)


def hint_lines(buffer: RoundBuffer) -> list[str]:
    return [json.dumps({"round": buffer.round, **h.model_dump(mode="json")}) for h in buffer.hints]


def write_hint_lines(files: RunFiles, buffer: RoundBuffer) -> None:
    """Replace this round's lines of `ei/hints.jsonl` (other rounds' lines kept, in order)."""
    path = files.root / HINTS
    kept = [
        line
        for line in (path.read_text().splitlines() if path.exists() else [])
        if _round_of(line) not in (None, buffer.round)
    ]
    lines = [*kept, *hint_lines(buffer)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines))
    tmp.replace(path)


def _round_of(line: str) -> int | None:
    """The round of a hints.jsonl line; None for a line cut by a kill (dropped on rewrite)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row.get("round") if isinstance(row, dict) else None
