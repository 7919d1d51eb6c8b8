"""One expert-iteration round: sample clean attempts, hint the failures, verify, relabel,
then distil the buffer into the weights.

`collect_round` decides everything (and returns it as a `RoundBuffer`, which the loop writes
to the run folder before training, `ei.files.write_round_records`); `distill_round` only
trains on a buffer, so a run killed between the two resumes by training on the saved buffer.

A round is a chain of named stages, each a small function over the previous one's data:
`sample_attempts` -> `select_solved` (keep the best clean attempts, pick the failures) ->
`hint_failures` (per failure: `ask_teacher`, then `hinted_group`) -> `relabel_hinted` (relabel
to the clean prompt, leak-check every turn, keep the best) -> `hint_reliance` ->
`hinted_training_data` -> `round_stats`, assembled into the `RoundBuffer`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import art

from art_rlvr.core.outcome import completion_text
from art_rlvr.ei.config import EIConfig, record_field
from art_rlvr.ei.data import RoundBuffer
from art_rlvr.ei.hints import HintOutcome, hinted_prompt, hinted_system, obtain_hint
from art_rlvr.ei.relabel import (
    clean_messages,
    clean_opening,
    message_text,
    relabel,
    relabel_for_rl,
)
from art_rlvr.ei.stages import (
    Hinted,
    Recovered,
    gold_answer,
    hinted_training_data,
    most_common_failure,
    reference_solution,
    relabel_hinted,
    round_stats,
    select_solved,
    single_reply,
)
from art_rlvr.llm.client import LLMClient
from art_rlvr.observe import tracing
from art_rlvr.rollouts.rollout import gather_groups, rollout
from art_rlvr.rollouts.sampling import SamplingConfig, rollout_seed
from art_rlvr.scenarios.scenario import Example, Scenario, batch_examples

log = logging.getLogger(__name__)

Prompt = list[dict[str, str]]


@runtime_checkable
class CompletionScorer(Protocol):
    """A backend that scores sequences: summed log p(completion | prompt) per pair under the
    current weights (TorchBackend's `score_completions`; ART's public API has none)."""

    async def score_completions(
        self, model: art.Model, prompts: Sequence[Prompt], completions: Sequence[str]
    ) -> list[float]: ...


@dataclass
class RoundOutput:
    """A round's buffer plus the raw groups (written to `trajectories/` for inspection)."""

    buffer: RoundBuffer
    clean_groups: list[art.TrajectoryGroup]
    hinted_groups: list[art.TrajectoryGroup]


async def hinted_group(
    model: art.Model,
    example: Example,
    messages: list[dict[str, str]] | None,
    n: int,
    sampling: SamplingConfig,
    seed: int,
    *,
    system_prompt: str | None = None,
) -> art.TrajectoryGroup:
    """`n` seeded rollouts that open with `messages` (the hinted prompt; an episode scenario's
    rollout takes the same opening, so the hint stays in the opening of its episodes), or, for
    a rollout function, that receive the hinted `system_prompt`; the scenario's reward scores
    them."""
    configs = [
        sampling.model_copy(update={"seed": rollout_seed(seed, example.id, i)}) for i in range(n)
    ]
    return await art.trajectory_group(
        [
            rollout(
                model,
                example,
                system_prompt=system_prompt,
                sampling=c,
                messages=messages,
                metadata={"hinted": True},
            )
            for c in configs
        ],
        metadata={"scenario_id": example.id, "hinted": True},
        return_exceptions=False,
    )


async def sample_attempts(
    model: art.Model,
    batch: Sequence[Example],
    config: EIConfig,
    round_index: int,
    *,
    system_prompt: str | None,
    sampling: SamplingConfig,
    max_exceptions: int | float,
) -> list[art.TrajectoryGroup]:
    """`group_size` clean attempts per scenario (a failed group is dropped and
    counted, up to `max_exceptions`, as in ART)."""
    return await gather_groups(
        model,
        batch,
        config.group_size,
        system_prompt=system_prompt,
        sampling=sampling,
        seed=rollout_seed(config.seed, "ei", round_index),
        max_exceptions=max_exceptions,
        description=f"ei round {round_index}",
    )


def problem_text(
    example: Example, clean: art.TrajectoryGroup, system_prompt: str | None, answer_field: str
) -> str:
    """The problem as the student saw it: the last user message of its clean prompt (a rollout
    function's, as its first attempt sent it), else the record without its answer field."""
    for t in clean.trajectories:
        opening = clean_opening(example, system_prompt, t)
        if said := [message_text(m) for m in opening if m.get("role") == "user"]:
            return said[-1]
    return json.dumps({k: v for k, v in example.x.items() if k != answer_field}, default=str)


async def ask_teacher(
    teacher: LLMClient,
    example: Example,
    clean: art.TrajectoryGroup,
    problem: str,
    config: EIConfig,
) -> HintOutcome:
    """The teacher sees the problem as the student saw it, the gold answer, the reference
    solution if any, and the most common failed attempt."""
    return await obtain_hint(
        teacher,
        scenario_id=example.id,
        problem=problem,
        answer=gold_answer(example, config.answer_field),
        solution=reference_solution(example, config.solution_field),
        attempt=most_common_failure(clean.trajectories),
        config=config,
    )


async def hint_and_retry(
    model: art.Model,
    example: Example,
    clean: art.TrajectoryGroup,
    *,
    teacher: LLMClient,
    gate: asyncio.Semaphore,
    config: EIConfig,
    system_prompt: str | None,
    sampling: SamplingConfig,
    seed: int,
) -> Hinted:
    """Hint one unsolved scenario and sample under the hinted prompt (a rollout function:
    under the hinted system prompt it is handed)."""
    problem = problem_text(example, clean, system_prompt, config.answer_field)
    async with gate:  # one scenario's whole conversation at a time per slot: a stable order
        outcome = await ask_teacher(teacher, example, clean, problem, config)
    if outcome.hint is None:
        return Hinted(example, clean, outcome, None)
    if example.scenario.rollout_fn is None:
        prompt, system = (
            hinted_prompt(list(clean_messages(example, system_prompt)), outcome.hint),
            None,
        )
    else:
        base = example.scenario.default_system_prompt if system_prompt is None else system_prompt
        prompt, system = None, hinted_system(base, outcome.hint)
    try:
        group = await hinted_group(
            model,
            example,
            prompt,
            config.hinted_samples,
            sampling,
            seed=seed,
            system_prompt=system,
        )
    except Exception as error:  # a failed rollout group is counted, like ART's max_exceptions
        log.error("hinted rollouts of %s failed: %s", example.id, error)
        return Hinted(example, clean, outcome, None, error=str(error))
    return Hinted(example, clean, outcome, group)


async def hint_failures(
    model: art.Model,
    unsolved: Sequence[tuple[Example, art.TrajectoryGroup]],
    *,
    teacher: LLMClient | None,
    config: EIConfig,
    system_prompt: str | None,
    sampling: SamplingConfig,
    round_index: int,
) -> list[Hinted]:
    """Ask the teacher about every unsolved scenario (`teacher_concurrency` at a time); each
    scenario's hinted rollouts start as soon as its hint is accepted."""
    if not (config.enable_teacher_hints and unsolved):
        return []
    if teacher is None:
        raise ValueError("enable_teacher_hints is set but no teacher client was given")
    for example, _ in unsolved:
        if record_field(example.x, config.answer_field) is None:
            raise ValueError(
                f"scenario {example.id} has no field {config.answer_field!r} for the teacher "
                f"(answer_field); its fields: {sorted(example.x)}"
            )
    gate = asyncio.Semaphore(config.teacher_concurrency)
    seed = rollout_seed(config.seed, "ei-hinted", round_index)
    return list(
        await asyncio.gather(
            *(
                hint_and_retry(
                    model,
                    example,
                    group,
                    teacher=teacher,
                    gate=gate,
                    config=config,
                    system_prompt=system_prompt,
                    sampling=sampling,
                    seed=seed,
                )
                for example, group in unsolved
            )
        )
    )


async def hint_reliance(
    recovered: Sequence[Recovered],
    config: EIConfig,
    *,
    backend: art.Backend | None,
    model: art.Model,
    system_prompt: str | None,
) -> list[float] | None:
    """Reliance of every kept hinted episode, in order; None when it is off, where the
    backend cannot score, or when an episode has more than one reply (a sequence score of
    the last reply alone would ignore the turns before it)."""
    kept = [(r, t) for r in recovered for t in r.best]
    if not (config.hint_reliance and kept):
        return None
    if any(r.hinted.example.scenario.rollout_fn is not None for r, _ in kept):
        log.info("hint reliance: n/a for rollout functions (they build their own prompts)")
        return None
    if not all(single_reply(t) for _, t in kept):
        log.info("hint reliance: n/a for multi-turn episodes")
        return None
    pairs = []
    for r, t in kept:
        clean = list(clean_messages(r.hinted.example, system_prompt))
        hint = r.hinted.outcome.hint or ""
        pairs.append((hinted_prompt(clean, hint), clean, completion_text(t)))
    return await score_reliance(backend, model, pairs)


async def score_reliance(
    backend: art.Backend | None,
    model: art.Model,
    pairs: Sequence[tuple[Prompt, Prompt, str]],
) -> list[float] | None:
    """HiLL's hint reliance per (hinted prompt, clean prompt, completion):
    log p(y | hinted) - log p(y | clean) in nats, under the current weights. None where the
    backend cannot score sequences (only TorchBackend's `score_completions` is known here)."""
    if not pairs:
        return None
    if not isinstance(backend, CompletionScorer):
        log.info(
            "hint reliance: n/a on %s (needs sequence log-prob scoring, which only "
            "TorchBackend.score_completions offers; ART's public API has none)",
            type(backend).__name__,
        )
        return None
    completions = [p[2] for p in pairs]
    hinted = await backend.score_completions(model, [p[0] for p in pairs], completions)
    clean = await backend.score_completions(model, [p[1] for p in pairs], completions)
    return [h - c for h, c in zip(hinted, clean, strict=True)]


@tracing.op("art_rlvr.ei.round", inputs=tracing.ei_round_inputs, output=tracing.ei_round_output)
async def collect_round(
    model: art.Model,
    scenario: Scenario,
    config: EIConfig,
    round_index: int,
    *,
    system_prompt: str | None = None,
    teacher: LLMClient | None = None,
    backend: art.Backend | None = None,
    max_exceptions: int | float = 0,
) -> RoundOutput:
    """Sample, select, hint, verify and relabel one round; no weights change here."""
    cfg = config
    sampling = SamplingConfig(
        max_tokens=cfg.max_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        tool_choice=cfg.search_tool_choice,
    )
    batch = batch_examples(scenario.splits["train"], cfg.scenarios_per_round, cfg.seed, round_index)
    began = time.monotonic()
    groups = await sample_attempts(
        model,
        batch,
        cfg,
        round_index,
        system_prompt=system_prompt,
        sampling=sampling,
        max_exceptions=max_exceptions,
    )
    selection = select_solved(groups, batch, cfg, system_prompt)
    sampled_at = time.monotonic()
    hinted = await hint_failures(
        model,
        selection.unsolved,
        teacher=teacher,
        config=cfg,
        system_prompt=system_prompt,
        sampling=sampling,
        round_index=round_index,
    )
    teacher_done = time.monotonic()
    verified = relabel_hinted(hinted, cfg, system_prompt)
    reliance = await hint_reliance(
        verified.recovered, cfg, backend=backend, model=model, system_prompt=system_prompt
    )
    from_hints, hinted_groups, per_token = hinted_training_data(
        verified.recovered, reliance, system_prompt
    )
    examples = [*selection.examples, *from_hints]
    rl_groups = [*selection.rl_groups, *hinted_groups]
    stats = round_stats(
        round_index,
        config=cfg,
        batch_size=len(batch),
        groups=len(groups),
        selection=selection,
        hinted=hinted,
        verified=verified,
        examples=examples,
        rl_groups=rl_groups,
        reliance=reliance,
        per_token=per_token,
        seconds=(sampled_at - began, teacher_done - sampled_at),
    )
    buffer = RoundBuffer(
        round=round_index,
        scenario_ids=tuple(example.id for example in batch),
        examples=tuple(examples),
        rl_groups=tuple(rl_groups) if cfg.distill == "rl" else (),
        hints=tuple(verified.records),
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
    backend: art.Backend,
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
        allow_rerendered_turns=True,  # relabelled turns were sampled under the hinted prompt
    )
    return {"rl_groups": float(len(groups)), **{k: float(v) for k, v in result.metrics.items()}}
