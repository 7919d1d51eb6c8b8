"""Candidate selection on the Pareto set (gepa's `strategies/candidate_selector` and
`gepa_utils`): which candidates are on the frontier, which parent to mutate next, and which
candidate leaves a full pool. gepa's own functions decide dominance and the weighted draw."""

from __future__ import annotations

import random

from gepa.gepa_utils import find_dominator_programs, select_program_candidate_from_pareto_front

from art_rlvr.gepa.data import GEPAState


def front_mapping(state: GEPAState) -> dict[str, set[int]]:
    """Pareto-set scenario -> the pool candidates with the best score on it."""
    pool = sorted(state.pool)
    ids = sorted(state.candidates[pool[0]].pareto_scores)
    mapping: dict[str, set[int]] = {}
    for sid in ids:
        best = max(state.candidates[i].pareto_scores[sid] for i in pool)
        mapping[sid] = {i for i in pool if state.candidates[i].pareto_scores[sid] == best}
    return mapping


def pool_means(state: GEPAState) -> dict[int, float]:
    return {i: state.candidates[i].mean for i in sorted(state.pool)}


def frontier_indices(state: GEPAState) -> list[int]:
    """Pool candidates that no other candidate dominates on the Pareto set (gepa's rule)."""
    return sorted(find_dominator_programs(front_mapping(state), pool_means(state)))


def select_parent(state: GEPAState, rng: random.Random) -> int:
    """gepa's Pareto sampling: a frontier candidate, weighted by how many scenarios it leads."""
    # gepa 0.1.4 annotates the scores list[float] but only reads scores[candidate]: a dict,
    # as our pool is sparse once candidates are evicted
    means = pool_means(state)
    return select_program_candidate_from_pareto_front(front_mapping(state), means, rng)  # type: ignore[arg-type]


def eviction(state: GEPAState, pool_size: int) -> int | None:
    """Over the cap, drop the weakest dominated candidate (else the weakest but the best)."""
    if len(state.pool) <= pool_size:
        return None
    front = set(frontier_indices(state))
    best = max(state.pool, key=lambda i: (state.candidates[i].mean, -i))
    victims = [i for i in state.pool if i not in front and i != best] or [
        i for i in state.pool if i != best
    ]
    return min(victims, key=lambda i: (state.candidates[i].mean, i))
