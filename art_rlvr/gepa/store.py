"""What a GEPA run keeps on disk: its journal, the evaluation store and meter, and the folder
of decisions (gepa's `GEPAState` persistence, made crash-safe).

Evaluations and reflection replies are paid work, so they go into `journal.jsonl` as they
happen, through the one write-ahead journal of paid evaluations (`rundir.journal`, the eval
journal's too); the decisions (`state.json`, `prompt_history.jsonl`, `frontier.json`) are a
snapshot replaced atomically at iteration boundaries; `result.json` is written once at the end.
A killed run replays its unfinished iteration from the journal without paying twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from art_rlvr.core.text import prompt_hash
from art_rlvr.gepa.data import ExampleEval, GEPAState
from art_rlvr.gepa.pareto import frontier_indices
from art_rlvr.rundir.files import RunFiles, StateFileError
from art_rlvr.rundir.journal import Journal

if TYPE_CHECKING:
    from art_rlvr.gepa.result import GEPAResult
    from art_rlvr.scenarios.scenario import Example


class BudgetExceeded(RuntimeError):
    """An evaluation would take the run past max_metric_calls; it was not started."""


def journaled_eval(record: dict[str, object]) -> ExampleEval | None:
    """An `eval` record's evaluation (None: another type of record, a reflection reply); one
    of the wrong shape is refused at its line."""
    return ExampleEval.model_validate(record.get("eval")) if record.get("type") == "eval" else None


class EvalStore:
    """(prompt, example) -> ExampleEval, the metric-call meter, and their journal."""

    def __init__(self, max_metric_calls: int, journal: Journal) -> None:
        self.max_metric_calls = max_metric_calls
        self.journal = journal
        self._cache: dict[tuple[str, str], ExampleEval] = {}
        for ev in journal.read(journaled_eval):
            if ev is not None:
                self._cache[(ev.prompt_hash, ev.scenario_id)] = ev
        self.spent = sum(len(ev.rollouts) for ev in self._cache.values())

    @property
    def remaining(self) -> int:
        return self.max_metric_calls - self.spent

    def get(self, prompt: str, scenario_id: str) -> ExampleEval | None:
        return self._cache.get((prompt_hash(prompt), scenario_id))

    def missing(self, prompt: str, examples: Sequence[Example]) -> list[Example]:
        """Scenarios (deduplicated, in order) this prompt has no result for yet."""
        todo = {e.id: e for e in examples if self.get(prompt, e.id) is None}
        return list(todo.values())

    def reserve(self, calls: int) -> None:
        if self.spent + calls > self.max_metric_calls:
            raise BudgetExceeded(
                f"{calls} metric calls requested, {self.remaining} of {self.max_metric_calls} left"
            )

    def put(self, ev: ExampleEval) -> None:
        key = (ev.prompt_hash, ev.scenario_id)
        if key in self._cache:
            return
        self.journal.append({"type": "eval", "eval": ev.model_dump(mode="json")})
        self._cache[key] = ev
        self.spent += len(ev.rollouts)


def write_jsonl_atomic(path: Path, rows: Sequence[Mapping[str, object]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as handle:
        handle.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


class GEPAFiles:
    """The GEPA folder: state.json (decisions), journal.jsonl (write-ahead: evaluations and
    replies), prompt_history.jsonl, frontier.json and result.json. With no folder, nothing is
    written and nothing can be resumed."""

    def __init__(self, root: Path | None) -> None:
        self.files = RunFiles(root) if root is not None else None
        self.journal = Journal(root / "journal.jsonl" if root is not None else None)

    @property
    def root(self) -> Path | None:
        return self.files.root if self.files else None

    def load_state(self) -> GEPAState | None:
        if self.files is None:
            return None
        data = self.files.read_json("state.json")
        if data is None:
            return None
        try:
            return GEPAState.model_validate(data)
        except ValidationError:
            raise StateFileError(
                f"{self.files.root / 'state.json'} is not a GEPA state (another mode's run?); "
                "use a new run_dir"
            ) from None

    def save(self, state: GEPAState) -> None:
        if self.files is None:
            return
        self.files.write_json("state.json", state.model_dump(mode="json"))
        write_jsonl_atomic(
            self.files.root / "prompt_history.jsonl",
            [e.model_dump(mode="json") for e in state.history],
        )
        self.files.write_json(
            "frontier.json",
            [state.candidates[i].model_dump(mode="json") for i in frontier_indices(state)],
        )

    def write_result(self, result: GEPAResult) -> None:
        if self.files is not None:
            self.files.write_json("result.json", result.model_dump(mode="json"))
