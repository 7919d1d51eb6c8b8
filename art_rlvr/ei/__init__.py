"""Expert iteration with non-leaking teacher hints, relabelled to the clean prompt.

`run_ei(ctx, config)` (art_rlvr.loops.ei) from the CLI; the parts (hint generation with its
leak check, relabelling, the round) are importable on their own.

Lazy names, for the reason art_rlvr.gepa gives: `EIConfig` is read by RunConfig before
`import art`.
"""

from art_rlvr.core.lazy import lazy_exports

_EXPORTS = {
    "EIConfig": "art_rlvr.ei.config",
    "HintOutcome": "art_rlvr.ei.hints",
    "hint_messages": "art_rlvr.ei.hints",
    "hinted_prompt": "art_rlvr.ei.hints",
    "obtain_hint": "art_rlvr.ei.hints",
    "make_teacher": "art_rlvr.ei.hints",
    "relabel": "art_rlvr.ei.relabel",
    "relabel_episode": "art_rlvr.ei.relabel",
    "hint_leaks": "art_rlvr.ei.relabel",
    "relabel_for_rl": "art_rlvr.ei.relabel",
    "best_attempts": "art_rlvr.ei.relabel",
    "DistillExample": "art_rlvr.ei.data",
    "Episode": "art_rlvr.ei.data",
    "RoundBuffer": "art_rlvr.ei.data",
    "RoundStats": "art_rlvr.ei.data",
    "EIState": "art_rlvr.ei.data",
    "collect_round": "art_rlvr.ei.expert",
    "distill_round": "art_rlvr.ei.expert",
    "write_round_records": "art_rlvr.ei.files",
}

__all__, __getattr__, __dir__ = lazy_exports("art_rlvr.ei", _EXPORTS)
