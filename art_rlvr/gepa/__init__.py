"""GEPA prompt evolution over ART trajectory groups, with reflection through litellm.

`result = await optimize_prompt(model, scenario, config=GEPAConfig(...))` in a notebook;
`run_gepa(ctx, config)` (art_rlvr.loops.gepa) from the CLI run loop.

Names resolve lazily: RunConfig imports `GEPAConfig`, and the CLI must be able to reject a bad
key before `import art` (~20 s) happens.
"""

from art_rlvr.core.lazy import lazy_exports

_EXPORTS = {
    "ARTPromptAdapter": "art_rlvr.gepa.adapter",
    "BudgetExceeded": "art_rlvr.gepa.store",
    "EvalStore": "art_rlvr.gepa.store",
    "GEPAConfig": "art_rlvr.gepa.config",
    "GEPAResult": "art_rlvr.gepa.result",
    "optimize_prompt": "art_rlvr.gepa.optimizer",
    "run_optimizer": "art_rlvr.gepa.optimizer",
    "Candidate": "art_rlvr.gepa.data",
    "GEPAState": "art_rlvr.gepa.data",
    "HistoryEvent": "art_rlvr.gepa.data",
    "Rejection": "art_rlvr.gepa.data",
    "RejectionKind": "art_rlvr.gepa.data",
    "ExampleEval": "art_rlvr.gepa.data",
    "choose_seed_prompt": "art_rlvr.gepa.start",
}

__all__, __getattr__, __dir__ = lazy_exports("art_rlvr.gepa", _EXPORTS)
