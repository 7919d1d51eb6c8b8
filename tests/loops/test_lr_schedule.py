"""The learning rate over a run's RL steps (`lr_schedule`): the rates and the steps they span."""

import math

import pytest

from art_rlvr.config.run_config import RunConfig
from art_rlvr.loops.rl import scheduled_lr


@pytest.mark.parametrize(
    ("schedule", "rates"),
    [
        ("constant", [1.0, 1.0, 1.0, 1.0]),
        ("linear", [1.0, 0.75, 0.5, 0.25]),  # TRL's linear decay with no warm-up
        (
            "cosine",
            [1.0, 0.5 + 0.5 * math.cos(math.pi / 4), 0.5, 0.5 + 0.5 * math.cos(0.75 * math.pi)],
        ),
    ],
)
def test_each_step_of_four_trains_at_its_scheduled_rate(schedule: str, rates: list[float]) -> None:
    got = [scheduled_lr(2e-4, schedule, done, 4) for done in range(4)]  # type: ignore[arg-type]
    assert got == pytest.approx([2e-4 * r for r in rates], rel=1e-12)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_a_step_past_the_plan_keeps_the_last_steps_positive_rate(schedule: str) -> None:
    last = scheduled_lr(1e-3, schedule, 9, 10)  # type: ignore[arg-type]
    assert last > 0 and scheduled_lr(1e-3, schedule, 12, 10) == last  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("words", "steps"),
    [
        ({"mode": "rl", "n_batches": 24}, 24),
        ({"mode": "gepa_rl", "rounds": 3, "rl_batches_per_round": 8}, 24),
        ({"mode": "rl", "enable_expert_iteration": True, "rounds": 2}, 16),
        ({"phases": "gepa,rl:5,ei,rl:3"}, 8),
        ({"mode": "gepa"}, 0),
    ],
)
def test_the_schedule_spans_the_rl_steps_of_every_rl_phase(words: dict, steps: int) -> None:
    assert RunConfig(scenario="arith", **words).rl_steps == steps


def test_an_unknown_schedule_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"constant.*linear.*cosine"):
        RunConfig(scenario="arith", lr_schedule="step")  # type: ignore[arg-type]
