"""A GEPAAdapter over ART: a candidate is a system prompt, evaluating it runs rollouts.

Each scenario of a batch becomes an ART `TrajectoryGroup` of `rollouts_per_problem` rollouts
(`gather_groups`), seeded per (seed, scenario, sample) so every prompt meets the same random
numbers: a difference in score is the prompt's, and a (prompt, scenario) result can be reused.
The scenario's score is the group's mean reward.

Budget: every scored rollout is one metric call. The `EvalStore` counts them, refuses an
evaluation that would pass `max_metric_calls` (before running it), and journals each result
to disk as it lands, so a resumed run finds it instead of paying for it again.

gepa's own engine is synchronous; `evaluate` (gepa's protocol) may be called from a worker
thread and submits the rollouts to the event loop the adapter was built on. Our optimizer
awaits `aevaluate` directly.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import art
from gepa.core.adapter import EvaluationBatch

from art_rlvr.gepa.proposal import reflective_records
from art_rlvr.gepa.records import RolloutTrace, ScenarioEval
from art_rlvr.loops.files import StateFileError, drop_torn_tail, trajectory_row
from art_rlvr.rollouts import SamplingConfig, gather_groups
from art_rlvr.scenario import Scenario, prompt_hash

COMPONENT = "system_prompt"


class BudgetExceeded(RuntimeError):
    """An evaluation would take the run past max_metric_calls; it was not started."""


class Journal:
    """Append-only JSONL, fsynced per record: what a killed run had already paid for.
    A torn last line (a kill mid-write) is dropped on load."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def append(self, record: Mapping[str, Any]) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def load(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.exists():
            return []
        drop_torn_tail(self.path)  # a write cut by a kill: that record never happened
        out = []
        for number, line in enumerate(self.path.read_text().splitlines(), 1):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                raise StateFileError(
                    f"{self.path}:{number} is corrupt (a kill can only cut the last line, which "
                    "is dropped); move the file away to start over, or restore it"
                ) from None
        return out


class EvalStore:
    """(prompt, scenario) -> ScenarioEval, the metric-call meter, and their journal."""

    def __init__(self, max_metric_calls: int, journal: Journal) -> None:
        self.max_metric_calls = max_metric_calls
        self.journal = journal
        self._cache: dict[tuple[str, str], ScenarioEval] = {}
        for record in journal.load():
            if record.get("type") == "eval":
                ev = ScenarioEval.model_validate(record["eval"])
                self._cache[(ev.prompt_hash, ev.scenario_id)] = ev
        self.spent = sum(len(ev.rollouts) for ev in self._cache.values())

    @property
    def remaining(self) -> int:
        return self.max_metric_calls - self.spent

    def get(self, prompt: str, scenario_id: str) -> ScenarioEval | None:
        return self._cache.get((prompt_hash(prompt), scenario_id))

    def missing(self, prompt: str, scenarios: Sequence[Scenario]) -> list[Scenario]:
        """Scenarios (deduplicated, in order) this prompt has no result for yet."""
        todo = {sc.id: sc for sc in scenarios if self.get(prompt, sc.id) is None}
        return list(todo.values())

    def reserve(self, calls: int) -> None:
        if self.spent + calls > self.max_metric_calls:
            raise BudgetExceeded(
                f"{calls} metric calls requested, {self.remaining} of {self.max_metric_calls} left"
            )

    def put(self, ev: ScenarioEval) -> None:
        key = (ev.prompt_hash, ev.scenario_id)
        if key in self._cache:
            return
        self.journal.append({"type": "eval", "eval": ev.model_dump(mode="json")})
        self._cache[key] = ev
        self.spent += len(ev.rollouts)


def scenario_eval(group: art.TrajectoryGroup, prompt: str) -> ScenarioEval:
    rows = [trajectory_row(t) for t in group.trajectories]
    first = rows[0]["messages"] if rows else []
    inputs = "\n\n".join(str(m.get("content", "")) for m in first if m.get("role") != "system")
    return ScenarioEval(
        scenario_id=str(group.metadata.get("scenario_id") or rows[0]["scenario_id"]),
        prompt_hash=prompt_hash(prompt),
        inputs=inputs,
        rollouts=tuple(
            RolloutTrace(
                output=row["completion"] or "",
                reward=float(row["reward"]),
                feedback=str(row["feedback"] or ""),
                truncated=bool(row["metrics"].get("truncated", 0.0)),
            )
            for row in rows
        ),
    )


class ARTPromptAdapter:
    """gepa's `GEPAAdapter` protocol for a one-component candidate {"system_prompt": text}."""

    propose_new_texts = None  # reflection is ours (see art_rlvr.gepa.optimizer)

    def __init__(
        self,
        model: art.Model,
        store: EvalStore,
        *,
        sampling: SamplingConfig,
        rollouts_per_problem: int,
        seed: int,
        max_reflection_examples: int = 8,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.model = model
        self.store = store
        self.sampling = sampling
        self.rollouts_per_problem = rollouts_per_problem
        self.seed = seed
        self.max_reflection_examples = max_reflection_examples
        self.loop = loop

    async def aevaluate(self, scenarios: Sequence[Scenario], prompt: str) -> list[ScenarioEval]:
        """One ScenarioEval per scenario; only the ones never run for this prompt cost calls."""
        todo = self.store.missing(prompt, scenarios)
        if todo:
            self.store.reserve(len(todo) * self.rollouts_per_problem)
            groups = await gather_groups(
                self.model,
                todo,
                self.rollouts_per_problem,
                system_prompt=prompt,
                sampling=self.sampling,
                seed=self.seed,
                description=f"gepa eval {prompt_hash(prompt)}",
            )
            for group in groups:
                self.store.put(scenario_eval(group, prompt))
        out = []
        for sc in scenarios:
            ev = self.store.get(prompt, sc.id)
            if ev is None:
                raise RuntimeError(f"no evaluation came back for scenario {sc.id}")
            out.append(ev)
        return out

    def evaluate(
        self,
        batch: list[Scenario],
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
        records = reflective_records(evals, self.max_reflection_examples)
        return {name: records for name in components_to_update}
