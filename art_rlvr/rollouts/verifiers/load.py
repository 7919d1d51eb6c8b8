"""A verifiers 0.4 environment as an art_rlvr `Task`: its taskset's tasks are the records, and
the rollout function (`VerifiersRunner`) runs one as a verifiers episode and returns the
`art.Trajectory` RL, evaluation and GEPA consume.

Each episode goes through verifiers' own machinery (`Env.run_episode` inside `env.serving()`:
the interception proxy records every model call and forwards it to the policy's endpoint, a
task's MCP toolsets start per rollout, the task's `@vf.reward`/`@vf.metric` methods score the
trace). The endpoint is always the policy's (`model.inference_base_url`, the step's
`model.get_inference_name(...)`), the runtime a local subprocess: never Prime's hosted
defaults. The trace's messages become the trajectory (sampled turns as `Choice`s, branches of a
multi-turn env as extra histories); TorchBackend finds each turn's served token ids again from
them. The reward is the trace's (Σ score·weight, any finite number: ART trains any real
reward), each reward and metric is logged as `vf/<name>`; a trace verifiers marked failed (a
rubric that raised, a harness, tool or provider error) scores 0 with verifiers' error text as
the reason.

The Env's config is shaped as its author declared it: every seat the Env declares (`agent`,
kuhn poker's `player0`/`player1`, code golf's `golfer`) plays on art_rlvr's harness in a local
subprocess runtime, with the file's seat settings on top; one seat's trace trains (`seat`),
the others play the policy as part of the environment. An infinite taskset (`INFINITE`) is read
only as far as the splits reach.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import os
import random
import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from art_rlvr.core.types import Record
from art_rlvr.rollouts.verifiers.spec import (
    HARNESS,
    PREFIX,
    VerifiersSpec,
    seat_problem,
    split_ranges,
    tasks_needed,
    trained_seat,
)
from art_rlvr.scenarios.environments.rollout_fn import RolloutFailed, RolloutFunction
from art_rlvr.scenarios.mixture import Mixture, load_scenarios
from art_rlvr.scenarios.scenario import RolloutSpec, Scenario, ScenarioSpec, fill_splits, toml_line
from art_rlvr.scenarios.sources import ScenarioFileError

if TYPE_CHECKING:
    import art

    from art_rlvr.rollouts.functions import RolloutContext

CHOICE_FINISH = ("stop", "length", "tool_calls")


class VerifiersLoadError(ValueError):
    """A verifiers environment that cannot load (worded for one line)."""


def import_verifiers() -> Any:
    """`verifiers.v1`, imported now (9-20 s on 2 cores): only a verifiers scenario pays it."""
    try:
        import verifiers.v1 as vf
    except ImportError as error:
        raise VerifiersLoadError(
            f"verifiers is not installed ({error}); install the extra: "
            "pip install 'art-rlvr[verifiers]' (verifiers==0.4.0)"
        ) from None
    return vf


def seat_config(spec: VerifiersSpec, settings: dict[str, Any]) -> dict[str, object]:
    """One seat's agent config: the file's settings for it, on the chosen harness (its
    settings merged) in a local subprocess runtime, under the episode timeout."""
    harness = {"id": spec.harness, **spec.harness_args, **settings.get("harness", {})}
    seat = {
        **settings,
        "harness": harness,
        "runtime": {"type": "subprocess"},
        "timeout": {"rollout": spec.timeout_s, **settings.get("timeout", {})},
    }
    if spec.max_turns is not None:
        seat.setdefault("max_turns", spec.max_turns)
    return seat


def env_config(spec: VerifiersSpec, seats: Iterable[str]) -> dict[str, object]:
    """The Env config verifiers validates: the taskset, and each seat the Env declares."""
    settings = spec.seat_settings
    return {
        **spec.env_args,
        "taskset": {**spec.args, "id": spec.id},
        **{seat: seat_config(spec, settings.get(seat, {})) for seat in seats},
    }


def declared_seats(vf: Any, spec: VerifiersSpec) -> list[str]:
    """The seats (agent roles) the taskset's Env declares, in order: `agent` for the single-
    agent env, whatever names a multi-agent one gives them."""
    cls = vf.env_config_type(spec.id, str(spec.env_args.get("id", "")))
    return [n for n, f in cls.model_fields.items() if isinstance(f.default, vf.AgentConfig)]


def taken(spec: VerifiersSpec, taskset: Any) -> list[Any]:
    """The tasks, in order: all of a finite taskset; of an infinite one, as many as the splits
    read (it would never end otherwise), or a "not supported" line when they read to its end."""
    if taskset.bounded:
        return list(taskset)
    try:
        bound = tasks_needed(spec)
    except ValueError as error:
        raise VerifiersLoadError(f"taskset {spec.id!r}: {error}") from None
    if bound is None:
        raise VerifiersLoadError(
            f"not supported: taskset {spec.id!r} is infinite (it yields tasks forever) and the "
            "splits read to its end; give every split as a count or a closed 'start:stop' range"
        )
    return list(itertools.islice(taskset, bound))


def register_harness() -> None:
    """Make art_rlvr's harness importable under its id. verifiers imports a harness by a
    top-level module name (a dotted id fails its namespace probe), so the module is entered
    in `sys.modules` under `HARNESS`, as a plugin registry would."""
    from art_rlvr.rollouts.verifiers import harness

    sys.modules.setdefault(HARNESS, harness)


def module_name(ident: str) -> str:
    """The module verifiers imports for a taskset id (`owner/name@v` -> `name`, `-` -> `_`)."""
    return ident.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def share_module_path(name: str) -> None:
    """Put the folder the taskset module was imported from on `PYTHONPATH`: verifiers starts
    a task's MCP toolset as `python -m <module>` with this process's environment."""
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    if file is None or "." in name:
        return
    root = str(Path(file).resolve().parents[1 if Path(file).name == "__init__.py" else 0])
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *parts])


def load_env(spec: VerifiersSpec, near: Path | None = None) -> tuple[Any, list[Any], str]:
    """(the verifiers Env, its tasks in order, the seat that trains); every way loading fails
    is one line. A module beside the scenario file (`near`) is found there."""
    vf = import_verifiers()
    if spec.harness == HARNESS:
        register_harness()
    name = module_name(spec.id)
    beside = near is not None and ((near / f"{name}.py").is_file() or (near / name).is_dir())
    if beside and name not in sys.modules and str(near) not in sys.path:
        sys.path.insert(0, str(near))
    try:
        seats = declared_seats(vf, spec)
        if problem := seat_problem(spec, seats):
            raise VerifiersLoadError(problem)
        env = vf.load_environment(vf.resolve_env_config(env_config(spec, seats)))
        tasks = taken(spec, env.taskset)
    except VerifiersLoadError:
        raise
    except ValidationError as error:
        said = error_line(error, "its config")
        raise VerifiersLoadError(f"taskset {spec.id!r}: {said}") from None
    except Exception as error:  # the taskset's own code runs here too (its `load`)
        text = " ".join(str(error).split())
        raise VerifiersLoadError(f"taskset {spec.id!r}: {type(error).__name__}: {text}") from None
    if not tasks:
        raise VerifiersLoadError(f"taskset {spec.id!r} yields no tasks")
    share_module_path(name)
    return env, tasks, trained_seat(spec, seats)


def error_line(error: ValidationError, whose: str) -> str:
    """pydantic's first complaint as one line; a key the schema lacks is "not supported"."""
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    if first["type"] == "extra_forbidden":
        return f"{where}: not supported ({whose} has no such key)"
    return f"{where}: {first['msg']}"


def common_system_prompt(tasks: Iterable[Any]) -> str | None:
    """The system prompt every task shares, or None when they differ."""
    prompts = {t.data.system_prompt or "" for t in tasks}
    return prompts.pop() if len(prompts) == 1 else None


def short_ids(tasks: list[Any]) -> list[str]:
    """Each task's id: the first 16 hex digits of its stable key (all of it on a clash)."""
    short = [t.key[:16] for t in tasks]
    return short if len(set(short)) == len(short) else [t.key for t in tasks]


def records_of(spec: VerifiersSpec, tasks: list[Any]) -> dict[str, list[dict[str, object]]]:
    """The tasks as records, split: `id` (from the task's stable key), `index` in the taskset,
    and its data as JSON. The order is seeded (`shuffle_seed`), so a split never moves."""
    order = list(range(len(tasks)))
    if spec.shuffle_seed is not None:
        random.Random(f"verifiers:{spec.shuffle_seed}").shuffle(order)
    try:
        ranges = split_ranges(spec, len(tasks))
    except ValueError as error:
        raise VerifiersLoadError(f"taskset {spec.id!r}: {error}") from None
    ids = short_ids(tasks)
    return {
        split: [record(tasks[order[p]], ids[order[p]], order[p]) for p in positions]
        for split, positions in ranges.items()
    }


def record(task: Any, ident: str, index: int) -> dict[str, object]:
    data = task.data.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    return {"id": ident, "index": index, "data": data}


def module_file(spec: VerifiersSpec, near: Path) -> Path:
    """The file the taskset lives in (what an evaluation's resume digest reads)."""
    name = module_name(spec.id)
    found = sys.modules.get(name) or sys.modules.get(f"verifiers.v1.tasksets.{name}")
    path = getattr(found, "__file__", None)
    return Path(path) if path else near / f"{name}.py"


def build_scenario(
    spec: VerifiersSpec,
    *,
    name: str | None,
    description: str = "",
    system_prompt: str | None,
    max_tokens: int | None,
    path: Path | None,
    near: Path,
    seed: int,
) -> Scenario:
    env, tasks, seat = load_env(spec, near if path is not None else None)
    common = common_system_prompt(tasks)
    default = system_prompt if system_prompt is not None else common or ""
    runner = VerifiersRunner(
        env,
        dict(zip(short_ids(tasks), tasks, strict=True)),
        spec,
        keep=None if system_prompt is not None else common,
        seat=seat,
    )
    ref = f"{PREFIX}{spec.id}"
    threshold = (
        {"correct_threshold": spec.correct_threshold}
        if "correct_threshold" in spec.model_fields_set
        else {}
    )
    scenario_spec = ScenarioSpec(
        name=name or spec.id.rsplit("/", 1)[-1].split("@", 1)[0],
        description=description,
        system_prompt=default,
        source={"type": "verifiers", **spec.model_dump(mode="json")},
        rollout=RolloutSpec(function=ref, timeout_s=spec.timeout_s + 30, **threshold),
        max_tokens=max_tokens,
    )
    scenario = Scenario(
        spec=scenario_spec,
        splits={},
        reward=None,
        path=path or module_file(spec, near),
        rollout_fn=RolloutFunction(ref=ref, fn=runner, takes_context=True),
    )
    fill_splits(scenario, records_of(spec, tasks), scenario.path)
    del seed  # the split is the taskset's own seeded order (`shuffle_seed`), not the run's
    return scenario


def verifiers_scenario(
    id: str,
    *,
    args: Mapping[str, object] | None = None,
    name: str | None = None,
    system_prompt: str | None = None,
    max_tokens: int | None = None,
    near: Path | None = None,
    **options: Any,
) -> Scenario:
    """The Python form of a verifiers scenario: taskset `id` with config `args`; `options`
    are the rest of `VerifiersSpec` (`splits`, `env_args`, `harness`, `timeout_s`, ...).
    `system_prompt` replaces every task's (default: the one they share)."""
    try:
        spec = VerifiersSpec(id=id, args=dict(args or {}), **options)
    except ValidationError as error:
        raise ScenarioFileError(f"verifiers {error_line(error, '[verifiers]')}") from None
    try:
        return build_scenario(
            spec, name=name, system_prompt=system_prompt, max_tokens=max_tokens, path=None,
            near=near or Path.cwd(), seed=0,
        )  # fmt: skip
    except VerifiersLoadError as error:
        raise ScenarioFileError(str(error)) from None


TOP_KEYS = {"name", "description", "system_prompt", "max_tokens", "verifiers"}


def load_file(path: Path, text: str, overrides: dict[str, object]) -> Scenario:
    """A scenario file with a `[verifiers]` table; errors name the file and line."""
    raw = tomllib.loads(text)
    if unknown := sorted(set(raw) - TOP_KEYS):
        line = toml_line(text, None, unknown[0]) or toml_line(text, unknown[0], None)
        where = f"{path}:{line}" if line else str(path)
        raise ScenarioFileError(
            f"{where}: {unknown[0]!r} cannot be used with [verifiers] (the taskset gives the "
            f"records, the prompts and the rubric); allowed: {', '.join(sorted(TOP_KEYS))}"
        )
    table = {**raw["verifiers"], "args": {**raw["verifiers"].get("args", {}), **overrides}}
    try:
        spec = VerifiersSpec.model_validate(table)
    except ValidationError as error:
        first = error.errors()[0]
        key = str(first["loc"][0]) if first["loc"] else None
        line = toml_line(text, "verifiers", key)
        where = f"{path}:{line}" if line else str(path)
        said = error_line(error, "[verifiers]")
        raise ScenarioFileError(f"{where}: verifiers.{said}") from None
    try:
        return build_scenario(
            spec, name=raw.get("name", path.stem), description=raw.get("description", ""),
            system_prompt=raw.get("system_prompt"), max_tokens=raw.get("max_tokens"),
            path=path, near=path.parent, seed=0,
        )  # fmt: skip
    except VerifiersLoadError as error:
        line = toml_line(text, "verifiers", "id")
        raise ScenarioFileError(f"{path}:{line}: {error}" if line else f"{path}: {error}") from None


def load_any(
    text: str, *, seed: int = 0, overrides: Mapping[str, object] | None = None
) -> Scenario | Mixture:
    """What `scenario=` names: `verifiers:<taskset>` (`source.<key>=` overrides become the
    taskset's config), a scenario file with a `[verifiers]` table, or any other scenario or
    mixture (`art_rlvr.scenarios.mixture.load_scenarios`)."""
    overrides = dict(overrides or {})
    if text.startswith(PREFIX):
        ident = text.removeprefix(PREFIX).strip()
        if not ident:
            raise ScenarioFileError("scenario=verifiers:<taskset id or module>: no id given")
        return verifiers_scenario(ident, args=overrides)
    path = Path(text).expanduser()
    if path.suffix == ".toml" and path.is_file():
        file_text = path.read_text(encoding="utf-8")
        try:
            is_vf = "verifiers" in tomllib.loads(file_text)
        except tomllib.TOMLDecodeError:
            is_vf = False  # the scenario loader words it
        if is_vf:
            return load_file(path, file_text, overrides)
    return load_scenarios(text, seed=seed, overrides=overrides)


def runners_of(scenario: Scenario | Mixture) -> list[VerifiersRunner]:
    """The verifiers environments a run must start and close (one serving context each)."""
    return [
        t.rollout_fn.fn
        for t in scenario.scenarios
        if t.rollout_fn is not None and isinstance(t.rollout_fn.fn, VerifiersRunner)
    ]


def key_variable(key: str) -> str:
    """A process variable holding the policy's key (verifiers reads keys from variables only);
    its name has API_KEY in it, which verifiers' subprocess runtime never passes to a harness."""
    digest = hashlib.blake2b(key.encode(), digest_size=6).hexdigest()
    return f"ART_RLVR_VERIFIERS_API_KEY_{digest}"


class VerifiersRunner:
    """The rollout function of a verifiers scenario: `await runner(model, record, context)`.

    It holds the Env's serving context (interception proxy, shared tool servers) open in an
    owner task of the running event loop, from the first episode (or `start()`) to `aclose()`
    (a loop that shuts down cancels the owner, which closes it too)."""

    def __init__(
        self,
        env: Any,
        tasks: dict[str, Any],
        spec: VerifiersSpec,
        keep: str | None,
        seat: str = "agent",
    ):
        self.env = env
        self.tasks = tasks
        self.spec = spec
        self.keep = keep  # the system prompt the tasks share (None: replace it always)
        self.seat = seat  # the seat whose trace is the trajectory
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future[None] | None = None
        self._stop: asyncio.Event | None = None
        self._owner: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop: serve anew
            self._loop, self._ready = loop, None
        if self._ready is None:
            self._ready, self._stop = loop.create_future(), asyncio.Event()
            self._owner = loop.create_task(self._own(self._ready, self._stop))
        await asyncio.shield(self._ready)

    async def _own(self, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
        try:
            async with self.env.serving():
                ready.set_result(None)
                await stop.wait()
        except Exception as error:
            if ready.done():
                raise
            ready.set_exception(RuntimeError(f"verifiers env {self.spec.id!r}: {error}"))
        finally:
            if not ready.done():  # cancelled while starting: the waiters stop too
                ready.cancel()

    async def aclose(self) -> None:
        owner, stop = self._owner, self._stop
        self._owner = self._ready = self._stop = None
        if owner is not None and stop is not None:
            stop.set()
            await asyncio.gather(owner, return_exceptions=True)

    def task_for(self, record: Record, system_prompt: str | None) -> Any:
        task = self.tasks[str(record["id"])]
        if self.keep is None or system_prompt != self.keep:
            return task.with_system_prompt(system_prompt)
        return task

    async def __call__(
        self, model: art.Model, record: Record, context: RolloutContext
    ) -> art.Trajectory:
        vf = import_verifiers()
        base_url = getattr(model, "inference_base_url", None)
        if not base_url:
            raise ValueError(
                f"verifiers env {self.spec.id!r} runs against an OpenAI-compatible endpoint; "
                f"model {getattr(model, 'name', model)!r} has none (set policy.api_base)"
            )
        await self.start()
        key = getattr(model, "inference_api_key", None) or "none"
        variable = key_variable(key)
        os.environ[variable] = key
        s = context.sampling
        sampling = {"max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p}
        ctx = vf.ModelContext(
            model=model.get_inference_name(context.step),
            client=vf.EvalClientConfig(base_url=base_url, api_key_var=variable),
            sampling=vf.SamplingConfig(
                **sampling, **({"seed": s.seed} if s.seed is not None else {})
            ),
        )
        episode = await self.env.run_episode(self.task_for(record, context.system_prompt), ctx)
        return trajectory_of(episode, self.seat)


def message_dict(message: Any) -> dict[str, object]:
    """A verifiers message as an OpenAI chat message."""
    m = message.model_dump(exclude_none=True)
    m.pop("reasoning_content", None)
    m.pop("provider_state", None)
    if m.get("tool_calls"):
        m["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in m["tool_calls"]
        ]
    if m["role"] == "assistant":
        m.setdefault("content", None)
    return m


def history(branch: Any) -> list[Any]:
    """A branch's messages: each sampled turn a `Choice` (its finish reason from the call that
    sampled it), every other message a plain dict."""
    from openai.types.chat.chat_completion import ChatCompletionMessage, Choice

    finishes = iter(branch.calls)
    items: list[Any] = []
    for node in branch.nodes:
        message = message_dict(node.message)
        if node.sampled and message["role"] == "assistant":
            call = next(finishes, None)
            finish = getattr(call, "finish_reason", None)
            items.append(
                Choice(
                    index=0,
                    finish_reason=finish if finish in CHOICE_FINISH else "stop",
                    message=ChatCompletionMessage.model_validate(message),
                )
            )
        else:
            items.append(message)
    return items


def tools_of(branch: Any) -> Any:
    """A branch's tools in the OpenAI `tools` shape, or None."""
    tools = [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in branch.tools
    ]
    return tools or None


def failure(episode: Any, trace: Any) -> str | None:
    """Why verifiers marked the episode failed, in its own words, or None."""
    errors = [*(trace.errors if trace is not None else []), *episode.errors]
    if errors:
        return f"{errors[0].type}: {errors[0].message}"
    if trace is None:
        return "the episode produced no trace"
    if trace.ok and episode.ok:
        return None
    return f"the episode failed (stop: {trace.stop_condition})"


def metrics_of(trace: Any) -> dict[str, float]:
    rewards = {f"vf/{k}": float(v.score) for k, v in trace.rewards.items() if v is not None}
    metrics = {f"vf/{k}": float(v) for k, v in trace.metrics.items() if v is not None}
    sampled = sum(n.sampled for n in trace.nodes)
    usage = trace.usage
    tokens = {"completion_tokens": float(usage.completion_tokens)} if usage is not None else {}
    return {
        **metrics,
        **rewards,
        "vf/reward": float(trace.reward),
        "turns": float(sampled),
        **tokens,
    }


def feedback(trace: Any) -> str:
    """What GEPA's reflection reads: each reward's score and weight, the stop condition."""
    parts = [
        f"{k}={v.score:g} (weight {v.weight:g})" if v is not None else f"{k}=none"
        for k, v in trace.rewards.items()
    ]
    return (
        f"reward {trace.reward:g}: {', '.join(parts) or 'no rewards'}; stop: {trace.stop_condition}"
    )


def reward_problem(trace: Any) -> str | None:
    """Why the trace's reward cannot train (a non-finite one), naming the rubric's weights;
    None when it can: any finite number, as ART trains any real reward."""
    if math.isfinite(trace.reward):
        return None
    weights = {k: v.weight for k, v in sorted(trace.rewards.items()) if v is not None}
    listed = ", ".join(f"{k} {w:g}" for k, w in weights.items())
    return (
        f"reward {trace.reward:g} is not finite (the rubric's weights: {listed}); ART trains "
        "finite rewards only"
    )


def seat_trace(episode: Any, seat: str) -> Any:
    """The episode's first trace of `seat` (a trace is stamped with the seat that played it),
    else its first trace; None without any."""
    traces = list(episode.traces)
    return next((t for t in traces if t.agent.name == seat), traces[0] if traces else None)


def trajectory_of(episode: Any, seat: str = "agent") -> art.Trajectory:
    """The episode's trace of the trained `seat` as an `art.Trajectory` (its last branch as the
    messages, the others as additional histories); raises `RolloutFailed` (with what was
    sampled) when verifiers marked it failed."""
    import art
    from art.trajectories import LegacyHistory

    trace = seat_trace(episode, seat)
    trajectory = art.Trajectory(messages_and_choices=[], reward=0.0)
    if trace is not None:
        branches = [b for b in trace.branches if b.trainable] or trace.branches
        histories = [
            LegacyHistory(messages_and_choices=history(b), tools=tools_of(b)) for b in branches[:-1]
        ]
        last = branches[-1] if branches else None
        trajectory = art.Trajectory(
            messages_and_choices=history(last) if last is not None else [],
            tools=tools_of(last) if last is not None else None,
            additional_histories=histories,
            reward=0.0,
            metrics=metrics_of(trace),
            metadata={
                "vf_trace_id": trace.id,
                "vf_stop": str(trace.stop_condition),
                "vf_seat": trace.agent.name,
                "vf_traces": len(episode.traces),
            },
        )
        trajectory.logs.extend(f"verifiers {e.type}: {e.message}" for e in trace.errors)
    reason = failure(episode, trace) or (reward_problem(trace) if trace is not None else None)
    if reason is not None or trace is None:
        raise RolloutFailed(trajectory, reason or "the episode produced no trace")
    trajectory.reward = float(trace.reward)
    trajectory.metadata["feedback"] = feedback(trace)
    return trajectory
