"""Scenario definitions: how to load records, render messages and score a completion.

A definition lives in a TOML file (`scenarios/<name>.toml`, or any path). Only the definition
knows the record's fields: it renders `user_template` with them and names the reward that reads
them. Everything downstream sees an opaque record `x`, messages, and a `Score`.

A definition may also name an `[environment]` (see scenarios.environments): then a record runs
as an episode of several turns, with tools, an environment that answers each turn and a reward
over the whole episode. `Example.episode()` says how one record runs; a scenario without an
environment is the one-turn case (no tools, no answers, its `[reward]` on the one reply).
"""

from __future__ import annotations

import functools
import logging
import random
import string
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, ValidationError

from art_rlvr.core.callbacks import CallbackTimeout, call_within, within
from art_rlvr.core.text import did_you_mean
from art_rlvr.core.types import CORRECT_THRESHOLD, Episode, Messages, correct_rule
from art_rlvr.observe import tracing
from art_rlvr.scenarios.environments import Environment, EnvironmentConfigError, make_environment
from art_rlvr.scenarios.environments.rollout_fn import (
    RolloutFunction,
    RolloutFunctionConfigError,
    check_rollout_function,
    load_rollout_function,
)
from art_rlvr.scenarios.rewards import Score, make_reward
from art_rlvr.scenarios.rewards.base import (
    RewardConfigError,
    RewardFn,
    RewardTypeError,
    as_score,
    first_error,
)
from art_rlvr.scenarios.sources import SOURCES, SPLITS, ScenarioFileError

log = logging.getLogger(__name__)


def scenarios_dir() -> Path:
    """Built-in definitions: inside the wheel, or the repo's `scenarios/` in a checkout."""
    package = Path(__file__).resolve().parents[1]  # art_rlvr/
    packaged = package / "_scenarios"
    return packaged if packaged.is_dir() else package.parent / "scenarios"


def builtin_scenarios() -> list[str]:
    return sorted(p.stem for p in scenarios_dir().glob("*.toml"))


USER_REWARD_TIMEOUT_S = 30.0


class RewardSpec(BaseModel):
    """`[reward]`: a built-in reward or `module:function`, its params, and how long one call may
    take (default: 30 s for a user's reward; none for a built-in one, which bounds itself: the
    code reward by its sandbox's timeout, the math reward by its verifier's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    params: dict[str, object] = Field(default_factory=dict)
    timeout_s: float | None = Field(default=None, gt=0)

    @property
    def user(self) -> bool:
        return ":" in self.name

    @property
    def limit_s(self) -> float | None:
        """The timeout a call runs under (None: no limit beyond the reward's own)."""
        return self.timeout_s or (USER_REWARD_TIMEOUT_S if self.user else None)


class EnvironmentSpec(BaseModel):
    """`[environment]`: a factory by built-in name or `module:function`, called with `params`,
    and the limits its episodes run under."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    params: dict[str, object] = Field(default_factory=dict)
    max_turns: int | None = Field(default=None, ge=1, le=256)  # default: the environment's
    timeout_s: float = Field(default=30.0, gt=0)  # each call of respond / reward
    tool_timeout_s: float = Field(default=10.0, gt=0)  # each tool call
    tool_choice: str | None = None  # "auto", "required", "none" or a tool's name


class RolloutSpec(BaseModel):
    """`[rollout]`: an ART rollout function (`module:function` or `file.py:function`) that runs
    each record and sets its own reward, how long one call may take, and the reward at or
    above which an episode is correct when the function sets no `correct` metric (its rewards
    are ART's, any real number: -100 for an illegal move, 2 for a win)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    function: str
    timeout_s: float = Field(default=300.0, gt=0)
    correct_threshold: FiniteFloat = CORRECT_THRESHOLD


class ScenarioSpec(BaseModel):
    """The TOML file's schema."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    system_prompt: str = ""
    user_template: str | None = None  # required unless the environment opens episodes
    id_field: str | None = None
    source: dict[str, object]
    reward: RewardSpec | None = None  # required unless the environment scores episodes
    environment: EnvironmentSpec | None = None
    rollout: RolloutSpec | None = None  # a user's ART rollout function runs each record
    # completion tokens per turn that fit this scenario's episodes (a whole tool call, say);
    # the run's `max_tokens=` overrides it, and a scenario without one takes the run's default
    max_tokens: int | None = Field(default=None, ge=1, le=4096)


@dataclass(frozen=True)
class Example:
    """One record of a scenario: `x` is opaque; `scenario` knows how to render and score it."""

    id: str
    split: str
    x: dict[str, object] = field(repr=False)
    scenario: Scenario = field(repr=False, compare=False)

    def messages(self, system_prompt: str | None = None) -> list[dict[str, str]]:
        return self.scenario.render(self, system_prompt)

    def episode(
        self, system_prompt: str | None = None, messages: Messages | None = None
    ) -> Episode:
        """How this record runs under `system_prompt` (or from explicit opening `messages`)."""
        return self.scenario.episode(self, system_prompt, messages)

    @tracing.op("art_rlvr.score", inputs=tracing.score_inputs)
    async def score(self, completion: str) -> Score:
        return await self.scenario.score(self, completion)


@dataclass(frozen=True)
class Scenario:
    """A loaded scenario definition with its records split into train / val / test."""

    spec: ScenarioSpec
    splits: dict[str, list[Example]]
    reward: RewardFn | None
    path: Path
    environment: Environment | None = None
    rollout_fn: RolloutFunction | None = None  # `[rollout]`: the user's function runs records

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def default_system_prompt(self) -> str:
        return self.spec.system_prompt

    @property
    def correct_at(self) -> float:
        """The reward at or above which an episode without a `correct` metric is correct."""
        rollout = self.spec.rollout
        return rollout.correct_threshold if rollout is not None else CORRECT_THRESHOLD

    @property
    def correct_rule(self) -> str:
        """How this scenario's episodes are judged correct, in words (run files, the report)."""
        declared = self.spec.rollout is not None and (
            "correct_threshold" in self.spec.rollout.model_fields_set
        )
        return correct_rule(self.correct_at, "the scenario's correct_threshold" if declared else "")

    @property
    def spec_max_tokens(self) -> int | None:
        """The completion length the scenario file asks for, if any."""
        return self.spec.max_tokens

    @property
    def scenarios(self) -> tuple[Scenario, ...]:
        return (self,)

    def held_out(self, split: str, limit: int | None = None) -> list[Example]:
        """The first `limit` records of `split` (all of them without a limit)."""
        return self.splits[split][:limit]

    def train_batch(self, size: int, seed: int, batch: int) -> list[Example]:
        """RL batch `batch`: a pure function of (seed, batch), so a resumed run draws it again."""
        return batch_examples(self.splits["train"], size, seed, batch)

    def render(self, example: Example, system_prompt: str | None = None) -> list[dict[str, str]]:
        s = self.spec.system_prompt if system_prompt is None else system_prompt
        if self.rollout_fn is not None:  # the function writes the rest of its messages
            return [{"role": "system", "content": s}] if s else []
        env = self.environment
        if env is not None and env.opening is not None:
            opening = [dict(m) for m in env.opening(example.x)]
        else:
            assert self.spec.user_template is not None  # checked by load_scenario
            opening = [{"role": "user", "content": self.spec.user_template.format_map(example.x)}]
        return ([{"role": "system", "content": s}] if s else []) + opening

    def episode(
        self,
        example: Example,
        system_prompt: str | None = None,
        messages: Messages | None = None,
    ) -> Episode:
        opening = messages if messages is not None else self.render(example, system_prompt)
        env, spec = self.environment, self.spec.environment
        if env is None or spec is None:
            return Episode(messages=opening, max_turns=1)
        return Episode(
            messages=opening,
            tools=env.tools,
            respond=functools.partial(env.respond, example.x) if env.respond else None,
            reward=functools.partial(env.reward, example.x) if env.reward else None,
            max_turns=spec.max_turns or env.max_turns,
            timeout_s=spec.timeout_s,
            tool_timeout_s=spec.tool_timeout_s,
            tool_choice=spec.tool_choice,
        )

    def scorer(
        self, example: Example, completion: str
    ) -> tuple[Callable[..., object], tuple[object, ...], float | None]:
        """The reward to call, its arguments and its timeout (None: a built-in reward, which
        bounds itself)."""
        if self.reward is None:
            assert self.environment is not None and self.environment.reward is not None
            episode = [*self.render(example), {"role": "assistant", "content": completion}]
            limit = self.spec.environment.timeout_s if self.spec.environment else None
            return self.environment.reward, (example.x, episode), limit
        limit = self.spec.reward.limit_s if self.spec.reward is not None else None
        return self.reward, (example.x, completion), limit

    async def score(self, example: Example, completion: str) -> Score:
        """R(x, y), off the event loop (a sync reward in a thread of its own) under the reward's
        timeout. Garbage output scores 0; a reward that outlives its timeout scores 0 and says
        so in the log; a reward that raises is a bug and says so. With an environment that
        scores episodes, `completion` is scored as a one-reply episode."""
        completion = completion if isinstance(completion, str) else ""
        fn, args, limit = self.scorer(example, completion)
        what = f"the reward of {self.name}"
        try:
            result = await within(fn, args, timeout_s=limit, what=what)
        except CallbackTimeout as error:
            log.warning("%s on record %r; scored 0", error, example.id)
            return Score(reward=0.0, feedback=f"{error}; scored 0", metrics={"correct": 0.0})
        try:
            return as_score(result)
        except RewardTypeError as error:
            raise RewardTypeError(f"{what} {error}") from None


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
            f"unknown scenario {name_or_path!r}{did_you_mean(name_or_path, builtin_scenarios())}; "
            f"built-in: {', '.join(builtin_scenarios())} (or a path to a .toml file)"
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


def load_scenario(
    name_or_path: str, *, seed: int = 0, overrides: dict[str, object] | None = None
) -> Scenario:
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
    overrides = overrides or {}
    source_raw = {**spec.source, **overrides}
    source, loader = source_of(
        source_raw,
        _source_where(path, text, "type", overrides),
        lambda error, kind: source_error(error, kind, path, text, overrides),
    )
    rollout_fn = load_rollout(spec, path, text)
    environment = load_environment(spec, path, text)
    reward = None
    if spec.reward is not None:
        try:
            reward = make_reward(spec.reward.name, spec.reward.params, near=path.parent)
        except RewardConfigError as error:
            key = "name" if str(error).startswith("unknown reward") else "params"
            raise ScenarioFileError(f"{_where(path, text, ('reward', key))}: {error}") from None
    elif rollout_fn is None and (environment is None or environment.reward is None):
        raise ScenarioFileError(
            f"{path}: field 'reward': a [reward] table is required "
            "(unless an [environment] scores its episodes or a [rollout] function runs them)"
        )
    opened = rollout_fn is not None or (environment is not None and environment.opening)
    if spec.user_template is None and not opened:
        raise ScenarioFileError(
            f"{path}: field 'user_template': required (unless an [environment] opens its episodes)"
        )
    records = loader(source, path.parent, seed)
    scenario = Scenario(
        spec=spec, splits={}, reward=reward, path=path, environment=environment,
        rollout_fn=rollout_fn,
    )  # fmt: skip
    fill_splits(scenario, records, path)
    user_reward = spec.reward is not None and ":" in spec.reward.name  # try it once, now
    if user_reward and (problem := reward_problem(scenario)):
        raise ScenarioFileError(f"{_where(path, text, ('reward', 'name'))}: {problem}")
    return scenario


def fill_splits(
    scenario: Scenario, records: dict[str, list[dict[str, object]]], path: Path
) -> None:
    """The scenario's examples, split by split, each record checked against `user_template`."""
    spec = scenario.spec
    needed = _template_fields(spec.user_template or "")
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
                Example(
                    id=str(ident or f"{spec.name}-{split}-{index}"),
                    split=split,
                    x=x,
                    scenario=scenario,
                )
            )
        scenario.splits[split] = items


def load_rollout(spec: ScenarioSpec, path: Path, text: str) -> RolloutFunction | None:
    """The `[rollout]` function, imported and checked; a scenario that also says how to render
    or score records is refused (the function does both), as is a function that cannot run."""
    if spec.rollout is None:
        return None
    for key in ("reward", "environment", "user_template"):
        if getattr(spec, key) is not None:
            loc = (key,) if key == "user_template" else (key, "name")
            raise ScenarioFileError(
                f"{_where(path, text, loc)}: {key!r} cannot be used with [rollout]: the "
                "rollout function builds its own messages and sets its own reward"
            )
    try:
        return load_rollout_function(spec.rollout.function, near=path.parent)
    except RolloutFunctionConfigError as error:
        raise ScenarioFileError(f"{_where(path, text, ('rollout', 'function'))}: {error}") from None


def rollout_scenario(
    fn: Callable[..., object],
    *,
    source: dict[str, object],
    name: str | None = None,
    system_prompt: str = "",
    timeout_s: float = 300.0,
    max_tokens: int | None = None,
    id_field: str | None = None,
    seed: int = 0,
    near: Path | None = None,
) -> Scenario:
    """The Python form of a `[rollout]` scenario: `fn` (ART's `async def rollout(model, record)`,
    or with a third `context` parameter) runs each record of `source` (a `[source]` table as a
    dict; relative paths start at `near`, default the working directory)."""
    ref = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
    checked = check_rollout_function(fn, ref)
    folder = Path.cwd() if near is None else near
    spec = ScenarioSpec(
        name=name or str(getattr(fn, "__name__", "rollout")),
        system_prompt=system_prompt,
        id_field=id_field,
        source=source,
        rollout=RolloutSpec(function=ref, timeout_s=timeout_s),
        max_tokens=max_tokens,
    )
    validated, loader = source_of(
        source, "source.type", lambda error, _: f"source: {first_error(error)}"
    )
    scenario = Scenario(
        spec=spec, splits={}, reward=None, path=folder / f"{spec.name}.py", rollout_fn=checked
    )
    fill_splits(scenario, loader(validated, folder, seed), folder)
    return scenario


def source_of(
    raw: dict[str, object], where: str, error_text: Callable[[ValidationError, str], str]
) -> tuple[Any, Any]:
    """A `[source]` table validated against its type's schema, and that type's loader; `where`
    says where the type was set, `error_text` words a schema error (kind given)."""
    kind = raw.get("type")
    if kind not in SOURCES:
        raise ScenarioFileError(
            f"{where}: {kind!r} is no source type{did_you_mean(str(kind), SOURCES)}; "
            f"known: {', '.join(sorted(SOURCES))}"
        )
    schema, loader = SOURCES[kind]
    try:
        return schema.model_validate(raw), loader
    except ValidationError as error:
        raise ScenarioFileError(error_text(error, kind)) from None


def _source_where(path: Path, text: str, key: str, overrides: dict[str, object]) -> str:
    """Where a `[source]` key was set, and the key: `source.k=v (command line)` when the
    command line set it, else `file:line: source.k`."""
    if key in overrides:
        return f"source.{key}={overrides[key]} (command line)"
    return f"{_where(path, text, ('source', key))}: source.{key}"


def source_error(
    error: ValidationError, kind: str, path: Path, text: str, overrides: dict[str, object]
) -> str:
    """A `[source]` table's first error on one line: where it was set (file:line or the command
    line), the key, and for an unknown key the closest known one and the list."""
    schema = SOURCES[kind][0]
    first = error.errors()[0]
    key = str(first["loc"][0]) if first["loc"] else ""
    if not key:  # a check across keys
        return f"{_where(path, text, ('source',))}: source: {first_error(error)}"
    where = _source_where(path, text, key, overrides)
    if first["type"] == "extra_forbidden":
        known = [k for k in schema.model_fields if k != "type"]
        return (
            f"{where}: no such key{did_you_mean(key, known)}; the {kind} source has "
            f"{', '.join(known)}"
        )
    return f"{where}: {first_error(error).partition(': ')[2]}"


def reward_problem(scenario: Scenario) -> str | None:
    """Why a user's reward cannot score this scenario, found by calling it once on the first record
    with an empty reply (what a model may well answer): it raises, or it returns something that
    is no score. None when it is fine. Found here, this costs milliseconds; found in the run, it
    costs a model load and a round of generation first."""
    first = next((items[0] for items in scenario.splits.values() if items), None)
    if first is None or scenario.reward is None:
        return None
    name = scenario.spec.reward.name if scenario.spec.reward else "reward"
    limit = (
        scenario.spec.reward.limit_s if scenario.spec.reward else None
    ) or USER_REWARD_TIMEOUT_S
    try:
        as_score(
            call_within(scenario.reward, (first.x, ""), timeout_s=limit, what=f"reward {name!r}")
        )
    except CallbackTimeout as error:
        return (
            f"{error} on record {first.id!r} with an empty reply (reward.timeout_s); a reward "
            "must return promptly"
        )
    except RewardTypeError as error:
        return f"reward {name!r} {error} (tried on record {first.id!r} with an empty reply)"
    except Exception as error:
        return (
            f"reward {name!r} raised {type(error).__name__}: {error} on record {first.id!r} with "
            "an empty reply; a reward scores any reply and never raises"
        )
    return None


def load_environment(spec: ScenarioSpec, path: Path, text: str) -> Environment | None:
    """The `[environment]` factory's product; a bad name or params is a file:line error."""
    if spec.environment is None:
        return None
    try:
        environment = make_environment(spec.environment.name, spec.environment.params)
    except EnvironmentConfigError as error:
        key = "params" if str(error).startswith("bad parameters") else "name"
        raise ScenarioFileError(f"{_where(path, text, ('environment', key))}: {error}") from None
    if problem := tool_choice_problem(spec.environment.tool_choice, environment.tools):
        raise ScenarioFileError(f"{_where(path, text, ('environment', 'tool_choice'))}: {problem}")
    return environment


def tool_choice_problem(choice: str | None, tools: Sequence[Callable[..., object]]) -> str | None:
    """Why `choice` cannot be asked for with `tools` (a server would answer every request with
    a 400, so every episode would error), or None."""
    if choice is None or choice in ("auto", "none", "required"):
        return None
    names = sorted(str(getattr(t, "name", None) or getattr(t, "__name__", "?")) for t in tools)
    if choice not in names:
        listed = ", ".join(names) if names else "it has none"
        return f"tool_choice {choice!r} is not auto, none, required or one of its tools ({listed})"
    return None


def batch_examples(pool: Sequence[Example], size: int, seed: int, batch: int) -> list[Example]:
    """Batch `batch` of an endless stream of seeded per-epoch shuffles of `pool`."""
    return [stream_item(pool, seed, p) for p in range(batch * size, (batch + 1) * size)]


def stream_item(pool: Sequence[Example], key: object, position: int) -> Example:
    """Item `position` of an endless stream of per-epoch shuffles of `pool` seeded by `key`."""
    if not pool:
        raise ValueError("the train split is empty")
    epoch, index = divmod(position, len(pool))
    order = list(range(len(pool)))
    random.Random(f"order:{key}:{epoch}").shuffle(order)
    return pool[order[index]]
