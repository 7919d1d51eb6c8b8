"""Where scenario records come from: procedural generators, JSONL files and datasets.

A source returns plain dict records (opaque to the rest of the code) already split into
train / val / test. Splits are disjoint and depend only on the source parameters and the seed.
`SOURCES` maps a scenario's `[source] type` to its settings model and its loader.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from art_rlvr.scenarios.sources.arith import ArithSource, arith_records
from art_rlvr.scenarios.sources.base import SPLITS, Records, ScenarioFileError, SplitSizes
from art_rlvr.scenarios.sources.datasets import (
    Gsm8kSource,
    HumanEvalSource,
    MathSource,
    dataset_records,
    gsm8k_records,
    humaneval_default_path,
    humaneval_row,
    last_boxed,
    math_row,
)
from art_rlvr.scenarios.sources.jsonl import JsonlSource, jsonl_records

SourceLoader = Callable[[Any, Path, int], Records]
SOURCES: dict[str, tuple[type[BaseModel], SourceLoader]] = {
    "arith": (ArithSource, lambda s, _base, seed: arith_records(s, seed)),
    "jsonl": (JsonlSource, jsonl_records),
    "gsm8k": (Gsm8kSource, gsm8k_records),
    "math": (MathSource, lambda s, base, seed: dataset_records(s, base, seed, math_row, None)),
    "humaneval": (
        HumanEvalSource,
        lambda s, base, seed: dataset_records(
            s, base, seed, humaneval_row, humaneval_default_path()
        ),
    ),
}

__all__ = ["SOURCES", "SPLITS", "Records", "ScenarioFileError", "SplitSizes", "last_boxed"]
