"""The one write-ahead journal of paid evaluations: GEPA's `journal.jsonl` (its evaluations
and reflection replies) and `mode=eval`'s `rollouts.jsonl` (its finished rollouts).

Resume has two tools, one for each kind of work. Work that changes the model (an RL step, an
EI round) is a state snapshot, staged, committed and booked through the `Ledger`
(`loops.phase`). Evaluations change nothing but cost money or time, and a run pays for many
of them between two snapshots, so each is appended here the moment it is paid for and a
resumed run reads them back instead of paying again.

The file is JSONL, one record a line, appended and fsynced record by record. A kill can only
cut the last line; `load` drops that torn tail (the record was never acknowledged, so the
work is redone) before the next append starts a line of its own. A bad line anywhere else
was not written by a kill, so it is an error naming the file and line, never skipped: a skip
would pay for that record again without a word (and, in GEPA, replay a different search),
and would hide whatever damaged the file. The file is left as found; the message says how to
keep the other records.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from art_rlvr.rundir.files import StateFileError, append_jsonl, drop_torn_tail

log = logging.getLogger(__name__)


def why_refused(error: ValueError) -> str:
    """A parse error in a few words: the first field pydantic refused, or json's message."""
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the record"
        return f"{where}: {first['msg']}"
    if isinstance(error, json.JSONDecodeError):
        return f"not JSON: {error.msg} at column {error.colno}"
    return str(error)


def parse_lines[T](
    path: Path, lines: Sequence[str], parse: Callable[[dict[str, object]], T]
) -> list[T]:
    """Each line as a JSON object through `parse`; the first line that is not (not JSON, not
    an object, or refused by `parse` with a ValueError) is a StateFileError naming
    `path:line`. `lines` holds whole lines only (the torn tail already dropped)."""
    out: list[T] = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
            out.append(parse(record))
        except ValueError as error:  # json's decode error and pydantic's are ValueErrors
            raise StateFileError(
                f"{path}:{number} is corrupt ({why_refused(error)}). A kill can only cut the "
                "last line, so something else changed this file; it is left as found. To "
                f"resume with its other {len(lines) - 1} records, fix or delete line {number}; "
                "to start over, move the file away"
            ) from None
    return out


@dataclass(frozen=True)
class Journal:
    """Append-only JSONL at `path`, fsynced per record (`None`: no folder, so nothing is
    written and nothing resumes). Load before the first append: loading is where a kill's
    torn last line is cut."""

    path: Path | None

    def append(self, record: Mapping[str, object]) -> None:
        """One record as one line, on disk before this returns: what a kill cannot undo."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        append_jsonl(self.path, dict(record))

    def load(self) -> list[dict[str, object]]:
        """The records as they were appended."""
        return self.read(dict)

    def read[T](self, parse: Callable[[dict[str, object]], T]) -> list[T]:
        """The records through `parse` (a model's `model_validate`), so a record of the wrong
        shape is reported at its line like a line that is not JSON."""
        if self.path is None or not self.path.exists():
            return []
        if drop_torn_tail(self.path):
            log.info("%s: dropped a last line a kill cut short; that record is redone", self.path)
        return parse_lines(self.path, self.path.read_text().splitlines(), parse)
