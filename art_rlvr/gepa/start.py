"""How a GEPA run starts or restarts: its seed prompt, its data split, the fingerprint a resumed
run must match, and reopening a stopped state. Pure functions, light imports (the CLI loops
may call them before `import art`)."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from art_rlvr.gepa.config import GEPAConfig
from art_rlvr.gepa.data import GEPAState

if TYPE_CHECKING:
    from art_rlvr.scenarios.scenario import Example, Scenario

# fields that shape the search; the budget, iteration cap, report and reflection transport may
# change between a run and its resume
_FINGERPRINT_EXCLUDE = {
    "max_metric_calls",
    "max_iterations",
    "max_consecutive_errors",
    "max_perfect_streak",
    "report_val_limit",
    "report_max_tokens",
}


def choose_seed_prompt(
    *,
    given: str | None = None,
    gepa: str | None = None,
    run: str | None = None,
    scenario_default: str,
) -> str:
    """The one precedence for the prompt GEPA starts from: a prompt passed in by the caller,
    else GEPA's `seed_prompt`, else the run's `system_prompt`, else the scenario's default."""
    return next((p for p in (given, gepa, run) if p is not None), scenario_default)


def start_problem(config: GEPAConfig, scenario: Scenario, seed_prompt: str) -> str | None:
    """Why GEPA cannot start on `scenario` from `seed_prompt` (too few train records for the Pareto
    set, a seed over the prompt limit, a budget that cannot even score the seed), or None. The
    CLI asks before any model loads; the optimizer checks the same limits when it starts."""
    fn = scenario.rollout_fn
    if fn is not None and not fn.takes_context and not seed_prompt:
        return (
            f"rollout function {fn.ref!r} takes (model, record) and there is no seed prompt: "
            "each GEPA candidate replaces the system message its requests send through "
            "model.openai_client(), so GEPA starts from the scenario's system_prompt (or "
            "system_prompt= / gepa.seed_prompt=); set one"
        )
    train = len(scenario.splits["train"])
    if train <= config.pareto_size:
        return (
            f"the train split has {train} scenarios; GEPA needs more than pareto_size="
            f"{config.pareto_size} (the rest feed the reflection minibatches)"
        )
    if len(seed_prompt) > config.max_prompt_chars:
        return f"the seed prompt is over max_prompt_chars={config.max_prompt_chars}"
    need = config.evaluation_cost(config.pareto_size)
    if need > config.max_metric_calls:
        return (
            f"max_metric_calls={config.max_metric_calls} cannot even score the seed prompt on "
            f"the Pareto set ({need} calls: pareto_size x group_size)"
        )
    return None


def split_train(
    train: Sequence[Example], pareto_size: int, seed: int
) -> tuple[list[Example], list[Example]]:
    """A seeded Pareto set (scores candidates) and the disjoint feedback pool (minibatches),
    both from train, so the val split stays an honest held-out report."""
    if len(train) <= pareto_size:
        raise ValueError(
            f"the train split has {len(train)} scenarios; GEPA needs more than pareto_size="
            f"{pareto_size} (the rest feed the reflection minibatches)"
        )
    order = list(range(len(train)))
    random.Random(f"gepa-split:{seed}").shuffle(order)
    return [train[i] for i in order[:pareto_size]], [train[i] for i in order[pareto_size:]]


def fingerprint(
    config: GEPAConfig, scenario: Scenario, seed_prompt: str, pareto: Sequence[str]
) -> str:
    shaping = {
        k: v
        for k, v in config.model_dump(mode="json").items()
        if k not in _FINGERPRINT_EXCLUDE and k != "reflection"
    }
    blob = json.dumps([shaping, scenario.name, seed_prompt, list(pareto)], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def reopen(state: GEPAState, config: GEPAConfig) -> GEPAState:
    """A stopped run, re-run: budget and iteration stops are re-checked against the (maybe
    raised) limits before anything is spent; a reflector that failed is tried again; a run
    that ran out of failures to reflect on stays stopped unless `max_perfect_streak` grew."""
    stop = state.stop_reason or ""
    if stop.startswith("perfect") and state.perfect_streak >= config.max_perfect_streak:
        return state
    return state.model_copy(update={"stop_reason": None, "error_streak": 0})
