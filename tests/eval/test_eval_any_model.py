"""`mode=eval` of an external model: n samples per item, pass@k, key from the environment.

Every run is the CLI against the scripted OpenAI-compatible server on loopback: a base URL
goes through ART's own client, a provider string through litellm (pointed at the server by
`OPENAI_BASE_URL`, as litellm reads it). The headline run is `python -m art_rlvr.run` in a
process of its own; the others call the same `art_rlvr.run.main` in this one, which spares
each the CLI's ~20 s of CPU for imports.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from clirun import base_env, cli

from art_rlvr.eval.evaluate import mean_pass_at_k, pass_at_k
from art_rlvr.rundir.events import EvalEvent, RunSummary, parse_events
from art_rlvr.rundir.stored import read_trajectories
from art_rlvr.scenarios.scenario import load_scenario
from art_rlvr.testing.scripted_server import Recorded, ScriptedServer, Step

KEY = "sk-test-3f9a1c77e2b04d"  # only ever in the environment of the run
ITEMS, N = 3, 4


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 0, 1, 0.0),
        (4, 4, 1, 1.0),
        (4, 2, 1, 0.5),
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 1, 4, 1.0),
        (4, 3, 2, 1.0),  # n - c < k: every draw of 2 holds a correct one
        (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
        (1, 1, 1, 1.0),
        (5, 0, 5, 0.0),
    ],
)
def test_unbiased_pass_at_k(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)
    if k == 1:
        assert pass_at_k(n, c, k) == pytest.approx(c / n)  # pass@1 is the plain accuracy


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, 2, 5), (4, 2, 0), (4, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def answers(seed: int) -> list[str]:
    return [str(s.x["answer"]) for s in load_scenario("arith", seed=seed).splits["val"][:ITEMS]]


def script(seed: int, correct: list[list[bool]]) -> list[Step]:
    """Replies in item-major order (item i's samples 0..n-1): the answer, or the answer + 1."""
    truth = answers(seed)
    return [
        Step.reply(truth[i] if ok else str(int(truth[i]) + 1))
        for i, row in enumerate(correct)
        for ok in row
    ]


@dataclass
class Run:
    done: subprocess.CompletedProcess[str]
    path: Path
    requests: list[Recorded]


# seed 0: item A right 2 of 4, item B 0 of 4, item C 1 of 4
#   pass@1 = (2/4 + 0 + 1/4) / 3 = 0.25
#   pass@2 = ((1 - 1/6) + 0 + (1 - 3/6)) / 3 = 4/9
#   pass@4 = (1 + 0 + 1) / 3 = 2/3
SEED0 = [[True, False, False, True], [False] * 4, [False, True, False, False]]
SEED0_PASS = {1: 0.25, 2: 4 / 9, 4: 2 / 3}
# seed 1: A 4 of 4, B 1 of 4, C 0 of 4: pass@1 = 5/12, pass@4 = 2/3
SEED1 = [[True] * 4, [False, False, False, True], [False] * 4]


def external_args(server: ScriptedServer, run_dir: Path, seed: int) -> list[str]:
    """`mode=eval` of the scripted model: N samples of ITEMS items, one request at a time."""
    return [
        "mode=eval",
        "policy.model=openai/scripted",
        f"policy.api_base={server.base_url}",
        "policy.api_key_env=ART_RLVR_TEST_KEY",
        "policy.max_in_flight=1",
        f"eval_samples={N}",
        "eval_temperature=1.0",
        "eval_k=1,2,4",
        f"val_limit={ITEMS}",
        f"seed={seed}",
        f"run_dir={run_dir}",
    ]


def external_run(
    root: Path, seed: int, correct: list[list[bool]], *, own_process: bool = False
) -> Run:
    """The scripted model evaluated through ART's client, one request at a time so the
    script's order is the items' order (the test also checks that from the server's log)."""
    with ScriptedServer(script(seed, correct)) as server:
        path = root / f"external-s{seed}"
        done = cli(
            external_args(server, path, seed),
            base_env(ART_RLVR_TEST_KEY=KEY),
            own_process=own_process,
        )
        return Run(done, path, server.chat_requests)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Run]:
    root = tmp_path_factory.mktemp("external")
    return {
        0: external_run(root, 0, SEED0, own_process=True),
        1: external_run(root, 1, SEED1),
    }


def test_scripted_model_reports_hand_computed_pass_at_k(runs: dict[int, Run]) -> None:
    run = runs[0]
    assert run.done.returncode == 0, run.done.stderr[-3000:]
    assert "pass@1 0.250, pass@2 0.444, pass@4 0.667 (n=4)" in run.done.stdout
    summary = RunSummary.model_validate_json((run.path / "summary.json").read_text())
    assert summary.pass_at_k == pytest.approx(SEED0_PASS)
    assert summary.val_accuracy_after == pytest.approx(0.25)
    assert (summary.policy, summary.eval_samples, summary.rollouts) == ("openai/scripted", N, 12)
    assert summary.completion_tokens == 12  # one word per scripted reply
    assert summary.cost_usd is None  # litellm has no price for it: none, never a guess
    (event,) = parse_events((run.path / "metrics.jsonl").read_text().splitlines())
    assert isinstance(event, EvalEvent) and event.pass_at == pytest.approx(SEED0_PASS)
    assert (event.samples, event.errors, event.policy) == (N, 0, "openai/scripted")
    rows = read_trajectories(run.path / "trajectories" / "val_0000.jsonl")
    assert len(rows) == ITEMS * N
    assert not (run.path / ".art").exists()  # no backend, no embedded model


def test_pass_at_k_matches_what_the_server_answered(runs: dict[int, Run]) -> None:
    """Independent of request order: which item each request asked and what it got back."""
    run = runs[0]
    truth = answers(0)
    questions = [s.messages()[-1]["content"] for s in load_scenario("arith").splits["val"][:ITEMS]]
    replies = script(0, SEED0)
    assert len(run.requests) == ITEMS * N
    correct = [0] * ITEMS
    for request in run.requests:
        item = questions.index(request.last_user_text)
        correct[item] += replies[request.step].text == truth[item]
        assert request.body["model"] == "scripted" and request.body["temperature"] == 1.0
        assert request.headers["authorization"] == f"Bearer {KEY}"  # the key did reach it
    assert correct == [2, 0, 1]
    assert len({r.body["seed"] for r in run.requests}) == ITEMS * N  # each sample its own seed
    for k, expected in SEED0_PASS.items():
        by_hand = sum(1 - math.comb(N - c, k) / math.comb(N, k) for c in correct) / ITEMS
        assert by_hand == pytest.approx(expected) == mean_pass_at_k(correct, N, k)


def test_the_key_is_in_no_file_the_run_wrote(runs: dict[int, Run]) -> None:
    files = [p for run in runs.values() for p in run.path.rglob("*") if p.is_file()]
    assert len(files) >= 4 * len(runs)  # config, summary, metrics, log, trajectories
    assert [p for p in files if KEY.encode() in p.read_bytes()] == []
    assert all(KEY not in run.done.stdout + run.done.stderr for run in runs.values())
    config = json.loads((runs[0].path / "config.json").read_text())
    assert config["policy"]["api_key_env"] == "ART_RLVR_TEST_KEY"  # the name, never the value


def trained_run(root: Path, seed: int, before: float, after: float) -> Path:
    """A finished RL run folder as art_rlvr.run leaves it (as tests/report/test_compare.py fakes one)."""
    path = root / f"rl-s{seed}"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"scenario": "arith", "mode": "rl", "seed": seed}))
    summary = {"mode": "rl", "scenario": "arith", "seed": seed, "val_accuracy_before": before}
    summary |= {"val_accuracy_after": after, "rollouts": 288, "wall_seconds": 600}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_compare_puts_the_external_model_beside_a_trained_run(
    runs: dict[int, Run], tmp_path: Path
) -> None:
    assert runs[1].done.returncode == 0, runs[1].done.stderr[-3000:]
    trained = [trained_run(tmp_path, 0, 0.2, 0.5), trained_run(tmp_path, 1, 0.3, 0.6)]
    done = subprocess.run(
        [sys.executable, "-m", "art_rlvr.compare", *map(str, trained)]
        + [str(run.path) for run in runs.values()],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    header, _, *lines = done.stdout.strip().splitlines()
    names = [c.strip() for c in header.strip("|").split("|")]
    rows = {
        cells[1]: cells
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)
    }
    assert list(rows) == ["external: openai/scripted", "RL-only (fixed prompt)"]
    external = dict(zip(names, rows["external: openai/scripted"], strict=True))
    rl = dict(zip(names, rows["RL-only (fixed prompt)"], strict=True))
    # mean ± std over seeds 0 and 1: pass@1 0.25 and 5/12, pass@4 2/3 both
    assert external["seeds"] == "0,1"
    assert external["pass@1"] == "0.333 ± 0.118"
    assert external["pass@2"] == f"{(4 / 9 + (1 + 0.5) / 3) / 2:.3f} ± 0.039"
    assert external["pass@4"] == "0.667 ± 0.000"
    assert external["val after"] == "0.333 ± 0.118" and external["eval tokens"] == "12 ± 0"
    assert rl["val after"] == "0.550 ± 0.071" and rl["pass@1"] == "-" and rl["cost $"] == "-"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [
                "policy.model=openai/scripted",
                "policy.api_base={base}",
                "policy.api_key_env=ART_RLVR_UNSET_KEY",
            ],
            "error: policy.api_key_env: environment variable ART_RLVR_UNSET_KEY is not set",
        ),
        (
            ["policy.model=openai/gpt-4o-mini"],  # litellm's own variable, checked by litellm
            "error: policy.model=openai/gpt-4o-mini needs OPENAI_API_KEY in the environment",
        ),
    ],
)
def test_a_missing_key_is_one_line_before_any_request(
    args: list[str], message: str, tmp_path: Path
) -> None:
    with ScriptedServer([], default=Step.reply("1")) as server:
        argv = [a.format(base=server.base_url) for a in args]
        done = cli(
            ["mode=eval", *argv, f"run_dir={tmp_path / 'run'}"],
            base_env(OPENAI_BASE_URL=server.base_url),
        )
        assert server.requests == []
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


def test_litellm_path_counts_tokens_and_cost(tmp_path: Path) -> None:
    """A provider string without a base URL goes through litellm.acompletion (really, over
    HTTP to the scripted server); gpt-4o-mini is in litellm's price map, so the run reports
    what litellm charges for the usage the server sent (1 prompt token, 1 word of reply).
    The one reply is the first item's answer: item 1 is 2 of 2 right, item 2 0 of 2."""
    import litellm

    price = litellm.model_cost["gpt-4o-mini"]
    first, second = answers(0)[:2]
    assert first != second
    with ScriptedServer([], default=Step.reply(first)) as server:
        done = cli(
            [
                "mode=eval",
                "policy.model=openai/gpt-4o-mini",
                "eval_samples=2",
                "eval_temperature=0.5",
                "val_limit=2",
                f"run_dir={tmp_path / 'run'}",
            ],
            base_env(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY=KEY),
        )
        requests = server.chat_requests
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(requests) == 4 and {r.body["model"] for r in requests} == {"gpt-4o-mini"}
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in requests)
    summary = RunSummary.model_validate_json((tmp_path / "run" / "summary.json").read_text())
    assert summary.completion_tokens == 4
    expected = 4 * (price["input_cost_per_token"] + price["output_cost_per_token"])
    assert summary.cost_usd == pytest.approx(expected) and summary.cost_usd > 0
    assert summary.pass_at_k == pytest.approx({1: 0.5, 2: 0.5})
    assert f"cost       ${expected:.6f}" in done.stdout
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert files and not [p for p in files if KEY.encode() in p.read_bytes()]


def test_every_rollout_errored_is_a_failure_not_zero(tmp_path: Path) -> None:
    with ScriptedServer([], default=Step.error(400, text="model not found")) as server:
        done = cli(
            [
                "mode=eval",
                "policy.model=openai/scripted",
                f"policy.api_base={server.base_url}",
                "eval_samples=2",
                "eval_temperature=1",
                "val_limit=2",
                f"run_dir={tmp_path / 'run'}",
            ],
            base_env(),
        )
    assert done.returncode == 1
    assert "all 4 val rollouts failed; the first: BadRequestError" in done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "model not found" in summary["failed"] and summary.get("pass_at_k") is None


async def test_the_embedded_model_gets_pass_at_k_too(scenario, model, tmp_path: Path) -> None:
    """`mode=eval eval_samples=n` without a policy samples the run's own model n times."""
    import time

    from art_rlvr.config.run_config import parse_args
    from art_rlvr.loops.context import RunContext
    from art_rlvr.loops.runner import run_phases
    from art_rlvr.rundir.files import RunFiles

    words = ["mode=eval", "eval_samples=3", "eval_temperature=1.0", "val_limit=2", "max_tokens=4"]
    cfg = parse_args([*words, f"run_dir={tmp_path}"])
    files = RunFiles(tmp_path)
    val = scenario.splits["val"][:2]
    result = await run_phases(RunContext(cfg, scenario, None, model, files, time.monotonic()))
    assert set(result["pass_at_k"]) == {1, 3} and result["rollouts"] == 6
    assert result["policy"] is None and result["cost_usd"] is None
    rows = read_trajectories(tmp_path / "trajectories" / "val_0000.jsonl")
    assert len(rows) == 6
    correct = [sum(r.correct for r in rows if r.scenario_id == s.id) for s in val]
    assert result["pass_at_k"] == pytest.approx(
        {1: sum(correct) / 6, 3: mean_pass_at_k(correct, 3, 3)}
    )
    (event,) = files.events()
    assert event.samples == 3 and event.pass_at == result["pass_at_k"]
