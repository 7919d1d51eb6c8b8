"""What a GEPA run returns (gepa's `core/result`): the best prompt, the frontier, the history,
the cost, and the val comparison, with the flat fields a run's summary.json takes."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel, ConfigDict

from art_rlvr.gepa.data import Candidate, HistoryEvent


class GEPAResult(BaseModel):
    """What a GEPA run found, what it cost, and how it compares on val."""

    model_config = ConfigDict(frozen=True)

    best_prompt: str
    best_index: int
    seed_prompt: str
    frontier: tuple[Candidate, ...]
    candidates: tuple[Candidate, ...]
    history: tuple[HistoryEvent, ...]
    iterations: int
    stop_reason: str
    metric_calls_used: int
    max_metric_calls: int
    reflector: str
    reflection: dict[str, Any]  # `LLMCounters.snapshot()`, as the llm client types it
    counts: dict[str, int]
    seed_val_accuracy: float | None = None
    best_val_accuracy: float | None = None
    val_n: int = 0
    report_rollouts: int = 0
    run_dir: str | None = None

    @property
    def accepted(self) -> tuple[HistoryEvent, ...]:
        return tuple(e for e in self.history if e.accepted)

    def rejected(self) -> dict[str, int]:
        """Refused proposals by kind, in order of first appearance ("other": a history event
        written before kinds were recorded)."""
        return dict(
            Counter(
                e.rejection.value if e.rejection else "other"
                for e in self.history
                if e.kind in ("reflection", "merge") and not e.accepted
            )
        )

    def summary(self) -> dict[str, object]:
        """Flat fields for a run's summary.json."""
        return {
            "best_prompt": self.best_prompt,
            "seed_prompt": self.seed_prompt,
            "val_accuracy_before": self.seed_val_accuracy,
            "val_accuracy_after": self.best_val_accuracy,
            "val_n": self.val_n,
            "metric_calls_used": self.metric_calls_used,
            "max_metric_calls": self.max_metric_calls,
            "iterations": self.iterations,
            "candidates": len(self.candidates),
            "accepted": len(self.accepted),
            "rejected": self.rejected(),
            "frontier_size": len(self.frontier),
            "stop_reason": self.stop_reason,
            "reflector": self.reflector,
            "reflection_calls": self.reflection.get("calls", 0),
            "reflection_errors": self.reflection.get("error_total", 0),
            "reflection_failed_calls": self.reflection.get("failed", 0),
            "perfect_minibatches": self.counts.get("perfect_minibatches", 0),
            "report_rollouts": self.report_rollouts,
        }
