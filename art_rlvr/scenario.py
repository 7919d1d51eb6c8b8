"""Scenario definitions: how to load records, render messages and score a completion.

A definition lives in a TOML file (`scenarios/<name>.toml`, or any path). Only the definition
knows the record's fields: it renders `user_template` with them and names the reward that reads
them. Everything downstream sees an opaque record `x`, messages, and a `Score`.
"""

from __future__ import annotations

import inspect
import random
import string
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from art_rlvr.observe import tracing
from art_rlvr.rewards import Score, make_reward
from art_rlvr.rewards.base import RewardConfigError, RewardFn, first_error
from art_rlvr.sources import SOURCES, SPLITS, ScenarioFileError


def scenarios_dir() -> Path:
    """Built-in definitions: inside the wheel, or the repo's `scenarios/` in a checkout."""
    packaged = Path(__file__).parent / "_scenarios"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[1] / "scenarios"


def builtin_scenarios() -> list[str]:
    return sorted(p.stem for p in scenarios_dir().glob("*.toml"))


class RewardSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class ScenarioSpec(BaseModel):
    """The TOML file's schema."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    system_prompt: str = ""
    user_template: str
    id_field: str | None = None
    source: dict[str, Any]
    reward: RewardSpec


@dataclass(frozen=True)
class Scenario:
    """One record of a task: `x` is opaque; `task` knows how to render and score it."""

    id: str
    split: str
    x: dict[str, Any] = field(repr=False)
    task: Task = field(repr=False, compare=False)

    def messages(self, system_prompt: str | None = None) -> list[dict[str, str]]:
        return self.task.render(self, system_prompt)

    @tracing.op("art_rlvr.score", inputs=tracing.score_inputs)
    async def score(self, completion: str) -> Score:
        return await self.task.score(self, completion)


@dataclass(frozen=True)
class Task:
    """A loaded scenario definition with its records split into train / val / test."""

    spec: ScenarioSpec
    splits: dict[str, list[Scenario]]
    reward: RewardFn
    path: Path

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def default_system_prompt(self) -> str:
        return self.spec.system_prompt

    def render(self, scenario: Scenario, system_prompt: str | None = None) -> list[dict[str, str]]:
        s = self.spec.system_prompt if system_prompt is None else system_prompt
        user = self.spec.user_template.format_map(scenario.x)
        return ([{"role": "system", "content": s}] if s else []) + [
            {"role": "user", "content": user}
        ]

    async def score(self, scenario: Scenario, completion: str) -> Score:
        """R(x, y). Garbage output scores 0; a reward that raises is a bug and says so."""
        result = self.reward(scenario.x, completion if isinstance(completion, str) else "")
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, Score):
            raise TypeError(f"reward for {self.name} returned {type(result).__name__}, not Score")
        return result


def _template_fields(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f}


def _locate(name_or_path: str) -> Path:
    candidate = Path(name_or_path).expanduser()
    if candidate.suffix == ".toml" or candidate.exists():
        if not candidate.is_file():
            raise ScenarioFileError(f"{candidate}: scenario file not found")
        return candidate
    builtin = scenarios_dir() / f"{name_or_path}.toml"
    if not builtin.is_file():
        raise ScenarioFileError(
            f"unknown scenario {name_or_path!r}; built-in scenarios: {builtin_scenarios()} "
            "(or give a path to a .toml file)"
        )
    return builtin


def toml_line(text: str, table: str | None, key: str | None) -> int | None:
    """1-based line where `key` is set in `[table]` (or the table's header): for error messages."""
    current, header = None, None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("[") and not stripped.startswith("[["):
            current = stripped.strip("[]").strip()
            header = number if current == table else header
            continue
        name = stripped.partition("=")[0].strip()
        if key is not None and current == table and name == key:
            return number
        if current is None and table is not None and name == table:
            return number  # an inline table: `reward = { name = ... }`
    return header


def _where(path: Path, text: str, loc: tuple[str | int, ...]) -> str:
    """`file:line` for a location in the spec (`file` when the line is unknown)."""
    parts = [str(part) for part in loc]
    table, key = (parts[0], parts[1]) if len(parts) > 1 else (None, parts[0] if parts else None)
    line = toml_line(text, table, key)
    if line is None and table is not None:
        line = toml_line(text, None, table)
    return f"{path}:{line}" if line is not None else str(path)


def load_task(name_or_path: str, *, seed: int = 0, overrides: dict[str, Any] | None = None) -> Task:
    """Load a scenario by built-in name or path; `overrides` patch its `[source]` table."""
    path = _locate(name_or_path)
    text = path.read_text(encoding="utf-8")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ScenarioFileError(f"{path}: not valid TOML ({error})") from None
    try:
        spec = ScenarioSpec.model_validate(raw)
    except ValidationError as error:
        loc = error.errors()[0]["loc"]
        where = ".".join(str(p) for p in loc)
        raise ScenarioFileError(
            f"{_where(path, text, loc)}: field {where!r}: {error.errors()[0]['msg']}"
        ) from None
    source_raw = {**spec.source, **(overrides or {})}
    kind = source_raw.get("type")
    if kind not in SOURCES:
        raise ScenarioFileError(
            f"{_where(path, text, ('source', 'type'))}: source.type {kind!r} unknown; "
            f"known: {sorted(SOURCES)}"
        )
    schema, loader = SOURCES[kind]
    try:
        source = schema.model_validate(source_raw)
    except ValidationError as error:
        loc = ("source", *error.errors()[0]["loc"])
        raise ScenarioFileError(f"{_where(path, text, loc)}: source.{first_error(error)}") from None
    try:
        reward = make_reward(spec.reward.name, spec.reward.params)
    except RewardConfigError as error:
        key = "name" if str(error).startswith("unknown reward") else "params"
        raise ScenarioFileError(f"{_where(path, text, ('reward', key))}: {error}") from None
    records = loader(source, path.parent, seed)
    needed = _template_fields(spec.user_template)
    splits: dict[str, list[Scenario]] = {}
    task = Task(spec=spec, splits=splits, reward=reward, path=path)
    for split in SPLITS:
        items = []
        for index, x in enumerate(records.get(split, [])):
            missing = needed - x.keys()
            if missing:
                raise ScenarioFileError(
                    f"{path}: a {split} record lacks field(s) {sorted(missing)} "
                    "used by user_template"
                )
            ident = str(x[spec.id_field]) if spec.id_field and spec.id_field in x else x.get("id")
            items.append(
                Scenario(
                    id=str(ident or f"{spec.name}-{split}-{index}"), split=split, x=x, task=task
                )
            )
        splits[split] = items
    return task


def batch_scenarios(pool: Sequence[Scenario], size: int, seed: int, batch: int) -> list[Scenario]:
    """Batch `batch` of an endless stream of seeded per-epoch shuffles of `pool`."""
    if not pool:
        raise ValueError("the train split is empty")
    out: list[Scenario] = []
    start = batch * size
    for position in range(start, start + size):
        epoch, index = divmod(position, len(pool))
        order = list(range(len(pool)))
        random.Random(f"order:{seed}:{epoch}").shuffle(order)
        out.append(pool[order[index]])
    return out
