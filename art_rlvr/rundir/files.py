"""The run folder: config, metrics, trajectories, resumable state and the summary.

Every JSON state file is replaced atomically (temp + fsync + rename); a state file that does
not parse is reported, never silently ignored, because ignoring it would restart a run.

A killed run resumes by redoing the work whose result was not yet in its state file, so every
record is written to be redone safely: an event already in `metrics.jsonl` (the same eval, the
same step, ...) is not appended again, ART's `history.jsonl` is written once per record through
a ledger (`log_once`) that rolls back an append a kill interrupted, and the temporary files of
a kill are swept when the folder is opened. However the loops are arranged, a record written
through this class is never doubled by a kill.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from art_rlvr.rundir.events import (
    AlarmEvent,
    EIRoundEvent,
    EvalEvent,
    Event,
    GepaEvent,
    PromptChangeEvent,
    TrainEvent,
    _Event,
    parse_event,
    parse_events,
)
from art_rlvr.rundir.stored import group_lines

if TYPE_CHECKING:
    import art


def write_json_atomic(path: Path, data: object) -> None:
    """temp file + fsync + rename: readers see the old or the new file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True, default=str)
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp).replace(path)
    finally:
        if Path(tmp).exists():
            Path(tmp).unlink()


class StateFileError(RuntimeError):
    """A state file exists but is corrupt or truncated."""


def drop_torn_tail(path: Path) -> bool:
    """Cut a JSONL file back to its last complete line (a kill mid-write leaves a partial
    record with no newline), so the next append starts a line of its own. True if cut."""
    if not path.exists():
        return False
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    with path.open("r+b") as handle:
        handle.truncate(data.rfind(b"\n") + 1)
        handle.flush()
        os.fsync(handle.fileno())
    return True


def event_key(event: _Event) -> tuple[object, ...] | None:
    """What makes an event the same record when a resumed run redoes its work (None: every
    one is new). Two evaluations of one step differ by split, tag, policy or sample count."""
    match event:
        case EvalEvent():
            return ("eval", event.split, event.step, event.tag, event.policy, event.samples)
        case TrainEvent():
            return ("train", event.step)
        case EIRoundEvent():
            return ("ei_round", event.round)
        case AlarmEvent():
            return (event.event, event.kind, event.step)
        case PromptChangeEvent():
            return ("prompt_change", event.round, event.phase)
        case GepaEvent():
            return (
                "gepa",
                event.round,
                event.iteration,
                event.attempt,
                event.kind,
                event.candidate,
            )
    return None


def _line_key(line: dict[str, object]) -> tuple[object, ...] | None:
    try:
        return event_key(parse_event(line))
    except ValueError:  # not an event of ours (a raw metrics line)
        return None


LEDGER = "art_history.json"  # which ART history records are written (and where one began)


def restore_text(path: Path, text: str | None) -> None:
    """Put a file back as it was (`None`: it did not exist), atomically."""
    if text is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(f".{path.name}.restore")  # one name: a redo after a kill replaces it
    tmp.write_text(text)
    tmp.replace(path)


def append_jsonl(path: Path, record: dict[str, object]) -> None:
    """One JSON line, flushed and fsynced: a crash keeps every line that was written whole."""
    with path.open("a") as handle:
        handle.write(json.dumps(record, sort_keys=True, default=float) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: Path) -> list[dict[str, object]]:
    """The objects of a JSONL file; a line a crash cut short (or anything not an object) is
    skipped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            rows.append(value)
    return rows


class RunFiles:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._tail_checked = False
        self._keys: set[tuple[object, ...]] | None = None  # keys of the events in metrics.jsonl
        for stale in root.glob(".*.json.*"):  # write_json_atomic's temp file, left by a kill
            stale.unlink(missing_ok=True)
        for stale in root.glob("trajectories/*.jsonl.tmp"):
            stale.unlink(missing_ok=True)

    @property
    def art_path(self) -> Path:
        return self.root / ".art"

    def write_json(self, name: str, data: object) -> None:
        write_json_atomic(self.root / name, data)

    def read_json(self, name: str) -> Any | None:
        path = self.root / name
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise StateFileError(
                f"{path} is corrupt ({error}); move it away to start over, or restore it"
            ) from None

    def read_state[S: BaseModel](self, name: str, model: type[S], kind: str) -> S | None:
        """A state file through its model, or None when absent; JSON of another shape (another
        mode's run, a run of an older version, a hand-edited file) is a clear error naming the
        file, not a KeyError deep in a loop."""
        data = self.read_json(name)
        if data is None:
            return None
        try:
            return model.model_validate(data)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the file"
            raise StateFileError(
                f"{self.root / name} is not {kind} state ({where}: {first['msg']}; another "
                "mode's run, or an older version's?); use a new run_dir"
            ) from None

    def write_state(self, name: str, state: BaseModel) -> None:
        """A state model, atomically (the file a resume reads back through the same model)."""
        self.write_json(name, state.model_dump(mode="json"))

    def append_event(self, event: _Event) -> bool:
        """One typed event (art_rlvr.rundir.events) as a line of metrics.jsonl, unless the same
        record (`event_key`) is there already: a resumed run redoing work does not double it.
        False when it was there."""
        key = event_key(event)
        if key is not None:
            if self._keys is None:
                self._keys = {k for k in map(_line_key, self.metrics()) if k is not None}
            if key in self._keys:
                return False
            self._keys.add(key)
        self.append_metrics(event.line())
        return True

    async def log_once(self, model: art.Model, key: str, *args: Any, **kwargs: Any) -> bool:
        """`model.log(*args, **kwargs)` once per `key` over kills and resumes.

        ART appends to its `history.jsonl`, adds the log into the running totals in its
        `state.json` (and overwrites the step's parquet), so a redone log would double a row
        and a total. The ledger records, before each log, the history's length and the state
        file's text, and the key once it is done: a done key is skipped; a key begun but not
        done (a kill came during or just after the log) first puts both back as they were.
        A resumed run's first log is the interrupted one, before ART reads its state. False if
        skipped."""
        ledger = self.read_json(LEDGER) or {"done": [], "begun": {}}
        if key in ledger["done"]:
            return False
        folder = Path(model.base_path) / model.project / "models" / model.name
        history, art_state = folder / "history.jsonl", folder / "state.json"
        if key in ledger["begun"]:
            begun = ledger["begun"][key]
            begun = begun if isinstance(begun, dict) else {"history": begun}  # older ledgers
            if history.exists():
                with history.open("r+b") as handle:
                    handle.truncate(min(history.stat().st_size, begun["history"]))
            if "state" in begun:
                restore_text(art_state, begun["state"])
        else:
            ledger["begun"][key] = {
                "history": history.stat().st_size if history.exists() else 0,
                "state": art_state.read_text() if art_state.exists() else None,
            }
            self.write_json(LEDGER, ledger)
        await model.log(*args, **kwargs)
        del ledger["begun"][key]
        ledger["done"].append(key)
        self.write_json(LEDGER, ledger)
        return True

    def events(self) -> list[Event]:
        """metrics.jsonl as typed events (torn lines skipped; an unknown event is an error)."""
        path = self.root / "metrics.jsonl"
        return parse_events(path.read_text().splitlines()) if path.exists() else []

    def append_metrics(self, record: dict[str, object]) -> None:
        """One JSON line per event; fsynced so a crash keeps every finished line."""
        if not self._tail_checked:
            drop_torn_tail(self.root / "metrics.jsonl")
            self._tail_checked = True
        append_jsonl(self.root / "metrics.jsonl", record)

    def metrics(self) -> list[dict[str, object]]:
        return read_jsonl(self.root / "metrics.jsonl")

    def write_trajectories(self, name: str, groups: list[art.TrajectoryGroup]) -> Path:
        """trajectories/<name>.jsonl, replaced whole: each group kept whole, one a line
        (`art_rlvr.rundir.stored`; read back with `stored.read_groups`)."""
        folder = self.root / "trajectories"
        folder.mkdir(exist_ok=True)
        path = folder / f"{name}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text(group_lines(groups))
        tmp.replace(path)
        return path
