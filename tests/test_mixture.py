"""Scenario mixtures (`scenario=arith:2,mul:1`): the syntax and its errors, the seeded weighted
draw of each RL batch, and a real run on the embedded model that scores each scenario apart."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest

from art_rlvr.config.run_config import ConfigError, parse_args
from art_rlvr.run import main as run_main
from art_rlvr.run import summary_lines
from art_rlvr.rundir.events import RunSummary
from art_rlvr.rundir.stored import read_trajectories
from art_rlvr.scenarios.mixture import Mixture, MixtureEntry, load_scenarios, parse_mixture
from art_rlvr.scenarios.scenario import batch_examples, load_scenario, scenarios_dir

MUL = """
name = "mul"
system_prompt = "You are a careful calculator. Reply with only the final number."
user_template = "What is {a} {op} {b}? Answer with just the number."

[source]
type = "arith"
ops = ["*"]
min_value = 1
max_value = 12
mul_max_value = 12
splits = { train = 40, val = 20, test = 20 }

[reward]
name = "numeric"
params = { answer_field = "answer" }
"""


@pytest.fixture(scope="module")
def mul(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scenarios") / "mul.toml"
    path.write_text(MUL)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("arith", [("arith", 1.0)]),
        ("arith,gsm8k", [("arith", 1.0), ("gsm8k", 1.0)]),
        ("arith:2, gsm8k:0.5", [("arith", 2.0), ("gsm8k", 0.5)]),
        ("scenarios/arith.toml:3,gsm8k", [("scenarios/arith.toml", 3.0), ("gsm8k", 1.0)]),
    ],
)
def test_mixture_syntax(text: str, expected: list[tuple[str, float]]) -> None:
    assert parse_mixture(text) == tuple(MixtureEntry(name=n, weight=w) for n, w in expected)
    assert parse_args([f"scenario={text}"]).mixture == parse_mixture(text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["scenario=arith:x,gsm8k"], "bad weight 'x' for scenario 'arith': a positive number"),
        (["scenario=arith:0,gsm8k"], "bad weight '0' for scenario 'arith'"),
        (["scenario=arith:-1,gsm8k"], "bad weight '-1' for scenario 'arith'"),
        (["scenario=arith:inf,gsm8k"], "bad weight 'inf' for scenario 'arith'"),
        (["scenario=arith,,gsm8k"], "empty scenario name in 'arith,,gsm8k'"),
        (["scenario=arith,arith:2"], "scenario 'arith' given twice"),
        (["scenario=arith,gsm8k", "mode=gepa"], "a mixture runs with mode=eval or mode=rl"),
        (["scenario=arith,gsm8k", "enable_expert_iteration=true"], "expert iteration work on one"),
    ],
)
def test_bad_mixtures_are_one_line_errors(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=r"^[^\n]*$") as error:
        parse_args(args)
    assert message in str(error.value)


def test_an_unknown_member_stops_the_cli_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_main(["scenario=arith,nosuch", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown scenario 'nosuch'" in err
    assert not (tmp_path / "run").exists()


def test_a_member_may_not_share_another_ones_name(tmp_path: Path) -> None:
    copy = tmp_path / "arith_copy.toml"
    copy.write_text((scenarios_dir() / "arith.toml").read_text())  # its `name` is "arith" too
    with pytest.raises(ValueError, match="are named 'arith'"):
        load_scenarios(f"arith,{copy}")


def test_batches_are_seeded_weighted_and_walk_each_scenario_without_repeats(mul: Path) -> None:
    mixture = load_scenarios(f"arith:3,{mul}:1", seed=0)
    assert isinstance(mixture, Mixture) and mixture.name == "arith+mul"
    batches = [mixture.train_batch(6, 0, b) for b in range(200)]
    assert batches[:5] == [mixture.train_batch(6, 0, b) for b in range(5)]  # a pure function
    assert [mixture.train_batch(6, 1, b) for b in range(5)] != batches[:5]
    names = Counter(s.scenario.name for batch in batches for s in batch)
    assert abs(names["arith"] / 1200 - 0.75) < 0.04  # drawn by weight
    mul_ids = [s.id for batch in batches for s in batch if s.scenario.name == "mul"]
    assert len(set(mul_ids[:40])) == 40  # its 40 train records, each once, before any repeats
    assert set(mul_ids) == {s.id for s in mixture.scenarios[1].splits["train"]}
    assert [len(mixture.held_out("val", 3))] == [6]  # a limit applies to each scenario


def test_one_scenario_keeps_its_batches() -> None:
    scenario = load_scenario("arith", seed=0)
    assert load_scenarios("arith").splits == scenario.splits
    assert scenario.train_batch(6, 0, 7) == batch_examples(scenario.splits["train"], 6, 0, 7)


@pytest.fixture(scope="module")
def mixture_run(mul: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    run_dir = tmp_path_factory.mktemp("mixture") / "run"
    args = [
        f"scenario=arith,{mul}",
        "mode=rl",
        "n_batches=1",
        "groups_per_batch=2",
        "group_size=2",
        "val_limit=4",
        "max_tokens=8",
        "eval_test=false",
        f"run_dir={run_dir}",
    ]
    handlers = logging.getLogger().handlers[:]
    code = run_main(args)
    logging.getLogger().handlers[:] = handlers  # main points the root logger at run.log
    assert code == 0
    return run_dir, (run_dir / "run.log").read_text()


def test_a_mixture_run_trains_and_scores_each_scenario(
    mixture_run: tuple[Path, str], mul: Path
) -> None:
    run_dir, log = mixture_run
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    assert [e["step"] for e in evals] == [0, 1]
    assert [e["event"] for e in events].count("train") == 1
    for event in evals:
        assert set(event["by_scenario"]) == {"arith", "mul"}
        scores = event["by_scenario"].values()
        assert event["accuracy"] == pytest.approx(sum(scores) / 2)  # the mean over scenarios
        assert all(round(a * 4) == a * 4 for a in scores)  # 4 val items each
    summary = RunSummary.model_validate_json((run_dir / "summary.json").read_text())
    assert summary.scenario == "arith+mul"
    assert summary.mixture is not None and set(summary.mixture.values()) == {1.0}
    assert summary.val_by_scenario_before == evals[0]["by_scenario"]
    assert summary.val_by_scenario_after == evals[1]["by_scenario"]
    assert "by scenario: arith" in log
    lines = summary_lines(summary, run_dir)
    assert any(line.split()[:1] == ["mul"] for line in lines)  # one row per scenario
    drawn = load_scenarios(f"arith,{mul}").train_batch(2, 0, 0)
    trained = read_trajectories(run_dir / "trajectories" / "train_0001.jsonl")
    assert sorted(r.scenario_id for r in trained) == sorted(2 * [s.id for s in drawn])
