"""`mode=eval` as vf-eval does it, and resumable: n rollouts per item, each written to a journal
the moment it finishes, the unbiased pass@k and pass^k, and a metadata file.

An evaluation lives in `evals/<split>_<step>/` of the run folder:

- `metadata.json` (replaced atomically): the plan (what is evaluated: the policy and its step,
  the scenario files' and the records' hashes, n, sampling, seed, system prompt) and, once
  finished, the results: pass@k, pass^k, mean reward and metrics, tokens, wall time over every
  session, cost where the provider reports one, package versions.
- `rollouts.jsonl`: one line per finished rollout (item id, sample index, seed, the whole
  trajectory as `rundir.stored` keeps it, the session and what it had spent so far), written
  through the one write-ahead journal of paid evaluations (`rundir.journal`, GEPA's too):
  appended and fsynced per rollout; a kill's torn last line is dropped, any other bad line
  stops the resume naming its line (a skip would pay for that rollout again). A reused rollout
  is the very trajectory, token data included; a journal of the layout before (a readable
  `row` per rollout) still resumes.

Run the same command again after a kill and only the missing (item, sample) pairs are rolled
out; a journal left by other settings is refused, never mixed in. A rollout that raised is not
journaled: it counts as incorrect in that session's report and runs again on a resume.

Correct means `art_rlvr.core.outcome.is_correct` (the reward's `correct` metric, else reward >= 1,
or >= the `correct_threshold` a rollout function's scenario declares for its ART rewards), the
one rule accuracy, GEPA and expert iteration use, written out in `metadata.json`
(`correct_rule`); vf-eval's v0 counted reward >= 0.5. For rewards that are 0 or 1 the two
agree; for partial credit (`qa`'s F1, `arith_retry`'s discount) ours asks for the reward's own
verdict.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import art
from pydantic import BaseModel, ConfigDict, Field, model_validator

from art_rlvr.core.text import prompt_hash
from art_rlvr.eval.evaluate import SampledReport, describe, mean_pass_all_k, mean_pass_at_k
from art_rlvr.observe import tracing
from art_rlvr.rollouts.functions import RolloutFunctionError, rollout_failure
from art_rlvr.rollouts.rollout import rollout
from art_rlvr.rollouts.sampling import SamplingConfig, rollout_seed
from art_rlvr.rundir.events import RolloutsFailed
from art_rlvr.rundir.files import StateFileError, write_json_atomic
from art_rlvr.rundir.journal import Journal
from art_rlvr.rundir.stored import StoredTrajectory, legacy_trajectory, stored_trajectory
from art_rlvr.scenarios.scenario import Example


def correct_rule_of(examples: Sequence[Example]) -> str:
    """`outcome.is_correct`'s rule for these scenarios, in words (each task's, when they differ:
    a mixture of a [0, 1] reward and a rollout function's ART rewards)."""
    rules = {s.scenario.name: s.scenario.correct_rule for s in examples}
    said = (
        next(iter(rules.values()))
        if len(set(rules.values())) == 1
        else "; ".join(f"{name}: {rule}" for name, rule in rules.items())
    )
    return f"outcome.is_correct: {said}"


class Spent(BaseModel):
    """What a policy reports having spent (litellm's path); cost None: not known."""

    model_config = ConfigDict(frozen=True)

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None


class EvalPlan(BaseModel):
    """What an evaluation is: a resume must find the same plan in the folder."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    split: str
    step: int
    policy: str  # the name the endpoint serves (the run's model carries its step)
    scenario: str
    scenario_files: dict[str, str]  # path -> sha256 of the definition's text
    items: int
    items_sha256: str  # of the evaluated records (ids and fields), in order
    samples: int
    sampling: dict[str, object]
    seed: int
    system_prompt_hash: str

    def differences(self, other: EvalPlan) -> list[str]:
        mine, theirs = self.model_dump(), other.model_dump()
        return [f"{k}: {mine[k]!r} now, {theirs[k]!r} there" for k in mine if mine[k] != theirs[k]]


class JournalRow(BaseModel):
    """One finished rollout in `rollouts.jsonl`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    item: str
    sample: int
    seed: int
    task: str
    session: int
    session_seconds: float  # since that session started
    spent: Spent | None = None  # that session's spending when this rollout was booked
    trajectory: StoredTrajectory | None = None
    row: dict[str, object] | None = None  # a journal of the layout before: a readable row

    @model_validator(mode="after")
    def _one_rollout(self) -> JournalRow:
        if (self.trajectory is None) == (self.row is None):
            raise ValueError("a journal row holds its rollout as `trajectory` (or an old `row`)")
        return self

    @property
    def key(self) -> tuple[str, int]:
        return self.item, self.sample

    @property
    def stored(self) -> StoredTrajectory:
        if self.trajectory is not None:
            return self.trajectory
        return legacy_trajectory({**(self.row or {}), "scenario_id": self.item})

    @property
    def correct(self) -> bool:
        return self.stored.correct


def items_digest(examples: Sequence[Example]) -> str:
    blob = json.dumps([[s.id, s.x] for s in examples], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def file_digests(paths: Sequence[Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def read_journal(journal: Journal, wanted: set[tuple[str, int]]) -> list[JournalRow]:
    """The journal's rows of the wanted (item, sample) pairs, each once (the first booked).
    A torn last line (a kill mid-write) is cut off; any other bad line stops the resume with
    its file and line (`rundir.journal`): skipping it would pay for that rollout again."""
    rows: dict[tuple[str, int], JournalRow] = {}
    for row in journal.read(JournalRow.model_validate):
        if row.key in wanted:
            rows.setdefault(row.key, row)
    return list(rows.values())


def open_plan(folder: Path, plan: EvalPlan) -> dict[str, object]:
    """The folder's metadata, started for `plan` if new; another plan's folder is an error."""
    path = folder / "metadata.json"
    if path.exists():
        try:
            meta = json.loads(path.read_text())
            found = EvalPlan.model_validate(meta["plan"])
        except (ValueError, KeyError, TypeError) as error:
            raise StateFileError(
                f"{path} is corrupt ({describe(error)}); move the folder away to start over"
            ) from None
        if differences := plan.differences(found):
            raise StateFileError(
                f"{folder} holds an evaluation with other settings ({'; '.join(differences)}); "
                "use a new run_dir, or move that folder away to start it over"
            )
        return meta
    meta = {"plan": plan.model_dump(mode="json"), "status": "running"}
    write_json_atomic(path, meta)
    return meta


def rebuilt(row: JournalRow) -> art.Trajectory:
    """A journaled rollout as the `art.Trajectory` it was (a journal of the layout before: its
    messages, without token data), with its item, sample and seed in the metadata."""
    trajectory = row.stored.to_art()
    trajectory.metadata = {
        **trajectory.metadata,
        "scenario_id": row.item,
        "task": row.task,
        "sample": row.sample,
        "seed": row.seed,
    }
    return trajectory


def session_totals(rows: Sequence[JournalRow]) -> tuple[float, Spent | None, int]:
    """Wall seconds and spending booked by earlier sessions (each session's last row holds its
    running totals; what was in flight at a kill is not in them), and how many there were."""
    last: dict[int, JournalRow] = {}
    for row in rows:
        if row.session not in last or row.session_seconds > last[row.session].session_seconds:
            last[row.session] = row
    seconds = sum(r.session_seconds for r in last.values())
    spent = [r.spent for r in last.values()]
    if any(s is None for s in spent):
        return seconds, None, len(last)
    return seconds, add_spent(*[s for s in spent if s is not None]), len(last)


def add_spent(*parts: Spent) -> Spent:
    """Spending summed; a cost is known only if every part's is."""
    costs = [p.cost_usd for p in parts]
    return Spent(
        requests=sum(p.requests for p in parts),
        prompt_tokens=sum(p.prompt_tokens for p in parts),
        completion_tokens=sum(p.completion_tokens for p in parts),
        cost_usd=None if any(c is None for c in costs) else sum(c for c in costs if c is not None),
    )


class EvalResult(BaseModel):
    """The evaluation's report and its metadata (what `metadata.json` holds)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    report: SampledReport
    metadata: dict[str, object]
    rows: list[JournalRow]  # every booked rollout, by item then sample
    reused: int = Field(ge=0)  # rollouts taken from the journal of earlier sessions


def _inputs(inputs: Mapping[str, object]) -> dict[str, object]:
    plan = inputs.get("plan")
    where = (
        {"split": plan.split, "step": plan.step, "samples": plan.samples}
        if isinstance(plan, EvalPlan)
        else {}
    )
    return {**tracing.evaluate_inputs(inputs), **where}


def _output(result: EvalResult) -> dict[str, object]:
    return {**tracing.evaluate_output(result.report), "reused": result.reused}


@tracing.op("art_rlvr.evaluate", inputs=_inputs, output=_output)
async def evaluate_resumable(
    model: art.Model,
    examples: Sequence[Example],
    *,
    folder: Path,
    plan: EvalPlan,
    sampling: SamplingConfig,
    ks: Sequence[int],
    system_prompt: str | None = None,
    max_in_flight: int | None = None,
    spent: Callable[[], Spent | None] = lambda: None,
    about: dict[str, object] | None = None,
) -> EvalResult:
    """`plan.samples` rollouts of each scenario by any policy with rollout's surface, sample i
    seeded from (plan.seed, scenario id, i), journaled in `folder` as each finishes; rollouts
    already journaled there are reused. `spent` reads the policy's running spending; `about`
    goes into the metadata as is (model, versions)."""
    if not examples:
        raise ValueError(f"no {plan.split} scenarios to evaluate")
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    meta = open_plan(folder, plan)
    journal = Journal(folder / "rollouts.jsonl")
    n = plan.samples
    wanted = {(s.id, i) for s in examples for i in range(n)}
    earlier = read_journal(journal, wanted)
    done = {r.key for r in earlier}
    session = max((r.session for r in earlier), default=0) + 1
    limiter = asyncio.Semaphore(max_in_flight) if max_in_flight else None

    fresh: list[tuple[JournalRow, art.Trajectory]] = []

    async def one(example: Example, i: int) -> art.Trajectory:
        seed = rollout_seed(plan.seed, example.id, i)
        trajectory = await rollout(
            model,
            example,
            system_prompt=system_prompt,
            sampling=sampling.model_copy(update={"seed": seed}),
            limiter=limiter,
            metadata={"sample": i, "seed": seed},
        )
        if reason := rollout_failure(trajectory):  # not journaled: a resume runs it again
            raise RolloutFunctionError(reason)
        row = JournalRow(
            item=example.id,
            sample=i,
            seed=seed,
            task=example.scenario.name,
            session=session,
            session_seconds=time.monotonic() - started,
            spent=spent(),
            trajectory=stored_trajectory(trajectory),
        )
        journal.append(row.model_dump(mode="json"))  # no await: a cancel cannot tear it
        fresh.append((row, trajectory))
        return trajectory

    todo = [(s, i) for s in examples for i in range(n) if (s.id, i) not in done]
    results = await art.gather_trajectories(
        [one(s, i) for s, i in todo],
        pbar_desc=f"eval {plan.split} x{n}" + (f" ({len(done)} done before)" if done else ""),
        max_exceptions=len(todo),
    )
    failures = [r for r in results if isinstance(r, BaseException)]
    first_error = describe(failures[0]) if failures else None
    if not fresh and not earlier:
        raise RolloutsFailed(
            f"all {len(todo)} {plan.split} rollouts failed; the first: {first_error}"
        )
    booked = {row.key: (row, rebuilt(row)) for row in earlier}
    booked |= {row.key: (row, t) for row, t in fresh}
    report = sampled_report(plan, examples, booked, len(failures), first_error, ks)
    seconds, before, sessions = session_totals(earlier)
    now = spent()
    total = add_spent(before, now) if before is not None and now is not None else None
    metadata = {
        **meta,
        "status": "done" if not failures else "incomplete",
        "correct_rule": correct_rule_of(examples),
        "pass_at_k": report.pass_at,
        "pass_all_k": report.pass_all,
        "reward_mean": report.mean_reward,
        "metrics_mean": metric_means(row for row, _ in booked.values()),
        "rollouts": len(booked),
        "errors": len(failures),
        "first_error": first_error,
        "completion_tokens": report.completion_tokens,
        "prompt_tokens": total.prompt_tokens if total else None,
        "cost_usd": total.cost_usd if total else None,
        "wall_seconds": round(seconds + time.monotonic() - started, 3),
        "sessions": sessions + 1,
        "reused_rollouts": len(earlier),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        **(about or {}),
    }
    write_json_atomic(folder / "metadata.json", metadata)
    order = [(s.id, i) for s in examples for i in range(n)]
    rows = [booked[key][0] for key in order if key in booked]
    return EvalResult(report=report, metadata=metadata, rows=rows, reused=len(earlier))


def sampled_report(
    plan: EvalPlan,
    examples: Sequence[Example],
    booked: dict[tuple[str, int], tuple[JournalRow, art.Trajectory]],
    errors: int,
    first_error: str | None,
    ks: Sequence[int],
) -> SampledReport:
    """pass@k and pass^k over the items (a sample that errored counts as incorrect), in
    the scenarios' order, with one group per item."""
    n = plan.samples
    per_item = [[booked[(s.id, i)] for i in range(n) if (s.id, i) in booked] for s in examples]
    correct = [sum(row.correct for row, _ in item) for item in per_item]
    trajectories = [t for item in per_item for _, t in item]
    total = len(examples) * n
    kset = sorted({1, *ks})
    return SampledReport(
        split=plan.split,
        items=len(examples),
        samples=n,
        pass_at={k: mean_pass_at_k(correct, n, k) for k in kset},
        pass_all={k: mean_pass_all_k(correct, n, k) for k in kset},
        mean_reward=sum(t.reward for t in trajectories) / total,
        format_rate=sum(float(t.metrics.get("format", 0.0)) for t in trajectories) / total
        if any("format" in t.metrics for t in trajectories)
        else None,
        completion_tokens=int(
            sum(float(t.metrics.get("completion_tokens", 0)) for t in trajectories)
        ),
        errors=errors,
        first_error=first_error,
        groups=[
            art.TrajectoryGroup([t for _, t in item], metadata={"scenario_id": s.id})
            for s, item in zip(examples, per_item, strict=True)
            if item
        ],
    )


def metric_means(rows: Iterable[JournalRow]) -> dict[str, float]:
    """The mean of every numeric metric over the rollouts that report it."""
    values: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.stored.metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                values.setdefault(key, []).append(float(value))
    return {k: statistics.fmean(v) for k, v in sorted(values.items())}


def plan_for(
    *,
    split: str,
    step: int,
    policy: str,
    scenario: str,
    files: Sequence[Path],
    examples: Sequence[Example],
    samples: int,
    sampling: SamplingConfig,
    seed: int,
    system_prompt: str | None,
) -> EvalPlan:
    return EvalPlan(
        split=split,
        step=step,
        policy=policy,
        scenario=scenario,
        scenario_files=file_digests(files),
        items=len(examples),
        items_sha256=items_digest(examples),
        samples=samples,
        sampling=sampling.model_dump(mode="json", exclude={"seed"}),
        seed=seed,
        system_prompt_hash="the scenario's"
        if system_prompt is None
        else prompt_hash(system_prompt),
    )


def eval_folder(run_root: Path, split: str, step: int) -> Path:
    return run_root / "evals" / f"{split}_{step:04d}"


__all__ = [
    "EvalPlan",
    "EvalResult",
    "JournalRow",
    "Spent",
    "correct_rule_of",
    "eval_folder",
    "evaluate_resumable",
    "plan_for",
    "read_journal",
]
