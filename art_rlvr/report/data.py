"""The run folder, read into plain frozen records for the report.

Reading is lenient on purpose: a report is most wanted for a run that went wrong, so an
unfinished run (no summary.json), a metrics line cut by a crash, or a field another version of
the loops does not write is a note on the page, never a refusal. Only a folder that is not a run
at all, or a config / summary that does not parse, stops the report (`ReportError`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from art_rlvr.core import correct_from
from art_rlvr.records import (
    AlarmEvent,
    Event,
    PromptChangeEvent,
    RecordError,
    RunSummary,
    parse_event,
)
from art_rlvr.runfiles import RunFiles, StateFileError

RUN_MARKERS = ("config.json", "metrics.jsonl", "summary.json")
_TRAJECTORY_NAME = re.compile(r"^(?P<kind>[a-z]+)_(?P<index>\d+)(?P<tag>.*)$")


class ReportError(RuntimeError):
    """The folder cannot be reported on (missing, not a run, or a corrupt record)."""


@dataclass(frozen=True)
class ToolCall:
    """A tool call as the model sent it (arguments are the raw text, valid or not)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Message:
    """One message of an episode: its role and text, the tool calls of an assistant turn,
    and the call a `tool` message answers."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Trajectory:
    """One row of trajectories/<name>.jsonl: `messages` before the last sampled turn, that
    turn's text as `completion`, and `tail` (that turn and what followed) when there is more
    to it than its text."""

    scenario_id: str
    messages: tuple[Message, ...]
    completion: str
    reward: float
    feedback: str
    metrics: dict[str, Any]
    logs: tuple[str, ...] = ()
    tail: tuple[Message, ...] = ()

    @property
    def correct(self) -> bool:
        return correct_from(self.reward, self.metrics)

    @property
    def episode(self) -> tuple[Message, ...]:
        """Every message of the episode, in order."""
        return self.messages + (self.tail or (Message("assistant", self.completion),))

    @property
    def opening(self) -> tuple[Message, ...]:
        """The messages before the first sampled turn: the prompt."""
        first = next((i for i, m in enumerate(self.episode) if m.role == "assistant"), None)
        return self.episode[:first]

    @property
    def multi_turn(self) -> bool:
        """More than one assistant turn, or any tool call: an episode worth showing whole."""
        episode = self.episode
        return sum(m.role == "assistant" for m in episode) > 1 or any(
            m.tool_calls or m.role == "tool" for m in episode
        )


@dataclass(frozen=True)
class TrajectoryFile:
    """A trajectories/*.jsonl file, named `<kind>_<index><tag>` (train_0003, val_0004_rl_r0) or
    freely (val_best_prompt); `index` is the step, or the round in an EI run."""

    path: Path
    kind: str
    index: int | None
    tag: str

    @property
    def label(self) -> str:
        return self.path.stem


@dataclass(frozen=True)
class Rollout:
    """One stored rollout and where it was recorded (its file: split or kind, step, tag)."""

    file: TrajectoryFile
    position: int
    trajectory: Trajectory


@dataclass(frozen=True)
class Alarm:
    kind: str
    step: int | None
    message: str


@dataclass(frozen=True)
class Proposal:
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


@dataclass(frozen=True)
class GepaPhase:
    """One GEPA folder: `gepa/` for mode=gepa, `gepa/round_<r>/` for each GEPA+RL phase."""

    label: str
    proposals: tuple[Proposal, ...]
    seed_prompt: str | None
    best_prompt: str | None
    stop_reason: str | None


@dataclass(frozen=True)
class RunData:
    root: Path
    config: dict[str, Any]
    summary: RunSummary | None
    state: dict[str, Any] | None
    metrics: tuple[Event, ...]
    trajectory_files: tuple[TrajectoryFile, ...]
    gepa: tuple[GepaPhase, ...]
    notes: tuple[str, ...] = field(default=())

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

    @cached_property
    def _stored(self) -> dict[Path, list[Trajectory]]:
        return {f.path: read_trajectories(f.path) for f in self.trajectory_files}

    def trajectories(self, f: TrajectoryFile) -> list[Trajectory]:
        """The rollouts stored in one trajectory file (each file is read once)."""
        return self._stored[f.path]

    @property
    def rollouts(self) -> list[Rollout]:
        """Every stored rollout of the run, file by file in `trajectory_files` order."""
        return [
            Rollout(f, n, t)
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
            (str(a.get("kind") or "alarm"), a.get("step"), str(a.get("message") or ""))
            for a in listed
        ]
        out: dict[tuple[str, int | None, str], Alarm] = {}
        for kind, step, message in found:
            alarm = Alarm(kind, step if isinstance(step, int) else None, message)
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


def load_run(root: Path) -> RunData:
    """Read a run folder; `ReportError` (one line) if it is missing or not a run."""
    if not root.exists():
        raise ReportError(f"{root}: no such folder")
    if not root.is_dir():
        raise ReportError(f"{root} is a file, not a run folder")
    if not any((root / name).is_file() for name in RUN_MARKERS):
        raise ReportError(f"{root} is not a run folder (none of {', '.join(RUN_MARKERS)} in it)")
    files = RunFiles(root)
    notes: list[str] = []
    try:
        config = files.read_json("config.json") or {}
        summary = files.read_json("summary.json")
    except StateFileError as error:
        raise ReportError(str(error)) from None
    if summary is None:
        notes.append("unfinished run: no summary.json yet; this report shows what was written")
    try:
        state = files.read_json("state.json")
    except StateFileError:
        state = None
        notes.append("state.json does not parse; prompt changes are taken from metrics.jsonl")
    raw = files.metrics()
    metrics = [e for r in raw if isinstance(r, dict) and (e := _event(r)) is not None]
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
    return RunData(
        root=root,
        config=config if isinstance(config, dict) else {},
        summary=parsed_summary,
        state=state if isinstance(state, dict) else None,
        metrics=tuple(metrics),
        trajectory_files=tuple(trajectory_files(root / "trajectories")),
        gepa=tuple(gepa_phases(root / "gepa")),
        notes=tuple(notes),
    )


def _parsed[M: BaseModel](model: type[M], data: Any) -> M | None:
    try:
        return model.model_validate(data)
    except ValidationError:
        return None


def _event(data: dict[str, Any]) -> Event | None:
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
                TrajectoryFile(path, match["kind"], int(match["index"]), match["tag"].lstrip("_"))
            )
        else:
            kind, _, rest = path.stem.partition("_")
            out.append(TrajectoryFile(path, kind, None, rest))
    return sorted(out, key=lambda f: (f.kind, f.index if f.index is not None else -1, f.label))


def read_trajectories(path: Path) -> list[Trajectory]:
    """The rows of one trajectory file; a line that does not parse is skipped. The one reader
    of the stored trajectory format: everything in the report goes through it."""
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            raw = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(raw, dict):
            rows.append(_trajectory(raw))
    return rows


def _trajectory(raw: dict[str, Any]) -> Trajectory:
    reward = raw.get("reward")
    logs = raw.get("logs")
    return Trajectory(
        scenario_id=str(raw.get("scenario_id") or "?"),
        messages=_messages(raw.get("messages")),
        completion=str(raw.get("completion") or ""),
        reward=float(reward) if isinstance(reward, int | float) else 0.0,
        feedback=str(raw.get("feedback") or ""),
        metrics=metrics if isinstance(metrics := raw.get("metrics"), dict) else {},
        logs=tuple(str(line) for line in logs) if isinstance(logs, list) else (),
        tail=_messages(raw.get("tail")),
    )


def _messages(raw: Any) -> tuple[Message, ...]:
    return tuple(_message(m) for m in raw if isinstance(m, dict)) if isinstance(raw, list) else ()


def _message(m: dict[str, Any]) -> Message:
    calls = found if isinstance(found := m.get("tool_calls"), list) else []
    return Message(
        role=str(m.get("role", "?")),
        content=str(m.get("content") or ""),
        tool_calls=tuple(_tool_call(c) for c in calls if isinstance(c, dict)),
        tool_call_id=str(m["tool_call_id"]) if m.get("tool_call_id") is not None else None,
        name=str(m["name"]) if m.get("name") is not None else None,
    )


def _tool_call(call: dict[str, Any]) -> ToolCall:
    """An OpenAI-shaped call (`function.name`, `function.arguments`), arguments kept as text."""
    function: dict[str, Any] = fn if isinstance(fn := call.get("function"), dict) else {}
    arguments = function.get("arguments", "")
    return ToolCall(
        id=str(call.get("id") or ""),
        name=str(function.get("name") or "?"),
        arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
    )


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
        score_before=_number(e.get("score_before")),
        score_after=_number(e.get("score_after")),
        pareto_mean=_number(e.get("pareto_mean")),
        candidate=e.get("candidate") if isinstance(e.get("candidate"), int) else None,
        metric_calls=int(e.get("metric_calls") or 0),
    )


def _number(value: Any) -> float | None:
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
