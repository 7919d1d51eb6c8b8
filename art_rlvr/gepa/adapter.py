"""A GEPAAdapter over ART: a candidate is a system prompt, evaluating it runs rollouts.

Each scenario of a batch becomes an ART `TrajectoryGroup` of `group_size` rollouts
(`gather_groups`), seeded per (seed, scenario, sample) so every prompt meets the same random
numbers: a difference in score is the prompt's, and a (prompt, scenario) result can be reused.
The scenario's score is the group's mean reward.

Budget: every scored rollout is one metric call. The `EvalStore` (art_rlvr.gepa.store) counts
them, refuses an evaluation that would pass `max_metric_calls` (before running it), and
journals each result to disk as it lands, so a resumed run finds it instead of paying again.

A rollout is read through the trajectory contract (art_rlvr.core.outcome): reward, feedback and
metrics from `outcome_of`, the scored text from `completion_text`, and the whole episode
(several assistant turns, tool calls, tool results) from `turns`.

gepa's own engine is synchronous; `evaluate` (gepa's protocol) may be called from a worker
thread and submits the rollouts to the event loop the adapter was built on. Our optimizer
awaits `aevaluate` directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import art
from gepa.core.adapter import EvaluationBatch

from art_rlvr.core.outcome import completion_text, episode_items, is_sampled, outcome_of, turns
from art_rlvr.core.text import prompt_hash
from art_rlvr.gepa.data import ExampleEval, RolloutTrace
from art_rlvr.gepa.reflection import reflective_records
from art_rlvr.gepa.store import EvalStore
from art_rlvr.rollouts.rollout import gather_groups
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.scenarios.scenario import Example

COMPONENT = "system_prompt"


def split_episode(
    trajectory: art.Trajectory,
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """(what the policy was given, the episode from its first sampled turn on), as message
    dicts: the inputs of a multi-turn episode are its opening messages, not its tool results."""
    messages = turns(trajectory)
    first = next(
        (i for i, item in enumerate(episode_items(trajectory)) if is_sampled(item)),
        len(messages),
    )
    return messages[:first], messages[first:]


def rollout_trace(trajectory: art.Trajectory) -> RolloutTrace:
    # text only, no Choice: an evaluation is journaled as JSON for resume, and GEPA never
    # trains on it, so token ids and logprobs have no reader here
    outcome = outcome_of(trajectory)
    return RolloutTrace(
        output=completion_text(trajectory),
        reward=outcome.reward,
        correct=outcome.correct,
        feedback=outcome.feedback,
        truncated=bool(outcome.metrics.get("truncated", 0.0)),
        episode=tuple(split_episode(trajectory)[1]),
    )


def example_eval(group: art.TrajectoryGroup, prompt: str) -> ExampleEval:
    """A prompt's group on one scenario, read from the trajectories' outcome contract."""
    trajectories = list(group.trajectories)
    given = split_episode(trajectories[0])[0] if trajectories else []
    scenario_id = group.metadata.get("scenario_id") or trajectories[0].metadata["scenario_id"]
    return ExampleEval(
        scenario_id=str(scenario_id),
        prompt_hash=prompt_hash(prompt),
        inputs="\n\n".join(str(m.get("content", "")) for m in given if m.get("role") != "system"),
        rollouts=tuple(rollout_trace(t) for t in trajectories),
    )


class ARTPromptAdapter:
    """gepa's `GEPAAdapter` protocol for a one-component candidate {"system_prompt": text}."""

    propose_new_texts = None  # reflection is ours (see art_rlvr.gepa.propose)

    def __init__(
        self,
        model: art.Model,
        store: EvalStore,
        *,
        sampling: SamplingConfig,
        group_size: int,
        seed: int,
        max_reflection_examples: int = 8,
        max_episode_chars: int | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.model = model
        self.store = store
        self.sampling = sampling
        self.group_size = group_size
        self.seed = seed
        self.max_reflection_examples = max_reflection_examples
        self.max_episode_chars = max_episode_chars
        self.loop = loop

    async def aevaluate(self, examples: Sequence[Example], prompt: str) -> list[ExampleEval]:
        """One ExampleEval per example; only the ones never run for this prompt cost calls."""
        todo = self.store.missing(prompt, examples)
        if todo:
            self.store.reserve(len(todo) * self.group_size)
            groups = await gather_groups(
                self.model,
                todo,
                self.group_size,
                system_prompt=prompt,
                sampling=self.sampling,
                seed=self.seed,
                description=f"gepa eval {prompt_hash(prompt)}",
            )
            for group in groups:
                self.store.put(example_eval(group, prompt))
        out = []
        for example in examples:
            ev = self.store.get(prompt, example.id)
            if ev is None:
                raise RuntimeError(f"no evaluation came back for scenario {example.id}")
            out.append(ev)
        return out

    def evaluate(
        self,
        batch: list[Example],
        candidate: dict[str, str],
        capture_traces: bool = False,
    ) -> EvaluationBatch:
        """gepa's synchronous entry point: run from a worker thread, rollouts on `self.loop`."""
        if self.loop is None:
            raise RuntimeError("ARTPromptAdapter.evaluate needs the event loop to submit to")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise RuntimeError(
                "ARTPromptAdapter.evaluate blocks; call it from a worker thread "
                "(asyncio.to_thread), or await aevaluate on the loop"
            )
        future = asyncio.run_coroutine_threadsafe(
            self.aevaluate(batch, candidate[COMPONENT]), self.loop
        )
        evals = future.result()
        # gepa's meter counts what an evaluation is worth, cached or not (reporting only fresh
        # rollouts would let its loop spin on cache hits); `self.store.spent` is the true cost
        return EvaluationBatch(
            outputs=[tuple(r.output for r in ev.rollouts) for ev in evals],
            scores=[ev.score for ev in evals],
            trajectories=list(evals) if capture_traces else None,
            num_metric_calls=sum(len(ev.rollouts) for ev in evals),
        )

    def make_reflective_dataset(
        self,
        candidate: dict[str, str],
        eval_batch: EvaluationBatch,
        components_to_update: list[str],
    ) -> dict[str, list[dict[str, str]]]:
        evals = list(eval_batch.trajectories or [])
        records = reflective_records(evals, self.max_reflection_examples, self.max_episode_chars)
        return {name: records for name in components_to_update}
