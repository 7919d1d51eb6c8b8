"""`python -m art_rlvr.compare`: the ablation table over run folders, as a user calls it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from art_rlvr.compare import ablation, cell, order


def fake_run(root: Path, name: str, config: dict, summary: dict) -> Path:
    """A finished run folder as art_rlvr.run leaves it (config.json and summary.json)."""
    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"scenario": "arith", **config}))
    identity = {
        "scenario": "arith",
        "mode": config.get("mode", "rl"),
        "seed": config.get("seed", 0),
    }
    (path / "summary.json").write_text(json.dumps({**identity, **summary}))
    return path


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"mode": "rl"}, "RL-only (fixed prompt)"),
        ({"mode": "rl", "enable_expert_iteration": True}, "RL+EI"),
        ({"mode": "gepa_rl"}, "GEPA+RL"),
        ({"mode": "gepa_rl_ei"}, "GEPA+RL+EI"),
        ({"mode": "gepa_rl", "enable_expert_iteration": True}, "GEPA+RL+EI"),
        ({"mode": "ei", "ei": {"enable_teacher_hints": False}}, "EI (no hints)"),
        ({"mode": "ei", "ei": {"enable_teacher_hints": True}}, "EI + teacher hints"),
        ({"mode": "gepa"}, "GEPA (prompt only)"),
        ({"mode": "eval"}, "baseline (eval)"),
        ({"mode": "eval", "policy": {"model": None}}, "baseline (eval)"),
        (
            {"mode": "eval", "policy": {"model": "openai/gpt-4o-mini"}},
            "external: openai/gpt-4o-mini",
        ),
    ],
)
def test_ablation_labels(config: dict, expected: str) -> None:
    assert ablation(config) == expected


@pytest.mark.parametrize(
    ("values", "expected"),
    [([0.5], "0.500"), ([0.4, 0.6], "0.500 ± 0.141"), ([None, 0.3], "0.300"), ([None], "-")],
)
def test_cell_mean_and_std(values: list, expected: str) -> None:
    assert cell(values, "{:.3f}") == expected


def test_compare_prints_one_row_per_ablation_with_mean_and_std(tmp_path: Path) -> None:
    runs = [
        fake_run(
            tmp_path,
            "rl-s0",
            {"mode": "rl", "seed": 0},
            {
                "seed": 0,
                "val_accuracy_before": 0.4,
                "val_accuracy_after": 0.6,
                "rollouts": 100,
                "wall_seconds": 60,
            },
        ),
        fake_run(
            tmp_path,
            "rl-s1",
            {"mode": "rl", "seed": 1},
            {
                "seed": 1,
                "val_accuracy_before": 0.4,
                "val_accuracy_after": 0.7,
                "rollouts": 100,
                "wall_seconds": 120,
            },
        ),
        fake_run(
            tmp_path,
            "gr-s0",
            {"mode": "gepa_rl", "seed": 0},
            {
                "seed": 0,
                "val_accuracy_before": 0.4,
                "val_accuracy_after": 0.8,
                "reflection_calls": 5,
                "wall_seconds": 300,
            },
        ),
        fake_run(
            tmp_path,
            "ei-s0",
            {"mode": "ei", "seed": 0, "ei": {"enable_teacher_hints": True}},
            {"seed": 0, "val_accuracy_after": 0.5, "teacher_calls": 7},
        ),
    ]
    unfinished = tmp_path / "killed"
    unfinished.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "art_rlvr.compare", *map(str, runs), str(unfinished)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("| scenario | ablation | seeds | val before | val after")
    rows = {line.split(" | ")[1]: line for line in lines[2:]}
    assert list(rows) == ["RL-only (fixed prompt)", "GEPA+RL", "EI + teacher hints"]
    assert "| 0,1 | 0.400 ± 0.000 | 0.650 ± 0.071 |" in rows["RL-only (fixed prompt)"]
    assert "| 1.5 ± 0.7 |" in rows["RL-only (fixed prompt)"]
    assert "| 5 |" in rows["GEPA+RL"] and "| 7 |" in rows["EI + teacher hints"]
    assert f"skipped {unfinished}" in done.stderr


def test_compare_without_finished_runs_is_an_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "art_rlvr.compare", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "not a run folder" in done.stderr


def test_external_models_sit_after_the_baseline_and_before_training() -> None:
    names = ["GEPA+RL", "external: z", "RL-only (fixed prompt)", "baseline (eval)", "external: a"]
    assert sorted(names, key=order) == [
        "baseline (eval)",
        "external: a",
        "external: z",
        "RL-only (fixed prompt)",
        "GEPA+RL",
    ]


def test_pass_at_k_columns_only_for_the_k_runs_report(tmp_path: Path) -> None:
    runs = [
        fake_run(tmp_path, "rl", {"mode": "rl"}, {"val_accuracy_after": 0.5}),
        fake_run(
            tmp_path,
            "ext",
            {"mode": "eval", "policy": {"model": "openai/gpt-4o-mini"}},
            {"val_accuracy_after": 0.25, "pass_at_k": {"1": 0.25, "8": 0.75}, "cost_usd": 0.0042},
        ),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "art_rlvr.compare", *map(str, runs)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    header, _, external, rl = done.stdout.strip().splitlines()
    assert "| test after | pass@1 | pass@8 | rollouts |" in header
    assert external.startswith("| arith | external: openai/gpt-4o-mini | 0 |")
    assert "| 0.250 | 0.750 |" in external and "| 0.0042 |" in external
    assert rl.startswith("| arith | RL-only (fixed prompt) | 0 |") and "| - | - |" in rl
