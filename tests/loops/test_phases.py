"""A run as a list of phases: `phases=` parsing and its errors, each mode as its preset, the
spelling of a preset typed back as `phases=`, the expert-iteration flag, per-phase overrides
shown, and a resume with another list refused. Pure config and state: no model loads here (the
runs themselves are in tests/loops/test_schedule.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from art_rlvr.config.reference import PRESETS
from art_rlvr.config.run_config import ConfigError, parse_args
from art_rlvr.loops.context import RunContext
from art_rlvr.loops.plan import parse_phases, spell
from art_rlvr.loops.runner import resumed_state
from art_rlvr.run import override_line, start_line, summary_lines
from art_rlvr.rundir.events import RunSummary
from art_rlvr.rundir.files import RunFiles, StateFileError
from art_rlvr.scenarios.scenario import load_scenario


@pytest.mark.parametrize(
    ("text", "labels", "counts"),
    [
        ("gepa,rl:8,ei,rl:8", "gepa_r0 rl_r0 ei_r0 rl_r1", [1, 8, 1, 8]),
        ("rl", "rl_r0", [5]),  # a bare rl: rl_steps
        ("ei:3,rl:2,eval", "ei_r0 rl_r0 eval_r1", [3, 2, 1]),
        (" gepa , gepa ,rl:0", "gepa_r0 gepa_r1 rl_r0", [1, 1, 0]),
        ("rl:1,ei:2,ei,rl:1,ei", "rl_r0 ei_r0 ei_r2 rl_r1 ei_r3", [1, 2, 1, 1, 1]),
        ("eval,eval", "eval_r0 eval_r1", [1, 1]),
    ],
)
def test_phases_parse_with_unique_labels(text: str, labels: str, counts: list[int]) -> None:
    phases = parse_phases(text, rl_steps=5)
    assert " ".join(p.label for p in phases) == labels
    assert [p.count for p in phases] == counts
    assert parse_phases(spell(phases), rl_steps=99) == phases  # the spelling reads back


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["phases=rll:3"], "no phase 'rll' (did you mean 'rl'?); one of eval, rl, gepa, ei"),
        (["phases=gepa:3"], "gepa takes no count"),
        (["phases=eval:2"], "eval takes no count"),
        (["phases=rl:x"], "the count of RL steps must be a number"),
        (["phases=ei:-1"], "the count of expert-iteration rounds must be a number"),
        (["phases=rl,,ei"], "an empty entry"),
        (["mode=rl", "phases=rl:4"], "phases= replaces mode=: give one"),
        (["mode=phases"], "mode=phases needs phases="),
        (["phases=rl:4", "group_size=1"], "group_size must be >= 2 for mode=phases"),
        (["scenario=arith,gsm8k", "phases=rl:2,ei"], "a mixture runs with mode=eval or mode=rl"),
        (["phases=ei", "enable_expert_iteration=true"], "use an ei phase in phases="),
        (["mode=gepa", "enable_expert_iteration=true"], "does not apply to mode=gepa"),
        (["mode=eval", "enable_expert_iteration=true"], "does not apply to mode=eval"),
        (
            ["mode=rl", "enable_expert_iteration=true", "n_batches=4"],
            "phases=rl:8,ei,rl:8,ei,rl:8,ei; n_batches is not used",
        ),
    ],
)
def test_bad_phase_lists_are_one_line_errors(words: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_args(words)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("words", "spelt"),
    [
        ([], "rl:24"),
        (["mode=eval"], "eval"),
        (["mode=rl", "n_batches=3"], "rl:3"),
        (["mode=gepa"], "gepa"),
        (["mode=ei", "rounds=2"], "ei:2"),
        (["mode=gepa_rl", "rounds=2", "rl_batches_per_round=4"], "gepa,rl:4,gepa,rl:4"),
        (["mode=gepa_rl", "rounds=2", "skip_first_gepa=true"], "rl:8,gepa,rl:8"),
        (["mode=gepa_rl_ei", "rounds=1"], "gepa,rl:8,ei"),
        (["mode=gepa_rl", "rounds=1", "enable_expert_iteration=true"], "gepa,rl:8,ei"),
        (["mode=rl", "enable_expert_iteration=true", "rounds=2"], "rl:8,ei,rl:8,ei"),
    ],
)
def test_each_mode_is_a_named_list_of_phases(words: list[str], spelt: str) -> None:
    assert spell(parse_args(words).plan) == spelt


@pytest.mark.parametrize("words", PRESETS)
def test_a_presets_spelling_typed_as_phases_runs_the_same_phases(words: list[str]) -> None:
    """What config.json and the start line show for a mode, typed back as `phases=`, gives the
    same phases with the same rounds (which name GEPA's folders and seed its search)."""
    preset = parse_args(words).plan
    assert parse_args([f"phases={spell(preset)}"]).plan == preset


def test_config_json_shows_the_preset_and_the_phase_overrides() -> None:
    cfg = parse_args(["mode=gepa_rl", "rounds=1", "max_tokens=16"])
    dumped = cfg.public_dump()
    assert dumped["mode"] == "gepa_rl" and dumped["phases"] == "gepa,rl:8"
    # GEPA keeps its own group_size (2) unless group_size= is given; max_tokens is handed down
    assert dumped["phase_overrides"] == {"gepa": {"group_size": 2}}
    assert "ei" not in dumped  # the sub-config of a phase the run does not have
    assert override_line(cfg) == "phase overrides: gepa: group_size=2 (run: 6)"
    given = parse_args(["phases=gepa,rl:2,ei", "group_size=4", "gepa.temperature=0.5"])
    assert given.public_dump()["phase_overrides"] == {"gepa": {"temperature": 0.5}}
    assert given.public_dump()["mode"] == "phases" and given.name == "arith-phases-s0"
    assert override_line(parse_args([])) is None


def test_start_line_names_the_phases(tmp_path: Path) -> None:
    cfg = parse_args(["mode=rl", "enable_expert_iteration=true", "rounds=1"])
    line = start_line(cfg, load_scenario("arith", seed=0), RunFiles(tmp_path))
    assert "+ expert iteration | phases=rl:8,ei |" in line


def test_a_resume_with_another_list_of_phases_is_refused(tmp_path: Path) -> None:
    cfg = parse_args(["phases=rl:1,ei", f"run_dir={tmp_path}"])
    files = RunFiles(tmp_path)
    ctx = RunContext(cfg, load_scenario("arith", seed=0), None, None, files, 0.0)  # type: ignore[arg-type]
    state = resumed_state(ctx, cfg.plan)
    assert state.plan == "rl:1,ei" and state.phase == 0
    files.write_state("state.json", state.model_copy(update={"phase": 1}))
    assert resumed_state(ctx, cfg.plan).phase == 1
    other = parse_args(["phases=rl:2,ei"]).plan
    with pytest.raises(StateFileError, match=r"holds a run of phases=rl:1,ei, not phases=rl:2,ei"):
        resumed_state(ctx, other)
    # a schedule's state from before lists were recorded resumes, and records its list
    old = json.loads((tmp_path / "state.json").read_text())
    del old["plan"]
    (tmp_path / "state.json").write_text(json.dumps(old))
    assert resumed_state(ctx, other).plan == "rl:2,ei"


def test_a_lists_state_from_an_older_version_is_read_into_its_sections(tmp_path: Path) -> None:
    """A `ScheduleState` (one flat model for every kind of phase) written by an older art_rlvr
    in the middle of an RL phase resumes as today's `RunState`: the same place, prompt,
    frontier, counts and the step the RL phase began at."""
    cfg = parse_args(["phases=gepa,rl:4,ei", f"run_dir={tmp_path}"])
    files = RunFiles(tmp_path)
    ctx = RunContext(cfg, load_scenario("arith", seed=0), None, None, files, 0.0)  # type: ignore[arg-type]
    change = {"round": 0, "phase": 0, "step": 0, "old": "A", "new": "B", "old_pareto_mean": 0.2,
              "new_pareto_mean": 0.6, "origin": "reflection", "old_val_accuracy": None,
              "new_val_accuracy": 0.5}  # fmt: skip
    old = {"phase": 1, "prompt": "B", "plan": "gepa,rl:4,ei", "evals": {"start": 0.1},
           "curve": [{"after": "start", "step": 0, "val": 0.1}], "frontier": ["Be brief."],
           "prompt_changes": [change], "phase_target": 6, "ei_totals": {"recovered": 2},
           "gepa_metric_calls": 16, "reflection_calls": 2, "rollouts": 12,
           "step_seconds": [3.0], "tokens_trained": 40}  # fmt: skip
    (tmp_path / "state.json").write_text(json.dumps(old))
    state = resumed_state(ctx, cfg.plan)
    assert (state.phase, state.start_step, state.prompt, state.start_prompt) == (1, 2, "B", "A")
    assert state.evals == {"start": 0.1} and [p.after for p in state.curve] == ["start"]
    assert state.gepa.frontier == ["Be brief."] and state.gepa.metric_calls == 16
    assert state.rl.rollouts == 12 and state.rl.tokens_trained == 40 and state.rl.evals == {}
    assert state.ei is not None and state.ei.totals == {"recovered": 2.0}
    files.write_state("state.json", state)  # written back in today's layout, read back equal
    assert resumed_state(ctx, cfg.plan) == state


@pytest.mark.parametrize(
    ("mode", "phases", "shown", "trained"),
    [
        ("phases", ["eval_r0"], None, False),
        ("phases", ["rl_r0", "ei_r0", "eval_r1"], "rl_r0 -> ei_r0 -> eval_r1", True),
        ("rl", ["rl_r0"], None, True),
        ("eval", None, None, False),  # a summary written before phases were recorded
    ],
)
def test_the_end_screen_names_the_phases_and_offers_export_only_after_training(
    tmp_path: Path, mode: str, phases: list[str] | None, shown: str | None, trained: bool
) -> None:
    summary = RunSummary(mode=mode, phases=phases, scenario="arith", seed=0)
    lines = summary_lines(summary, tmp_path)
    assert [line.split(maxsplit=1)[1] for line in lines if line.startswith("phases ")] == (
        [shown] if shown else []
    )
    assert any("art_rlvr.export " in line for line in lines) == trained
