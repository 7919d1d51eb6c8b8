"""One expert-iteration round: sample clean attempts, hint the failures, verify, relabel,
then distil the buffer into the weights.

`collect_round` decides everything (and returns it as a `RoundBuffer`, which the loop writes
to the run folder before training); `distill_round` only trains on a buffer, so a run killed
between the two resumes by training on the saved buffer.
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import art

from art_rlvr.ei.config import EIConfig
from art_rlvr.ei.hints import HintOutcome, echoes_hint, hinted_prompt, obtain_hint
from art_rlvr.ei.records import DistillExample, HintRecord, RLGroup, RoundBuffer, RoundStats
from art_rlvr.ei.relabel import (
    best_attempts,
    clean_messages,
    completion_text,
    example_from,
    is_correct,
    relabel,
    relabel_for_rl,
)
from art_rlvr.llm import LLMClient
from art_rlvr.loops.rl import batch_scenarios
from art_rlvr.observe import tracing
from art_rlvr.rollouts import SamplingConfig, gather_groups, rollout, rollout_seed
from art_rlvr.scenario import Scenario, Task

log = logging.getLogger(__name__)


@dataclass
class RoundOutput:
    """A round's buffer plus the raw groups (written to `trajectories/` for inspection)."""

    buffer: RoundBuffer
    clean_groups: list[art.TrajectoryGroup]
    hinted_groups: list[art.TrajectoryGroup]


def gold_answer(scenario: Scenario, field: str) -> str:
    return str(scenario.x[field]).strip()


def reference_solution(scenario: Scenario, field: str | None) -> str | None:
    if not field or field not in scenario.x:
        return None
    value = str(scenario.x[field]).strip()
    return value or None


async def sample_messages(
    model: art.Model,
    scenario: Scenario,
    messages: list[dict[str, str]],
    sampling: SamplingConfig,
) -> art.Trajectory:
    """A rollout of arbitrary messages (the hinted prompt), scored by the scenario's reward."""
    return await rollout(
        model, scenario, sampling=sampling, messages=messages, metadata={"hinted": True}
    )


async def hinted_group(
    model: art.Model,
    scenario: Scenario,
    messages: list[dict[str, str]],
    n: int,
    sampling: SamplingConfig,
    seed: int,
) -> art.TrajectoryGroup:
    configs = [
        sampling.model_copy(update={"seed": rollout_seed(seed, scenario.id, i)}) for i in range(n)
    ]
    return await art.trajectory_group(
        [sample_messages(model, scenario, messages, c) for c in configs],
        metadata={"scenario_id": scenario.id, "hinted": True},
        return_exceptions=False,
    )


def most_common_failure(trajectories: Sequence[art.Trajectory]) -> str | None:
    """The failed attempt the teacher is shown: the most frequent wrong reply (first on ties)."""
    wrong = [completion_text(t).strip() for t in trajectories if not is_correct(t)]
    if not wrong:
        return None
    counts: dict[str, int] = {}
    for text in wrong:
        counts[text] = counts.get(text, 0) + 1
    return max(counts, key=lambda k: counts[k])


@dataclass
class _Hinted:
    scenario: Scenario
    outcome: HintOutcome | None
    group: art.TrajectoryGroup | None
    error: str | None = None


async def _hint_and_retry(
    model: art.Model,
    scenario: Scenario,
    clean: art.TrajectoryGroup,
    *,
    teacher: LLMClient,
    gate: asyncio.Semaphore,
    config: EIConfig,
    system_prompt: str | None,
    sampling: SamplingConfig,
    seed: int,
) -> _Hinted:
    """Hint one unsolved scenario and sample under the hinted prompt."""
    messages = list(clean_messages(scenario, system_prompt))
    async with gate:  # one scenario's whole conversation at a time per slot: a stable order
        outcome = await obtain_hint(
            teacher,
            scenario_id=scenario.id,
            problem=messages[-1]["content"],
            answer=gold_answer(scenario, config.answer_field),
            solution=reference_solution(scenario, config.solution_field),
            attempt=most_common_failure(clean.trajectories),
            config=config,
        )
    if outcome.hint is None:
        return _Hinted(scenario, outcome, None)
    prompt = hinted_prompt(messages, outcome.hint)
    try:
        group = await hinted_group(
            model, scenario, prompt, config.hinted_samples, sampling, seed=seed
        )
    except Exception as error:  # a failed rollout group is counted, like ART's max_exceptions
        log.error("hinted rollouts of %s failed: %s", scenario.id, error)
        return _Hinted(scenario, outcome, None, error=str(error))
    return _Hinted(scenario, outcome, group)


async def score_reliance(
    backend: Any,
    model: art.Model,
    pairs: Sequence[tuple[list[dict[str, str]], list[dict[str, str]], str]],
) -> list[float] | None:
    """HiLL's hint reliance per (hinted prompt, clean prompt, completion):
    log p(y | hinted) - log p(y | clean) in nats, under the current weights. None where the
    backend cannot score sequences (only TorchBackend's `score_completions` is known here)."""
    scorer = getattr(backend, "score_completions", None)
    if not pairs:
        return None
    if scorer is None:
        log.info(
            "hint reliance: n/a on %s (needs sequence log-prob scoring, which only "
            "TorchBackend.score_completions offers; ART's public API has none)",
            type(backend).__name__,
        )
        return None
    hinted = await scorer(model, [p[0] for p in pairs], [p[2] for p in pairs])
    clean = await scorer(model, [p[1] for p in pairs], [p[2] for p in pairs])
    return [h - c for h, c in zip(hinted, clean, strict=True)]


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


@tracing.op("art_rlvr.ei.round", inputs=tracing.ei_round_inputs, output=tracing.ei_round_output)
async def collect_round(
    model: art.Model,
    task: Task,
    config: EIConfig,
    round_index: int,
    *,
    system_prompt: str | None = None,
    teacher: LLMClient | None = None,
    backend: Any = None,
    max_exceptions: int | float = 0,
) -> RoundOutput:
    """Sample, select, hint, verify and relabel one round; no weights change here."""
    cfg = config
    sampling = SamplingConfig(
        max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p
    )
    scenarios = batch_scenarios(
        task.splits["train"], cfg.scenarios_per_round, cfg.seed, round_index
    )
    began = time.monotonic()
    groups = await gather_groups(
        model,
        scenarios,
        cfg.expert_samples_per_x,
        system_prompt=system_prompt,
        sampling=sampling,
        seed=rollout_seed(cfg.seed, "ei", round_index),
        max_exceptions=max_exceptions,
        description=f"ei round {round_index}",
    )
    by_id = {sc.id: sc for sc in scenarios}
    examples: list[DistillExample] = []
    rl_groups: list[RLGroup] = []
    unsolved: list[tuple[Scenario, art.TrajectoryGroup]] = []
    clean_attempts = clean_correct = 0
    for group in groups:
        scenario = by_id[group.trajectories[0].metadata["scenario_id"]]
        trajectories = list(group.trajectories)
        clean_attempts += len(trajectories)
        clean_correct += sum(is_correct(t) for t in trajectories)
        best = best_attempts(trajectories, cfg.keep_per_x)
        if best:
            examples += [example_from(scenario, system_prompt, t, "clean") for t in best]
            rl_groups.append(
                RLGroup(
                    scenario_id=scenario.id,
                    messages=clean_messages(scenario, system_prompt),
                    completions=tuple(completion_text(t) for t in trajectories),
                    rewards=tuple(t.reward for t in trajectories),
                    relabelled=(False,) * len(trajectories),
                )
            )
        else:
            unsolved.append((scenario, group))
    sampled_at = time.monotonic()

    hinted: list[_Hinted] = []
    if cfg.enable_teacher_hints and unsolved:
        if teacher is None:
            raise ValueError("enable_teacher_hints is set but no teacher client was given")
        for scenario, _ in unsolved:
            if cfg.answer_field not in scenario.x:
                raise ValueError(
                    f"scenario {scenario.id} has no field {cfg.answer_field!r} for the teacher "
                    f"(answer_field); its fields: {sorted(scenario.x)}"
                )
        gate = asyncio.Semaphore(cfg.teacher_concurrency)
        hint_seed = rollout_seed(cfg.seed, "ei-hinted", round_index)
        hinted = list(
            await asyncio.gather(
                *(
                    _hint_and_retry(
                        model,
                        scenario,
                        group,
                        teacher=teacher,
                        gate=gate,
                        config=cfg,
                        system_prompt=system_prompt,
                        sampling=sampling,
                        seed=hint_seed,
                    )
                    for scenario, group in unsolved
                )
            )
        )
    teacher_done = time.monotonic()

    recovered: list[tuple[_Hinted, list[art.Trajectory]]] = []
    hint_records: list[HintRecord] = []
    hinted_attempts = hinted_correct = echoed = 0
    for item in hinted:
        assert item.outcome is not None
        record = item.outcome.record
        if item.group is not None:
            trajectories = list(item.group.trajectories)
            correct = sum(is_correct(t) for t in trajectories)
            hinted_attempts += len(trajectories)
            hinted_correct += correct
            record = record.model_copy(
                update={"hinted_attempts": len(trajectories), "hinted_correct": correct}
            )
            hint = item.outcome.hint or ""
            usable = [t for t in trajectories if not echoes_hint(completion_text(t), hint)]
            echoed += sum(is_correct(t) for t in trajectories) - sum(is_correct(t) for t in usable)
            best = best_attempts(usable, cfg.keep_per_x)
            if best:
                recovered.append((item, best))
        hint_records.append(record)

    reliance: list[float] | None = None
    if cfg.hint_reliance and recovered:
        pairs = []
        for item, best in recovered:
            clean = list(clean_messages(item.scenario, system_prompt))
            assert item.outcome is not None and item.outcome.hint is not None
            for t in best:
                pairs.append((hinted_prompt(clean, item.outcome.hint), clean, completion_text(t)))
        reliance = await score_reliance(backend, model, pairs)

    per_token: list[float] = []
    position = 0
    clean_by_id = {sc.id: g for sc, g in unsolved}
    for item, best in recovered:
        failed = [t for t in clean_by_id[item.scenario.id].trajectories if not is_correct(t)]
        for t in best:
            value = reliance[position] if reliance is not None else None
            position += 1
            if value is not None:
                per_token.append(value / max(1.0, float(t.metrics.get("completion_tokens", 1))))
            examples.append(example_from(item.scenario, system_prompt, t, "hinted", value))
        rl_groups.append(
            RLGroup(
                scenario_id=item.scenario.id,
                messages=clean_messages(item.scenario, system_prompt),
                completions=(*(completion_text(t) for t in best), *map(completion_text, failed)),
                rewards=(*(t.reward for t in best), *(t.reward for t in failed)),
                relabelled=(True,) * len(best) + (False,) * len(failed),
            )
        )

    outcomes = [h.outcome for h in hinted if h.outcome is not None]
    got_hint = [h for h in hinted if h.outcome is not None and h.outcome.hint is not None]
    n = len(groups)
    stats = RoundStats(
        round=round_index,
        scenarios=n,
        clean_attempts=clean_attempts,
        clean_accuracy=clean_correct / clean_attempts if clean_attempts else 0.0,
        clean_solved=n - len(unsolved),
        clean_solve_rate=(n - len(unsolved)) / n if n else 0.0,
        rollout_errors=len(scenarios) - n + sum(h.error is not None for h in hinted),
        hints_requested=len(outcomes),
        hints_generated=len(got_hint),
        hints_leak_rejected=sum(o.leak_rejected for o in outcomes),
        hints_truncated=sum(o.record.truncated for o in outcomes),
        hints_dropped=sum(o.record.dropped in ("leak", "empty") for o in outcomes),
        teacher_errors=sum(o.record.dropped == "teacher_error" for o in outcomes),
        hinted_attempts=hinted_attempts,
        hinted_accuracy=hinted_correct / hinted_attempts if hinted_attempts else None,
        hinted_solve_rate=len(recovered) / len(got_hint) if got_hint else None,
        hinted_echo_rejected=echoed,
        recovered=len(recovered),
        examples_distilled=len(examples),
        examples_from_hints=sum(e.source == "hinted" for e in examples),
        hint_reliance_mean=_mean(reliance) if reliance else None,
        hint_reliance_per_token=_mean(per_token) if per_token else None,
        rl_groups=sum(len(set(g.rewards)) > 1 for g in rl_groups) if cfg.distill == "rl" else 0,
        seconds_sampling=sampled_at - began,
        seconds_teacher=teacher_done - sampled_at,
    )
    buffer = RoundBuffer(
        round=round_index,
        scenario_ids=tuple(sc.id for sc in scenarios),
        examples=tuple(examples),
        rl_groups=tuple(rl_groups) if cfg.distill == "rl" else (),
        hints=tuple(hint_records),
        stats=stats,
    )
    return RoundOutput(buffer, groups, [h.group for h in hinted if h.group is not None])


def sft_trajectories(buffer: RoundBuffer, config: EIConfig) -> list[art.Trajectory]:
    """The round's examples, `sft_epochs` times, in a seeded shuffle per epoch."""
    out: list[art.Trajectory] = []
    for epoch in range(config.sft_epochs):
        order = list(buffer.examples)
        random.Random(f"ei-sft:{config.seed}:{buffer.round}:{epoch}").shuffle(order)
        out += [relabel(e) for e in order]
    return out


async def distill_round(
    model: art.TrainableModel,
    backend: Any,
    buffer: RoundBuffer,
    config: EIConfig,
    *,
    learning_rate: float,
    loss_fn: str = "cispo",
    kl_penalty_coef: float = 0.0,
    scale_rewards: bool = True,
) -> dict[str, float] | None:
    """Train on a buffer: SFT on the relabelled examples, or RL on the contrast groups.
    None when there is nothing to learn from (no checkpoint step is taken)."""
    if config.distill == "sft":
        trajectories = sft_trajectories(buffer, config)
        if not trajectories:
            return None
        await model.train_sft(
            trajectories,
            config=art.TrainSFTConfig(
                learning_rate=config.sft_learning_rate, batch_size=config.sft_batch_size
            ),
        )
        return {"sft_examples": float(len(trajectories))}
    groups = [relabel_for_rl(g) for g in buffer.rl_groups if len(set(g.rewards)) > 1]
    if not groups:
        return None
    result = await backend.train(
        model,
        groups,
        learning_rate=learning_rate,
        loss_fn=loss_fn,
        kl_penalty_coef=kl_penalty_coef,
        scale_rewards=scale_rewards,
    )
    return {"rl_groups": float(len(groups)), **{k: float(v) for k, v in result.metrics.items()}}
