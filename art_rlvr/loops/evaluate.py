"""The eval phase: `eval_samples` rollouts per val item, pass@k and pass^k, resumable.

`mode=eval` is this phase alone (of the run's own model, or of an external `policy.model`); in
a list of phases it scores the weights and prompt as they are at that point. Its journal is
`evals/val_<step>/` (art_rlvr.eval.journal), so a killed evaluation resumes where it stopped.
"""

from __future__ import annotations

import logging
import time
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, ClassVar, cast

from art_rlvr.config.keys import ConfigError
from art_rlvr.eval.policy import LiteLLMPolicy
from art_rlvr.loops.phase import PhaseRun, Summary
from art_rlvr.loops.plan import PhaseKind
from art_rlvr.loops.state import EvalState, RunState
from art_rlvr.observe.clock import cpu_seconds
from art_rlvr.rundir.files import RunFiles
from art_rlvr.scenarios.mixture import Mixture
from art_rlvr.scenarios.scenario import Scenario

if TYPE_CHECKING:
    import art

    from art_rlvr.config.run_config import RunConfig
    from art_rlvr.eval.journal import Spent

log = logging.getLogger(__name__)


async def sampled_eval(
    cfg: RunConfig,
    scenario: Scenario | Mixture,
    files: RunFiles,
    model: art.Model | LiteLLMPolicy,
    started: float,
    cpu_started: float,
    *,
    system_prompt: str | None,
) -> Summary:
    """`eval_samples` rollouts per val item (greedy by default) under `system_prompt`, pass@k
    and pass^k, of the run's own model or an external policy (`policy.model`), resumable from
    evals/val_<step>/ (eval.journal); logged to metrics.jsonl and trajectories/val_<step>."""
    from art_rlvr.eval.journal import eval_folder, evaluate_resumable, plan_for
    from art_rlvr.loops.context import by_scenario, eval_event, scenario_line
    from art_rlvr.rollouts.sampling import SamplingConfig

    examples = scenario.held_out("val", cfg.val_limit)
    external = cfg.policy.model is not None
    own = None if external or isinstance(model, LiteLLMPolicy) else model  # the run's model
    step = 0 if own is None else await own.get_step()
    sampling = SamplingConfig(max_tokens=cfg.max_tokens, temperature=cfg.eval_temperature)
    plan = plan_for(
        split="val",
        step=step,
        policy=cfg.policy.model or model.get_inference_name(step),
        scenario=scenario.name,
        files=[t.path for t in scenario.scenarios],
        examples=examples,
        samples=cfg.eval_samples,
        sampling=sampling,
        seed=cfg.seed,
        system_prompt=system_prompt,
    )
    folder = eval_folder(files.root, "val", step)
    if not cfg.resume and (folder / "metadata.json").exists():
        raise ConfigError(
            f"{folder} already holds an evaluation; pass resume=true or a new run_name"
        )
    result = await evaluate_resumable(
        # a LiteLLMPolicy has the surface a rollout uses: name, openai_client().chat.completions
        # .create and get_inference_name
        cast("art.Model", model),
        examples,
        folder=folder,
        plan=plan,
        sampling=sampling,
        ks=cfg.pass_ks,
        system_prompt=system_prompt,
        max_in_flight=cfg.policy.max_in_flight,
        spent=lambda: policy_spent(model),
        about={"model": model_about(cfg, model, step), "versions": versions()},
    )
    report, spent_usd = result.report, result.metadata.get("cost_usd")
    cost = float(spent_usd) if isinstance(spent_usd, int | float) else None
    event = eval_event(
        report,
        step,
        accuracies=by_scenario(examples, report.groups, report.samples),
        policy=cfg.policy.model,
        cost_usd=cost,
        pass_all=report.pass_all,
        wall_seconds=time.monotonic() - started,
        cpu_seconds=cpu_seconds() - cpu_started,
    )
    line = f"{report.line()}{scenario_line(event.by_scenario)}"
    reused = f" ({result.reused} rollouts from an earlier session)" if result.reused else ""
    if external:
        price = "unknown" if cost is None else f"${cost:.6f}"
        log.info("%s %s, cost %s%s", cfg.policy.label, line, price, reused)
    else:
        log.info("step %d %s%s", step, line, reused)
    files.append_event(event)
    files.write_trajectories(f"val_{step:04d}", result.report.groups)
    if own is not None:  # ART's history lives with the run's own (trainable) model
        await files.log_once(own, f"val/{step}", report.groups, split="val", step=step)
    return {
        "val_accuracy_before": event.accuracy,
        "val_accuracy_after": event.accuracy,
        "steps": step,
        "rollouts": report.items * report.samples,
        "policy": cfg.policy.model,
        "eval_samples": report.samples,
        "pass_at_k": report.pass_at,
        "pass_all_k": report.pass_all,
        "completion_tokens": report.completion_tokens,
        "cost_usd": cost,
    }


class EvalPhase:
    """The eval phase: `sampled_eval` of the run's model under the run's `s`. Its journal is
    its resume; what it measured is booked on a list's curve (no greedy evaluation repeats
    it) and, alone (`mode=eval`), is the run's summary."""

    kind: ClassVar[PhaseKind] = "eval"
    journaled: ClassVar[bool] = True
    state_model = EvalState
    what = "an eval phase's"

    async def fresh(self, run: PhaseRun[EvalState]) -> EvalState:
        return EvalState()

    def part(self, state: RunState) -> EvalState | None:
        return None

    async def run(self, run: PhaseRun[EvalState], state: EvalState) -> EvalState:
        ctx = run.ctx
        result = await sampled_eval(
            ctx.config,
            ctx.scenario,
            ctx.files,
            ctx.model,
            ctx.started,
            ctx.cpu_started,
            system_prompt=run.prompt,
        )
        return state.model_copy(update={"result": result})

    def settled(self, state: EvalState) -> EvalState:
        return EvalState()

    def measured(self, state: EvalState) -> float | None:
        accuracy = state.result.get("val_accuracy_after")
        return float(accuracy) if isinstance(accuracy, int | float) else None

    async def summary(self, run: PhaseRun[EvalState], state: EvalState) -> Summary:
        return dict(state.result)


def policy_spent(model: object) -> Spent | None:
    """An external litellm policy's running spending, as the evaluation journals it."""
    from art_rlvr.eval.journal import Spent
    from art_rlvr.eval.policy import spent

    usage = spent(model)
    return None if usage is None else Spent.model_validate(usage, from_attributes=True)


def model_about(
    cfg: RunConfig, model: art.Model | LiteLLMPolicy, step: int
) -> dict[str, str | int | None]:
    """Which model an evaluation scored, for its metadata (no key, only where it is served)."""
    if cfg.policy.model is not None:
        return {"policy": cfg.policy.model, "api_base": cfg.policy.api_base}
    return {"name": model.name, "base_model": cfg.base_model, "step": step, "backend": cfg.backend}


def package_version(name: str) -> str:
    """A package's version; a checkout run from source (PYTHONPATH, no install) has none."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed (run from source)"


def versions() -> dict[str, str]:
    """The versions a run records (config.json, an evaluation's metadata)."""
    names = ("openpipe-art", "torch", "transformers", "peft", "art-rlvr")
    return {name: package_version(name) for name in names}
