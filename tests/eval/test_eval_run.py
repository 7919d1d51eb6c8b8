"""`mode=eval` at parity with vf-eval: the unbiased pass@k and pass^k against a brute-force
reference on the same samples, a journal that a killed evaluation resumes from without running
a finished rollout again, metadata, and the stored rollouts exported as a `datasets` folder.

The policy is the scripted OpenAI-compatible server on loopback, through ART's own client (one
request at a time, so the script's order is the items' order; the server's log checks it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import art
import pytest
from clirun import base_env, cli
from test_eval_any_model import ITEMS, N, external_args

from art_rlvr.eval.evaluate import mean_pass_all_k, mean_pass_at_k, pass_all_k, pass_at_k
from art_rlvr.eval.journal import EvalPlan, evaluate_resumable, plan_for
from art_rlvr.export_dataset import main as export_main
from art_rlvr.rollouts.sampling import SamplingConfig, rollout_seed
from art_rlvr.rundir.events import RunSummary
from art_rlvr.rundir.files import StateFileError
from art_rlvr.rundir.stored import read_trajectories
from art_rlvr.scenarios.scenario import Example, load_scenario
from art_rlvr.testing import ScriptedServer, Step

SEED = 0  # ITEMS items x N samples, as test_eval_any_model's runs
# item 0 right 2 of 4, item 1 0 of 4, item 2 3 of 4
PATTERN = [[True, False, True, False], [False] * 4, [True, True, False, True]]


def brute_force(outcomes: list[bool], k: int) -> tuple[float, float]:
    """pass@k and pass^k of one item as the mean over every k-subset of its samples."""
    subsets = list(itertools.combinations(outcomes, k))
    return (
        sum(any(s) for s in subsets) / len(subsets),
        sum(all(s) for s in subsets) / len(subsets),
    )


@pytest.mark.parametrize("n", range(1, 9))
def test_estimators_equal_the_mean_over_every_subset(n: int) -> None:
    for c, k in itertools.product(range(n + 1), range(1, n + 1)):
        at, every = brute_force([True] * c + [False] * (n - c), k)
        assert pass_at_k(n, c, k) == pytest.approx(at)
        assert pass_all_k(n, c, k) == pytest.approx(every)


@pytest.mark.parametrize(
    ("n", "c", "k", "at", "every"),
    [
        (8, 3, 2, 0.6429, 0.1071),  # vf-eval v0's estimator on the same counts
        (4, 4, 4, 1.0, 1.0),
        (4, 0, 1, 0.0, 0.0),
        (4, 2, 1, 0.5, 0.5),  # at k = 1 both are the accuracy
        (10, 3, 5, 11 / 12, 0.0),
    ],
)
def test_reference_values(n: int, c: int, k: int, at: float, every: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(at, abs=1e-4)
    assert pass_all_k(n, c, k) == pytest.approx(every, abs=1e-4)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, 2, 5), (4, 2, 0)])
def test_pass_all_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match=r"pass\^k needs"):
        pass_all_k(n, c, k)


def val(limit: int = ITEMS) -> list[Example]:
    return load_scenario("arith", seed=SEED).splits["val"][:limit]


def reply(example: Example, right: bool) -> Step:
    answer = int(example.x["answer"])
    return Step.reply(str(answer if right else answer + 1), delay_s=0.05)


def script(keys: list[tuple[int, int]], examples: list[Example]) -> list[Step]:
    """Replies for (item, sample) keys in the order they will be asked."""
    return [reply(examples[i], PATTERN[i][j]) for i, j in keys]


def policy(server: ScriptedServer) -> art.Model:
    return art.Model(
        name="scripted", project="t", inference_base_url=server.base_url,
        inference_api_key="k", inference_model_name="scripted",
    )  # fmt: skip


def plan(examples: list[Example], samples: int = N) -> EvalPlan:
    scenario = examples[0].scenario
    return plan_for(
        split="val", step=0, policy="scripted", scenario=scenario.name, files=[scenario.path],
        examples=examples, samples=samples, sampling=SAMPLING, seed=SEED, system_prompt=None,
    )  # fmt: skip


SAMPLING = SamplingConfig(max_tokens=8, temperature=1.0)
KEYS = [(i, j) for i in range(ITEMS) for j in range(N)]


async def run(server: ScriptedServer, folder: Path, examples: list[Example], samples: int = N):
    return await evaluate_resumable(
        policy(server), examples, folder=folder, plan=plan(examples, samples),
        sampling=SAMPLING, ks=[1, 2, 4], max_in_flight=1,
    )  # fmt: skip


def journal_keys(folder: Path) -> list[tuple[str, int]]:
    rows = [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines()]
    return [(r["item"], r["sample"]) for r in rows]


def expected(k: int) -> tuple[float, float]:
    per_item = [brute_force(row, k) for row in PATTERN]
    return (
        sum(a for a, _ in per_item) / ITEMS,
        sum(e for _, e in per_item) / ITEMS,
    )


async def test_a_cancelled_eval_resumes_without_rerunning_finished_rollouts(tmp_path: Path) -> None:
    examples = val()
    folder = tmp_path / "evals" / "val_0000"
    with ScriptedServer(script(KEYS, examples)) as first:
        running = asyncio.ensure_future(run(first, folder, examples))
        while not (folder / "rollouts.jsonl").exists() or len(journal_keys(folder)) < 5:
            await asyncio.sleep(0.01)
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    booked = journal_keys(folder)
    ids = [s.id for s in examples]
    left = [k for k in KEYS if (ids[k[0]], k[1]) not in booked]
    assert 5 <= len(booked) < len(KEYS) and len(left) == len(KEYS) - len(booked)
    with ScriptedServer(script(left, examples)) as second:
        result = await run(second, folder, examples)
        asked = [r.body["seed"] for r in second.chat_requests]
    # only the missing rollouts were asked for, each once, with its own seed
    assert asked == [rollout_seed(SEED, ids[i], j) for i, j in left]
    assert sorted(journal_keys(folder)) == sorted((ids[i], j) for i, j in KEYS)
    assert [[r.correct for r in result.rows[i * N : (i + 1) * N]] for i in range(ITEMS)] == PATTERN
    for k in (1, 2, 4):
        at, every = expected(k)
        assert result.report.pass_at[k] == pytest.approx(at)
        assert result.report.pass_all[k] == pytest.approx(every)
        counts = [sum(row) for row in PATTERN]
        assert result.report.pass_at[k] == pytest.approx(mean_pass_at_k(counts, N, k))
        assert result.report.pass_all[k] == pytest.approx(mean_pass_all_k(counts, N, k))
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["status"] == "done" and meta["sessions"] == 2
    assert meta["reused_rollouts"] == len(booked) == result.reused
    assert meta["pass_at_k"] == {str(k): v for k, v in result.report.pass_at.items()}
    assert meta["plan"]["samples"] == N and meta["plan"]["items"] == ITEMS
    assert meta["correct_rule"].startswith("outcome.is_correct")
    assert meta["completion_tokens"] == ITEMS * N  # one word per scripted reply
    assert meta["wall_seconds"] > 0


async def test_a_torn_last_line_is_dropped_and_nothing_runs_again(tmp_path: Path) -> None:
    examples = val(1)
    folder = tmp_path / "evals" / "val_0000"
    with ScriptedServer(script([(0, j) for j in range(N)], examples)) as server:
        first = await run(server, folder, examples)
    with (folder / "rollouts.jsonl").open("a") as handle:
        handle.write('{"item": "' + examples[0].id + '", "sample": 0, "se')  # a kill mid-write
    with ScriptedServer([]) as server:
        again = await run(server, folder, examples)
        assert server.chat_requests == []
    assert (folder / "rollouts.jsonl").read_text().endswith("\n")
    assert len(journal_keys(folder)) == N
    assert again.report.pass_at == first.report.pass_at and again.reused == N


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda line: line[: len(line) // 2], "not JSON"),  # cut short, then written past
        (lambda line: line.replace('"sample"', '"samples"'), "sample: Field required"),
    ],
)
async def test_a_bad_middle_line_stops_the_resume_and_its_rollout_is_not_lost_or_repaid(
    tmp_path: Path, damage: Callable[[str], str], says: str
) -> None:
    """Not silently skipped (that rollout would be paid for again, unseen): the resume stops
    at the line, pays for nothing, and leaves the file as found; with the line deleted, only
    its rollout runs again."""
    examples = val(1)
    folder = tmp_path / "evals" / "val_0000"
    with ScriptedServer(script([(0, j) for j in range(N)], examples)) as server:
        first = await run(server, folder, examples)
    path = folder / "rollouts.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lost = json.loads(lines[1])["sample"]
    lines[1] = damage(lines[1].rstrip("\n")) + "\n"
    path.write_text("".join(lines))
    with ScriptedServer([]) as server:
        with pytest.raises(StateFileError, match=rf"rollouts\.jsonl:2 is corrupt \({says}"):
            await run(server, folder, examples)
        assert server.chat_requests == []
    assert path.read_text() == "".join(lines)
    path.write_text("".join(lines[:1] + lines[2:]))  # what the message says to do
    with ScriptedServer(script([(0, lost)], examples)) as server:
        again = await run(server, folder, examples)
        asked = [r.body["seed"] for r in server.chat_requests]
    assert asked == [rollout_seed(SEED, examples[0].id, lost)]
    assert again.reused == N - 1 and again.report.pass_at == first.report.pass_at


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"samples": 2}, "samples: 2 now, 4 there"),
        ({"limit": 2}, "items: 2 now, 1 there"),
    ],
)
async def test_a_journal_of_other_settings_is_refused(
    tmp_path: Path, change: dict[str, int], says: str
) -> None:
    folder = tmp_path / "evals" / "val_0000"
    examples = val(1)
    with ScriptedServer(script([(0, j) for j in range(N)], examples)) as server:
        await run(server, folder, examples)
    other = val(change.get("limit", 1))
    with ScriptedServer([]) as server, pytest.raises(StateFileError, match=says):
        await run(server, folder, other, change.get("samples", N))
    (folder / "metadata.json").write_text('{"plan": ')
    with ScriptedServer([]) as server, pytest.raises(StateFileError, match="is corrupt"):
        await run(server, folder, examples)


def test_cli_eval_killed_with_sigkill_resumes_and_exports(tmp_path: Path) -> None:
    """`python -m art_rlvr.run mode=eval` killed (SIGKILL) mid-way; the same command again
    runs only what the journal lacks; summary, metadata and metrics agree with the reference;
    the rollouts export to a folder `datasets.load_dataset` reads."""
    examples = val()
    ids = [s.id for s in examples]
    run_dir = tmp_path / "run"
    folder = run_dir / "evals" / "val_0000"
    env = base_env(ART_RLVR_TEST_KEY="sk-test-resume")
    slow = [s.model_copy(update={"delay_s": 1.0}) for s in script(KEYS, examples)]
    with ScriptedServer(slow) as first:
        process = subprocess.Popen(
            [sys.executable, "-m", "art_rlvr.run", *external_args(first, run_dir, SEED)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and process.poll() is None:
            if (folder / "rollouts.jsonl").exists() and len(journal_keys(folder)) >= 3:
                break
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        assert process.returncode == -signal.SIGKILL, process.stderr.read().decode()[-2000:]
    booked = journal_keys(folder)
    left = [k for k in KEYS if (ids[k[0]], k[1]) not in booked]
    assert 3 <= len(booked) < len(KEYS)
    with ScriptedServer(script(left, examples)) as second:
        done = cli(external_args(second, run_dir, SEED), env)
        asked = [r.body["seed"] for r in second.chat_requests]
    assert done.returncode == 0, done.stderr[-3000:]
    assert asked == [rollout_seed(SEED, ids[i], j) for i, j in left]
    summary = RunSummary.model_validate_json((run_dir / "summary.json").read_text())
    for k in (1, 2, 4):
        at, every = expected(k)
        assert summary.pass_at_k[k] == pytest.approx(at)
        assert summary.pass_all_k[k] == pytest.approx(every)
    assert (
        "pass^2" in done.stdout
        and "rollouts from an earlier session" in (run_dir / "run.log").read_text()
    )
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["sessions"] == 2 and meta["reused_rollouts"] == len(booked)
    assert meta["model"] == {"policy": "openai/scripted", "api_base": second.base_url}
    assert meta["plan"]["policy"] == "openai/scripted" and meta["versions"]["openpipe-art"]
    rows = read_trajectories(run_dir / "trajectories" / "val_0000.jsonl")
    assert [(r.scenario_id, r.meta_int("sample")) for r in rows] == [(ids[i], j) for i, j in KEYS]

    out = tmp_path / "dataset"
    assert export_main([str(run_dir), "--out", str(out)]) == 0
    import datasets

    loaded = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf-cache"))
    table = loaded["val"]
    assert table.num_rows == ITEMS * N
    assert [(r["example_id"], r["sample"]) for r in table] == [(ids[i], j) for i, j in KEYS]
    assert [r["correct"] for r in table] == [c for row in PATTERN for c in row]
    first_row = table[0]
    assert [m["role"] for m in first_row["prompt"]] == ["system", "user"]
    assert [m["role"] for m in first_row["completion"]] == ["assistant"]
    assert first_row["seed"] == rollout_seed(SEED, ids[0], 0)
    assert first_row["metrics"]["correct"] == 1.0 and first_row["source"] == "val_0000"
    direct = datasets.load_dataset(
        "parquet",
        data_files={"val": str(out / "data" / "val-00000-of-00001.parquet")},
        cache_dir=str(tmp_path / "hf-cache"),
    )
    assert direct["val"]["reward"] == table["reward"]


def test_resume_false_refuses_an_evaluation_already_there(tmp_path: Path) -> None:
    examples = val()
    run_dir = tmp_path / "run"
    env = base_env(ART_RLVR_TEST_KEY="sk-test-resume")
    with ScriptedServer(script(KEYS, examples)) as server:
        assert cli(external_args(server, run_dir, SEED), env).returncode == 0
    with ScriptedServer([]) as server:
        done = cli([*external_args(server, run_dir, SEED), "resume=false"], env)
        assert server.chat_requests == []
    assert done.returncode == 2
    assert "evals/val_0000 already holds an evaluation; pass resume=true" in done.stderr
