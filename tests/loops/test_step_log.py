"""The RL step's log line shows a loss only where the backend reported one."""

import pytest

from art_rlvr.loops.rl import shown_loss


@pytest.mark.parametrize(
    ("metrics", "shown"),
    [
        ({"loss": 0.12345}, "0.1235"),
        ({"loss": 0.0}, "0.0000"),
        ({"skyrl.ai/grad_norm": 0.02}, "n/a"),  # Tinker's native backend: no loss
        ({}, "n/a"),
    ],
)
def test_a_missing_loss_reads_as_missing(metrics: dict[str, float], shown: str) -> None:
    assert shown_loss(metrics) == shown
