"""Weave tracing: opt-in, never fatal, and small.

`setup_weave(project)` calls `weave.init` only when a project is named, credentials exist and
the trace server answers; otherwise it says once why tracing is off and the run goes on
unchanged. `setup_weave(project, offline=True)` needs neither: weave records every call into
its own write-ahead log on disk (`offline.py`), and `python -m art_rlvr.observe.upload`
sends them to W&B later.

The ops themselves (`art_rlvr.rollout`, `.episode`, `.turn`, `.tool`, `.env`, `.score`,
`.evaluate`, `.rl_step`, `.llm`, `.gepa.iteration`, `.ei.hint`, `.ei.round`) are declared where
the work happens, with the `*_inputs` / `*_output` functions choosing what a trace shows: ids,
prompt hashes, rewards and feedback rather than model objects, whole datasets or an API key.
An episode's turns, tool calls and environment answers nest under it, so Weave shows the whole
episode as a tree. The trainable model's own HTTP client is left untraced by ART (its proxy
suppresses weave), so a rollout is one call, not two.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Never, Protocol, TypeVar, cast, runtime_checkable

from pydantic import BaseModel

from art_rlvr.core.outcome import completion_text, feedback_of
from art_rlvr.core.text import prompt_hash

if TYPE_CHECKING:
    import art

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., object])

PROBE_TIMEOUT_S = 5.0


def weave_credentials_present() -> bool:
    """W&B's usual places for a key: WANDB_API_KEY or ~/.netrc (read by weave itself)."""
    from weave.trace import env

    try:
        return bool(env.weave_wandb_api_key())
    except Exception:  # a malformed ~/.netrc is a reason to stay off, not to crash
        return False


def trace_server_url() -> str:
    from weave.trace import env

    return env.weave_trace_server_url()


def probe(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the trace server answers `server_info`; else a short reason."""
    import httpx

    try:
        response = httpx.get(f"{url.rstrip('/')}/server_info", timeout=timeout_s)
    except httpx.HTTPError as error:
        return f"{type(error).__name__}: {error}"[:200]
    if response.status_code >= 400:
        return f"HTTP {response.status_code}"
    return None


def setup_weave(project: str | None, *, offline: bool = False) -> bool:
    """Start tracing to `project` ("entity/project") if it can be done; True when on. With
    `offline`, record to disk with no W&B key or server (upload later).

    Never raises for an environment problem: tracing is an aid, and a multi-hour run must not
    die (or hang on a login prompt) because W&B is unreachable."""
    if not project:
        log.info("weave tracing: off (set weave_project=<entity/project> to trace this run)")
        return False
    os.environ.pop("WEAVE_DISABLED", None)  # the CLI sets it so that imports stay quiet
    if offline:
        from art_rlvr.observe.offline import record_offline

        return record_offline(project)
    if not weave_credentials_present():
        log.warning(
            "weave tracing: off: weave_project=%s but no W&B key (WANDB_API_KEY or ~/.netrc)",
            project,
        )
        return False
    url = trace_server_url()
    reason = probe(url)
    if reason is not None:
        log.warning("weave tracing: off: trace server %s unreachable (%s)", url, reason)
        return False
    import weave

    try:
        weave.init(project, settings={"print_call_link": False})  # one link per call is noise
    except Exception as error:  # weave's own errors vary by version; none may stop the run
        log.warning("weave tracing: off: weave.init(%r) failed: %s", project, error)
        return False
    log.info("weave tracing: on, project %s, trace server %s", project, url)
    return True


def finish_weave() -> None:
    """Flush what is queued so the last calls of a run are not lost at exit."""
    import weave

    client = weave.get_client()
    if client is not None:
        try:
            client.flush()
        except Exception as error:
            log.warning("weave: flushing traces failed: %s", error)


def tracing_active() -> bool:
    """Whether a weave client exists (ours or one the user's notebook started)."""
    weave = sys.modules.get("weave")
    return weave is not None and weave.get_client() is not None


def op(
    name: str,
    *,
    inputs: Callable[[Mapping[str, object]], Mapping[str, object]] | None = None,
    output: Callable[[Never], object] | None = None,
) -> Callable[[F], F]:
    """`weave.op` without importing weave (3 s) until something is traced: the function runs
    untouched while no weave client exists, and inside a weave call once one does.

    The call records `inputs(arguments)` rather than the raw arguments: weave walks raw
    arguments (to redact keys) before any postprocessing, and a scenario's record links back to
    its whole dataset, which is both slow to walk and cyclic. `output` is given what the
    function returned (awaited), whatever it is."""

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        shells: list[Callable[[Callable[[], object], dict[str, object]], object]] = []

        def shown(args: tuple[object, ...], kwargs: dict[str, object]) -> dict[str, object]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return dict(inputs(bound.arguments) if inputs else bound.arguments)

        def shell() -> Callable[[Callable[[], object], dict[str, object]], object]:
            if not shells:
                import weave

                def body(call: Callable[[], object], shown: dict[str, object]) -> object:
                    return call()

                async def abody(call: Callable[[], object], shown: dict[str, object]) -> object:
                    pending = call()
                    assert inspect.isawaitable(pending)
                    return await pending

                shells.append(
                    weave.op(
                        abody if inspect.iscoroutinefunction(fn) else body,
                        name=name,
                        postprocess_inputs=lambda i: i["shown"],
                        postprocess_output=output,
                        enable_code_capture=False,
                    )
                )
            return shells[0]

        if inspect.iscoroutinefunction(fn):
            afn = fn

            @functools.wraps(fn)
            async def run_async(*args: object, **kwargs: object) -> object:
                if not tracing_active():
                    return await afn(*args, **kwargs)
                traced = shell()(lambda: afn(*args, **kwargs), shown(args, kwargs))
                assert inspect.isawaitable(traced)
                return await traced

            return cast(F, run_async)

        @functools.wraps(fn)
        def run(*args: object, **kwargs: object) -> object:
            if not tracing_active():
                return fn(*args, **kwargs)
            return shell()(lambda: fn(*args, **kwargs), shown(args, kwargs))

        return cast(F, run)

    return decorate


# ---- what each op shows -------------------------------------------------------------------


def rollout_inputs(inputs: Mapping[str, object]) -> dict[str, object]:
    example = inputs.get("example")
    messages = inputs.get("messages")
    system = inputs.get("system_prompt")
    sampling = inputs.get("sampling")
    return {
        "scenario_id": getattr(example, "id", None),
        "split": getattr(example, "split", None),
        "model": getattr(inputs.get("model"), "name", None),
        "step": inputs.get("step"),
        "system_prompt": system,
        "prompt_hash": prompt_hash(system) if isinstance(system, str) else None,
        "messages": messages if messages is not None else _messages(example, system),
        "sampling": sampling.model_dump() if isinstance(sampling, BaseModel) else sampling,
        "metadata": inputs.get("metadata"),
    }


@runtime_checkable
class _Renders(Protocol):
    """An example (`art_rlvr.scenarios.Example`) as a trace reads it: its opening messages."""

    def messages(self, system_prompt: str | None = None) -> object: ...


def _messages(example: object, system_prompt: object) -> object:
    if not isinstance(example, _Renders):
        return None
    try:
        return example.messages(system_prompt if isinstance(system_prompt, str) else None)
    except Exception:
        return None


def trajectory_output(trajectory: art.Trajectory) -> dict[str, object]:
    return {
        "completion": completion_text(trajectory),
        "reward": trajectory.reward,
        "feedback": feedback_of(trajectory),
        "metrics": dict(trajectory.metrics),
        "prompt_hash": trajectory.metadata.get("prompt_hash"),
    }


def score_inputs(inputs: Mapping[str, object]) -> dict[str, object]:
    example = inputs.get("self")
    return {"scenario_id": getattr(example, "id", None), "completion": inputs.get("completion")}


def evaluate_inputs(inputs: Mapping[str, object]) -> dict[str, object]:
    system = inputs.get("system_prompt")
    examples = inputs.get("examples") or []
    assert isinstance(examples, Sequence)
    return {
        "split": inputs.get("split"),
        "n": len(examples),
        "scenario_ids": [getattr(s, "id", None) for s in examples][:1000],
        "system_prompt": system,
        "prompt_hash": prompt_hash(system) if isinstance(system, str) else None,
        "step": inputs.get("step"),
    }


def evaluate_output(report: BaseModel) -> dict[str, object]:
    """An evaluation's report without its groups (the trajectories themselves)."""
    return report.model_dump(exclude={"groups"})


def llm_inputs(inputs: Mapping[str, object]) -> dict[str, object]:
    """The call as the reader needs it: who asked which model what. Never the key."""
    client = inputs.get("self")
    settings = getattr(client, "settings", None)
    overrides = {k: v for k, v in inputs.items() if k not in ("self", "messages")}
    return {
        "role": getattr(client, "label", None),
        "model": getattr(settings, "model", None),
        "api_base": getattr(settings, "api_base", None),
        "messages": inputs.get("messages"),
        **{k: v for k, v in overrides.items() if "key" not in k.lower()},
    }


def drop(*names: str) -> Callable[[Mapping[str, object]], dict[str, object]]:
    """postprocess_inputs that leaves out `names` (objects a trace cannot show usefully)."""

    def post(inputs: Mapping[str, object]) -> dict[str, object]:
        return {k: v for k, v in inputs.items() if k not in names}

    return post


def gepa_iteration_inputs(inputs: Mapping[str, object]) -> dict[str, object]:
    state = inputs.get("state")
    best = getattr(state, "best", None) if getattr(state, "candidates", None) else None
    return {
        "iteration": getattr(state, "iteration", None),
        "candidates": len(getattr(state, "candidates", ())),
        "best_prompt": getattr(best, "prompt", None),
        "best_pareto_mean": getattr(best, "mean", None),
    }


class _Event(Protocol):
    @property
    def iteration(self) -> int: ...

    def model_dump(self, *, exclude_defaults: bool = ...) -> Mapping[str, object]: ...


class _GEPAState(Protocol):
    """`art_rlvr.gepa.data.GEPAState`, as far as a trace reads it."""

    @property
    def iteration(self) -> int: ...

    @property
    def history(self) -> Sequence[_Event]: ...

    @property
    def stop_reason(self) -> str | None: ...


def gepa_iteration_output(state: _GEPAState) -> dict[str, object]:
    """The proposals this iteration made, accepted or why not."""
    iteration = getattr(state, "iteration", 0)
    events = [
        e.model_dump(exclude_defaults=True)
        for e in getattr(state, "history", ())
        if e.iteration >= iteration - 1
    ]
    return {"iteration": iteration, "events": events, "stop_reason": state.stop_reason}


def ei_round_inputs(inputs: Mapping[str, object]) -> dict[str, object]:
    system = inputs.get("system_prompt")
    return {
        "round": inputs.get("round_index"),
        "scenario": getattr(inputs.get("scenario"), "name", None),
        "system_prompt": system,
        "prompt_hash": prompt_hash(system) if isinstance(system, str) else None,
        "teacher": getattr(getattr(inputs.get("teacher"), "settings", None), "model", None),
    }


class _Dumps(Protocol):
    def model_dump(self) -> Mapping[str, object]: ...


class _Buffer(Protocol):
    """`art_rlvr.ei.data.Buffer`, as far as a trace reads it."""

    @property
    def round(self) -> int: ...

    @property
    def stats(self) -> _Dumps: ...

    @property
    def examples(self) -> Sized: ...

    @property
    def hints(self) -> Iterable[_Dumps]: ...


class _Round(Protocol):
    @property
    def buffer(self) -> _Buffer: ...


def ei_round_output(output: _Round) -> dict[str, object]:
    """The round's counters and the hints it used (the examples are in the run folder)."""
    buffer = output.buffer
    return {
        "round": buffer.round,
        "stats": buffer.stats.model_dump(),
        "examples": len(buffer.examples),
        "hints": [h.model_dump() for h in buffer.hints],
    }


def env_inputs(inputs: Mapping[str, object]) -> dict[str, object]:
    """An environment's view of a turn: its index, the reply and the tools that reply called."""
    messages = inputs.get("messages") or []
    assert isinstance(messages, Iterable)
    replies = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant"]
    last = replies[-1] if replies else {}
    calls = last.get("tool_calls") or []
    return {
        "index": inputs.get("index"),
        "reply": last.get("content"),
        "tool_calls": [c.get("function", {}).get("name") for c in calls if isinstance(c, Mapping)],
    }


def env_output(reply: object) -> object:
    """The environment's answer as data: messages, done, metrics, log."""
    return reply.model_dump() if isinstance(reply, BaseModel) else reply
