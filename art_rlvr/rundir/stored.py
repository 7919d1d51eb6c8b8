"""The stored trajectory: an `art.TrajectoryGroup` as one JSON line of a run's `trajectories/`
file, kept whole (every turn, the sampled `Choice`s with token ids and logprobs, tool calls and
definitions, additional histories, reward, metrics, metadata, logs), and the views read from it.

Why ART's own model dump as JSONL rather than ART's Parquet writer
(`art.utils.trajectory_logging`): ART's reader needs duckdb, which is not installed with it; a
Parquet file cannot be appended to (the evaluation journal appends one rollout at a time); and
the report and `compare` read runs without importing ART (15 s: it imports torch). A line is
`TrajectoryGroup.model_dump(mode="json")` with a format tag and each trajectory's `start_time`
(ART leaves it out of a dump). `to_art` validates it back and turns each choice dict into the
`Choice` that ART's tokenizer reads, as ART's Parquet reader does; ART's own validation leaves
such dicts as dicts. Files of the layout before (one readable row per trajectory, no token data)
still read: each row becomes a trajectory of plain messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from art_rlvr.core.types import correct_from

if TYPE_CHECKING:
    import art
    from openai.types.chat.chat_completion import Choice

FORMAT: Final = "art_rlvr.trajectory_group/1"
_CHOICE_KEYS = {"finish_reason", "index", "message"}  # ART's test for a choice dict

type JsonDict = dict[str, JsonValue]


class TrajectoryFileError(ValueError):
    """A trajectories file line that is JSON but no stored group (another program's file)."""


class ToolCall(BaseModel):
    """A tool call as the model sent it (arguments are the raw text, valid or not)."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str


class Message(BaseModel):
    """One message of an episode, as the report and the dataset export show it: its role and
    text, the tool calls of an assistant turn, and the call a `tool` message answers."""

    model_config = ConfigDict(frozen=True)

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    sampled: bool = False  # a turn the policy sampled (stored as a `Choice`)


class StoredTrajectory(BaseModel):
    """One `art.Trajectory` as JSON; a field a later ART adds is kept as an extra."""

    model_config = ConfigDict(frozen=True, extra="allow")

    exchanges: JsonDict = Field(default_factory=dict)
    messages_and_choices: list[JsonDict] = Field(default_factory=list)
    tools: list[JsonDict] | None = None
    additional_histories: list[JsonDict] = Field(default_factory=list)
    reward: float = 0.0
    initial_policy_version: int | None = None
    final_policy_version: int | None = None
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)
    metadata: JsonDict = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)
    start_time: str | None = None

    def to_art(self) -> art.Trajectory:
        """The `art.Trajectory` it was stored from (sampled turns as `Choice`s again)."""
        import art

        data = self.model_dump(mode="json", exclude_none=False)
        if data["start_time"] is None:
            del data["start_time"]
        data["messages_and_choices"] = _restored(self.messages_and_choices)
        data["additional_histories"] = [
            {**h, "messages_and_choices": _restored(_dicts(h.get("messages_and_choices")))}
            for h in self.additional_histories
        ]
        return art.Trajectory.model_validate(data)

    # ---- views: what the report, the dataset export and tracing show
    @property
    def items(self) -> list[JsonDict]:
        """`messages_and_choices`; for a trajectory recorded only as ART's `exchanges` (a
        rollout function inside a capture scope), its last chat exchange's request messages and
        first choice, as `outcome.episode_items` reads the live one."""
        if self.messages_and_choices or not self.exchanges:
            return self.messages_and_choices
        chats = _dicts(self.exchanges.get("chat_completions"))
        if not chats:
            return []
        request, response = chats[-1].get("request"), chats[-1].get("response")
        sent = _dicts(request.get("messages")) if isinstance(request, dict) else []
        choices = _dicts(response.get("choices")) if isinstance(response, dict) else []
        return [*sent, *choices[:1]]

    @property
    def episode(self) -> tuple[Message, ...]:
        """Every message of the episode, in order (a sampled turn as its assistant message)."""
        return tuple(message_of(item) for item in self.items)

    @property
    def opening(self) -> tuple[Message, ...]:
        """The messages before the first assistant turn: the prompt."""
        episode = self.episode
        first = next((i for i, m in enumerate(episode) if m.role == "assistant"), len(episode))
        return episode[:first]

    @property
    def completion(self) -> str:
        """The last sampled turn's text (a plain assistant message where none was sampled:
        a file of the layout before, a relabelled turn): what a single-turn reward scored."""
        episode = self.episode
        last = [m for m in episode if m.sampled] or [m for m in episode if m.role == "assistant"]
        return last[-1].content if last else ""

    @property
    def multi_turn(self) -> bool:
        """More than one assistant turn, or any tool call: an episode worth showing whole."""
        episode = self.episode
        return sum(m.role == "assistant" for m in episode) > 1 or any(
            m.tool_calls or m.role == "tool" for m in episode
        )

    @property
    def correct(self) -> bool:
        return correct_from(self.reward, self.metrics)

    @property
    def scenario_id(self) -> str:
        return str(self.metadata.get("scenario_id") or "?")

    @property
    def feedback(self) -> str:
        value = self.metadata.get("feedback")
        return value if isinstance(value, str) else ""

    def meta_int(self, key: str) -> int | None:
        """An integer metadata entry (`sample`, `seed` of mode=eval's rollouts), else None."""
        value = self.metadata.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def meta_str(self, key: str) -> str | None:
        value = self.metadata.get(key)
        return value if isinstance(value, str) else None


class StoredGroup(BaseModel):
    """One `art.TrajectoryGroup` as JSON: a line of a trajectories file."""

    model_config = ConfigDict(frozen=True, extra="allow")

    format: Literal["art_rlvr.trajectory_group/1"] = FORMAT
    trajectories: list[StoredTrajectory] = Field(default_factory=list)
    exceptions: list[JsonDict] = Field(default_factory=list)
    metadata: JsonDict = Field(default_factory=dict)
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)

    def to_art(self) -> art.TrajectoryGroup:
        import art

        data = self.model_dump(mode="json", exclude={"format", "trajectories"})
        return art.TrajectoryGroup.model_validate(
            {**data, "trajectories": [t.to_art() for t in self.trajectories]}
        )


def stored_trajectory(trajectory: art.Trajectory) -> StoredTrajectory:
    """A trajectory as stored (metadata a JSON dump cannot hold is written as its text)."""
    data = trajectory.model_dump(mode="json", fallback=str)
    return StoredTrajectory.model_validate(
        {**data, "start_time": trajectory.start_time.isoformat()}
    )


def stored_group(group: art.TrajectoryGroup) -> StoredGroup:
    data = group.model_dump(mode="json", exclude={"trajectories"}, fallback=str)
    return StoredGroup.model_validate(
        {**data, "trajectories": [stored_trajectory(t) for t in group.trajectories]}
    )


def group_lines(groups: Iterable[art.TrajectoryGroup]) -> str:
    """The text of a trajectories file: one group a line."""
    return "".join(stored_group(g).model_dump_json() + "\n" for g in groups)


def read_trajectories(path: Path) -> list[StoredTrajectory]:
    """Every trajectory of a trajectories file, group after group."""
    return [t for g in read_groups(path) for t in g.trajectories]


def read_groups(path: Path) -> list[StoredGroup]:
    """A trajectories file's groups. A line a crash cut short is skipped; a row of the layout
    before this one is a group of one trajectory; any other line is `TrajectoryFileError`."""
    groups = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            raw = json.loads(line)
        except json.JSONDecodeError:
            continue
        try:
            groups.append(parse_group(raw))
        except TrajectoryFileError as error:
            raise TrajectoryFileError(f"{path}:{number}: {error}") from None
    return groups


def parse_group(raw: object) -> StoredGroup:
    """A stored group from a line's JSON value (an old-layout row as a group of one)."""
    if not isinstance(raw, dict):
        raise TrajectoryFileError("not a JSON object")
    if raw.get("format") == FORMAT:
        try:
            return StoredGroup.model_validate(raw)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the line"
            raise TrajectoryFileError(f"{where}: {first['msg']}") from None
    if "format" not in raw and ("messages" in raw or "completion" in raw):
        return StoredGroup(trajectories=[legacy_trajectory(raw)])
    found = raw.get("format")
    raise TrajectoryFileError(
        f"no stored trajectory group (format {found!r}, expected {FORMAT!r}); "
        "written by a newer art_rlvr?"
        if found
        else "no stored trajectory group and no row of the layout before it"
    )


def legacy_trajectory(row: Mapping[str, Any]) -> StoredTrajectory:
    """A row as `runfiles.trajectory_row` wrote it before the whole trajectory was kept: the
    messages, then `tail` (the last sampled turn and what followed) or the completion as a
    plain assistant message (its token data was never stored)."""
    completion = row.get("completion")
    tail = _dicts(row.get("tail")) or (
        [{"role": "assistant", "content": completion}] if completion is not None else []
    )
    metrics = {
        k: v for k, v in (row.get("metrics") or {}).items() if isinstance(v, int | float | bool)
    }
    if "correct" not in metrics and isinstance(row.get("correct"), bool):
        metrics["correct"] = float(row["correct"])
    keys = ("scenario_id", "prompt_hash", "feedback", "sample", "seed")
    return StoredTrajectory(
        messages_and_choices=[*_dicts(row.get("messages")), *tail],
        reward=float(row["reward"]) if isinstance(row.get("reward"), int | float) else 0.0,
        metrics=metrics,
        metadata={k: row[k] for k in keys if row.get(k) is not None},
        logs=[str(line) for line in row.get("logs") or []],
    )


def message_of(item: Mapping[str, object]) -> Message:
    """An item of `messages_and_choices` as a `Message` (a choice dict: its assistant
    message, marked sampled)."""
    sampled = _is_choice(item)
    inner = item["message"] if sampled else None
    m: Mapping[str, object] = inner if isinstance(inner, dict) else item
    listed = m.get("tool_calls") or []
    calls = [c for c in listed if isinstance(c, dict)] if isinstance(listed, list) else []
    content = m.get("content")
    return Message(
        role="assistant" if sampled else str(m.get("role", "?")),
        content=content if isinstance(content, str) else json.dumps(content) if content else "",
        tool_calls=tuple(_tool_call(c) for c in calls),
        tool_call_id=str(m["tool_call_id"]) if m.get("tool_call_id") is not None else None,
        name=str(m["name"]) if m.get("name") is not None else None,
        sampled=sampled,
    )


def _tool_call(call: Mapping[str, object]) -> ToolCall:
    """An OpenAI-shaped call (`function.name`, `function.arguments`), arguments kept as text."""
    function = fn if isinstance(fn := call.get("function"), dict) else {}
    arguments = function.get("arguments", "")
    return ToolCall(
        id=str(call.get("id") or ""),
        name=str(function.get("name") or "?"),
        arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
    )


def _is_choice(item: Mapping[str, object]) -> bool:
    return item.keys() >= _CHOICE_KEYS


def _restored(items: list[JsonDict]) -> list[Choice | JsonDict]:
    from openai.types.chat.chat_completion import Choice

    return [Choice.model_validate(i) if _is_choice(i) else i for i in items]


def _dicts(value: object) -> list[JsonDict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
