"""The eval phase: `eval_samples` rollouts per val item, pass@k and pass^k, resumable.

`mode=eval` is this phase alone (of the run's own model, or of an external `policy.model`); in
a list of phases it scores the weights and prompt as they are at that point. Its journal is
`evals/val_<step>/` (art_rlvr.eval.journal), so a killed evaluation resumes where it stopped.
"""

from __future__ import annotations

import logging
import time
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from art_rlvr.config.keys import ConfigError
from art_rlvr.observe.clock import cpu_seconds
from art_rlvr.rundir.files import RunFiles
from art_rlvr.scenarios.mixture import Mixture
from art_rlvr.scenarios.scenario import Scenario

if TYPE_CHECKING:
    from art_rlvr.config.run_config import RunConfig

log = logging.getLogger(__name__)


async def sampled_eval(
    cfg: RunConfig,
    scenario: Scenario | Mixture,
    files: RunFiles,
    model: Any,
    started: float,
    cpu_started: float,
    *,
    system_prompt: str | None,
) -> dict[str, Any]:
    """`eval_samples` rollouts per val item (greedy by default) under `system_prompt`, pass@k
    and pass^k, of the run's own model or an external policy (`policy.model`), resumable from
    evals/val_<step>/ (eval.journal); logged to metrics.jsonl and trajectories/val_<step>."""
    from art_rlvr.eval.journal import eval_folder, evaluate_resumable, plan_for
    from art_rlvr.loops.context import by_scenario, eval_event, scenario_line
    from art_rlvr.rollouts.sampling import SamplingConfig

    examples = scenario.held_out("val", cfg.val_limit)
    external = cfg.policy.model is not None
    step = 0 if external else await model.get_step()
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
        model,
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
    report, cost = result.report, result.metadata["cost_usd"]
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
    if not external:  # ART's history lives with the run's own (trainable) model
        await files.log_once(model, f"val/{step}", report.groups, split="val", step=step)
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


def policy_spent(model: Any) -> Any:
    """An external litellm policy's running spending, as the evaluation journals it."""
    from art_rlvr.eval.journal import Spent
    from art_rlvr.eval.policy import spent

    usage = spent(model)
    return None if usage is None else Spent.model_validate(usage, from_attributes=True)


def model_about(cfg: RunConfig, model: Any, step: int) -> dict[str, Any]:
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
