"""The one reader of a run folder: config.json, summary.json, state.json, metrics.jsonl's typed
events, the stored trajectories and the GEPA folders, as frozen records. The report, `compare`
and both exports read runs only through it (it imports neither ART nor torch).

Reading is lenient on purpose: a run is most often read when it went wrong, so an unfinished run
(no summary.json), a metrics line cut by a crash, or a field another version of the loops does
not write is a note (`notes`), never a refusal. Only a folder that is not a run at all, or a
config / summary that does not parse as JSON, is `RunFolderError`.

`config` and `state` stay the JSON they were written as: they belong to the version of the loops
that wrote them, and a run of an older version must still read; what readers need of them has
a typed accessor here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from art_rlvr.rundir.events import (
    AlarmEvent,
    EvalEvent,
    Event,
    PromptChangeEvent,
    RecordError,
    RunSummary,
    TrainEvent,
    parse_event,
)
from art_rlvr.rundir.files import RunFiles, StateFileError
from art_rlvr.rundir.stored import StoredGroup, StoredTrajectory, TrajectoryFileError, read_groups

RUN_MARKERS = ("config.json", "metrics.jsonl", "summary.json")
_TRAJECTORY_NAME = re.compile(r"^(?P<kind>[a-z]+)_(?P<index>\d+)(?P<tag>.*)$")


class RunFolderError(RuntimeError):
    """The folder cannot be read as a run (missing, not a run, or a corrupt record)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class TrajectoryFile(_Frozen):
    """A trajectories/*.jsonl file, named `<kind>_<index><tag>` (train_0003, val_0004_rl_r0) or
    freely (val_best_prompt); `index` is the step, or the round in an EI run."""

    path: Path
    kind: str
    index: int | None
    tag: str

    @property
    def label(self) -> str:
        return self.path.stem


class Rollout(_Frozen):
    """One stored rollout and where it was recorded (its file: split or kind, step, tag)."""

    file: TrajectoryFile
    position: int
    trajectory: StoredTrajectory


class Alarm(_Frozen):
    kind: str
    step: int | None
    message: str


class Proposal(_Frozen):
    """A GEPA prompt-history event with its parents' prompts resolved from the candidates."""

    phase: str
    iteration: int
    kind: str
    accepted: bool
    reason: str
    prompt: str | None
    parents: tuple[int, ...]
    parent_prompts: tuple[str, ...]
    score_before: float | None
    score_after: float | None
    pareto_mean: float | None
    candidate: int | None
    metric_calls: int


class GepaPhase(_Frozen):
    """One GEPA folder: `gepa/` for mode=gepa, `gepa/round_<r>/` for each GEPA+RL phase."""

    label: str
    proposals: tuple[Proposal, ...]
    seed_prompt: str | None
    best_prompt: str | None
    stop_reason: str | None


class RunFolder(_Frozen):
    root: Path
    config: dict[str, Any]  # config.json as the run logged it
    summary: RunSummary | None
    state: dict[str, Any] | None  # state.json as the run's mode wrote it
    metrics: tuple[Event, ...]
    trajectory_files: tuple[TrajectoryFile, ...]
    gepa: tuple[GepaPhase, ...]
    load_notes: tuple[str, ...] = ()  # what reading the folder found amiss
    _read: dict[Path, list[StoredGroup] | TrajectoryFileError] = PrivateAttr(default_factory=dict)
    _file_notes: list[str] = PrivateAttr(default_factory=list)

    @property
    def notes(self) -> tuple[str, ...]:
        """What was found amiss: at load, and in the trajectory files read since."""
        return (*self.load_notes, *self._file_notes)

    @property
    def name(self) -> str:
        return str(self.config.get("run_name") or self.root.name)

    @property
    def mode(self) -> str:
        mode = self.summary.mode if self.summary is not None else self.config.get("mode")
        return str(mode or "unknown")

    @property
    def step_unit(self) -> str:
        """EI runs count evaluations and trajectory files by round, the others by step."""
        return "round" if self.mode == "ei" else "step"

    def groups(self, f: TrajectoryFile, *, strict: bool = False) -> list[StoredGroup]:
        """The groups stored in one trajectory file, each file read once. A line that is no
        stored group raises `TrajectoryFileError` if `strict`; else the file reads as empty,
        with a note (a report of a damaged run still shows the rest)."""
        if f.path not in self._read:
            try:
                self._read[f.path] = read_groups(f.path)
            except TrajectoryFileError as error:
                self._read[f.path] = error
                self._file_notes.append(f"left out: {error}")
        found = self._read[f.path]
        if isinstance(found, TrajectoryFileError):
            if strict:
                raise found
            return []
        return found

    def trajectories(self, f: TrajectoryFile, *, strict: bool = False) -> list[StoredTrajectory]:
        """The rollouts stored in one trajectory file, group after group."""
        return [t for g in self.groups(f, strict=strict) for t in g.trajectories]

    def file(self, name: str) -> TrajectoryFile | None:
        """The trajectory file `trajectories/<name>.jsonl`, if the run has one."""
        return next((f for f in self.trajectory_files if f.label == name), None)

    @property
    def rollouts(self) -> list[Rollout]:
        """Every stored rollout of the run, file by file in `trajectory_files` order."""
        return [
            Rollout(file=f, position=n, trajectory=t)
            for f in self.trajectory_files
            for n, t in enumerate(self.trajectories(f))
        ]

    def events[E: Event](self, kind: type[E]) -> list[E]:
        return [r for r in self.metrics if isinstance(r, kind)]

    @property
    def alarms(self) -> list[Alarm]:
        """Alarms and early stops from metrics.jsonl and summary.json, each once."""
        found: list[tuple[str, int | None, str]] = [
            (a.kind, a.step, a.message) for a in self.events(AlarmEvent)
        ]
        summary = self.summary
        listed = [*summary.alarms] if summary is not None else []
        if summary is not None and summary.early_stop:
            listed.append({"kind": "early_stop", **summary.early_stop})
        found += [
            (
                str(a.get("kind") or "alarm"),
                step if isinstance(step := a.get("step"), int) else None,
                str(a.get("message") or ""),
            )
            for a in listed
        ]
        out: dict[tuple[str, int | None, str], Alarm] = {}
        for kind, step, message in found:
            alarm = Alarm(kind=kind, step=step if isinstance(step, int) else None, message=message)
            out.setdefault((alarm.kind, alarm.step, alarm.message), alarm)
        return list(out.values())

    @property
    def prompt_changes(self) -> list[PromptChangeEvent]:
        """Accepted changes of `s` (GEPA+RL): metrics.jsonl events, else state.json's list."""
        changes = self.events(PromptChangeEvent)
        if changes:
            return changes
        listed = (self.state or {}).get("prompt_changes")
        return [
            change
            for c in (listed if isinstance(listed, list) else [])
            if (change := _parsed(PromptChangeEvent, c)) is not None
        ]

    @property
    def val_evals(self) -> list[EvalEvent]:
        return [e for e in self.events(EvalEvent) if e.split == "val"]

    def eval_prompt(self, event: EvalEvent) -> str | None:
        """The system prompt an evaluation used, from its trajectories file (None: none)."""
        f = self.file(f"{event.split}_{event.index:04d}{event.tag}")
        first = next(iter(self.trajectories(f)), None) if f is not None else None
        opening = first.opening if first is not None else ()
        return next((m.content for m in opening if m.role == "system"), None)

    @property
    def eval_steps(self) -> dict[str, int]:
        """An EI run written before evaluations carried their round: round -> model step."""
        found = (self.state or {}).get("eval_steps")
        if not isinstance(found, dict):
            return {}
        return {str(k): v for k, v in found.items() if isinstance(v, int)}


def recovered_steps(metrics: list[Event]) -> list[int]:
    """Steps booked after a kill that lost their training metrics (`recovered_after_kill`)."""
    return [e.step for e in metrics if isinstance(e, TrainEvent) and e.recovered_after_kill]


def lost_metrics_note(steps: list[int]) -> str:
    which = ", ".join(map(str, steps))
    return (
        f"step(s) {which} trained before a kill and were booked on resume without their "
        "training metrics (loss, token count): the training tokens leave them out"
    )


def read_run_folder(root: Path) -> RunFolder:
    """Read a run folder; `RunFolderError` (one line) if it is missing or not a run."""
    if not root.exists():
        raise RunFolderError(f"{root}: no such folder")
    if not root.is_dir():
        raise RunFolderError(f"{root} is a file, not a run folder")
    if not any((root / name).is_file() for name in RUN_MARKERS):
        raise RunFolderError(f"{root} is not a run folder (none of {', '.join(RUN_MARKERS)} in it)")
    files = RunFiles(root)
    notes: list[str] = []
    try:
        config = files.read_json("config.json") or {}
        summary = files.read_json("summary.json")
    except StateFileError as error:
        raise RunFolderError(str(error)) from None
    if summary is None:
        notes.append("unfinished run: no summary.json yet; this report shows what was written")
    try:
        state = files.read_json("state.json")
    except StateFileError:
        state = None
        notes.append("state.json does not parse; prompt changes are taken from metrics.jsonl")
    raw = files.metrics()
    metrics = [e for r in raw if (e := _event(r)) is not None]
    cut = _line_count(root / "metrics.jsonl") - len(raw)
    if cut:
        notes.append(f"{cut} line(s) of metrics.jsonl could not be read (cut by a crash?)")
    if len(metrics) < len(raw):
        notes.append(
            f"{len(raw) - len(metrics)} line(s) of metrics.jsonl are no known event "
            "(another version's run?) and are left out"
        )
    parsed_summary = _parsed(RunSummary, summary) if isinstance(summary, dict) else None
    if summary is not None and parsed_summary is None:
        notes.append("summary.json is not a run summary; numbers are taken from metrics.jsonl")
    if recovered := recovered_steps(metrics):
        notes.append(lost_metrics_note(recovered))
    return RunFolder(
        root=root,
        config=config if isinstance(config, dict) else {},
        summary=parsed_summary,
        state=state if isinstance(state, dict) else None,
        metrics=tuple(metrics),
        trajectory_files=tuple(trajectory_files(root / "trajectories")),
        gepa=tuple(gepa_phases(root / "gepa")),
        load_notes=tuple(notes),
    )


def _parsed[M: BaseModel](model: type[M], data: object) -> M | None:
    try:
        return model.model_validate(data)
    except ValidationError:
        return None


def _event(data: dict[str, object]) -> Event | None:
    try:
        return parse_event(data)
    except RecordError:
        return None


def _line_count(path: Path) -> int:
    if not path.is_file():
        return 0
    return sum(1 for line in path.read_text(errors="replace").splitlines() if line.strip())


def trajectory_files(folder: Path) -> list[TrajectoryFile]:
    """The trajectory files, ordered by kind, then step (or round), then name."""
    if not folder.is_dir():
        return []
    out = []
    for path in folder.glob("*.jsonl"):
        match = _TRAJECTORY_NAME.match(path.stem)
        if match:
            out.append(
                TrajectoryFile(
                    path=path,
                    kind=match["kind"],
                    index=int(match["index"]),
                    tag=match["tag"].lstrip("_"),
                )
            )
        else:
            kind, _, rest = path.stem.partition("_")
            out.append(TrajectoryFile(path=path, kind=kind, index=None, tag=rest))
    return sorted(out, key=lambda f: (f.kind, f.index if f.index is not None else -1, f.label))


def gepa_phases(folder: Path) -> list[GepaPhase]:
    """`gepa/` itself (mode=gepa) and each `gepa/round_<r>/` (GEPA+RL), in round order."""
    if not folder.is_dir():
        return []
    rounds = sorted(
        (p for p in folder.glob("round_*") if p.is_dir() and p.name[6:].isdigit()),
        key=lambda p: int(p.name[6:]),
    )
    phases = [_gepa_phase(p, f"gepa/{p.name}") for p in rounds]
    if (folder / "prompt_history.jsonl").is_file() or (folder / "state.json").is_file():
        phases.insert(0, _gepa_phase(folder, "gepa"))
    return phases


def _gepa_phase(folder: Path, label: str) -> GepaPhase:
    record = _json_or_none(folder / "result.json") or _json_or_none(folder / "state.json") or {}
    candidates = found if isinstance(found := record.get("candidates"), list) else []
    prompts = {
        c["index"]: str(c.get("prompt", ""))
        for c in candidates
        if isinstance(c, dict) and isinstance(c.get("index"), int)
    }
    history = [_json_line(line) for line in _lines(folder / "prompt_history.jsonl")]
    if not any(history) and isinstance(record.get("history"), list):
        history = record["history"]
    proposals = tuple(_proposal(label, e, prompts) for e in history if isinstance(e, dict))
    seed = record.get("seed_prompt", prompts.get(0))
    best = record.get("best_prompt")
    return GepaPhase(
        label=label,
        proposals=proposals,
        seed_prompt=str(seed) if seed is not None else None,
        best_prompt=str(best) if best is not None else None,
        stop_reason=record.get("stop_reason"),
    )


def _proposal(phase: str, e: dict[str, Any], prompts: dict[int, str]) -> Proposal:
    parents = tuple(p for p in e.get("parents") or () if isinstance(p, int))
    return Proposal(
        phase=phase,
        iteration=int(e.get("iteration") or 0),
        kind=str(e.get("kind") or "?"),
        accepted=bool(e.get("accepted")),
        reason=str(e.get("reason") or ""),
        prompt=e.get("prompt"),
        parents=parents,
        parent_prompts=tuple(prompts.get(p, "") for p in parents),
        score_before=number(e.get("score_before")),
        score_after=number(e.get("score_after")),
        pareto_mean=number(e.get("pareto_mean")),
        candidate=e.get("candidate") if isinstance(e.get("candidate"), int) else None,
        metric_calls=int(e.get("metric_calls") or 0),
    )


def number(value: object) -> float | None:
    """A JSON value as a float when it is a number (never a bool), else None."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.is_file() else []


def _json_line(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def _json_or_none(path: Path) -> dict[str, Any] | None:
    """An optional side file: absent or unreadable is the same here (it only adds detail)."""
    if not path.is_file():
        return None
    value = _json_line(path.read_text(errors="replace"))
    return value if isinstance(value, dict) else None
