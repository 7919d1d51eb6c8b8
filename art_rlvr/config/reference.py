"""The CLI reference (docs/cli.md's key tables), generated from the config models' field
descriptions, so every default has one source. `python -m art_rlvr.config.reference` prints it;
tests/test_docs.py checks the page against it."""

from __future__ import annotations

import json
import textwrap

from pydantic import BaseModel

from art_rlvr.config.rl_config import RLConfig
from art_rlvr.config.run_config import _INTERNAL, MODE_TITLES, RunConfig, parse_args
from art_rlvr.ei.config import TEACHER_DEFAULTS, EIConfig
from art_rlvr.eval.policy import PolicyRole
from art_rlvr.gepa.config import GEPAConfig
from art_rlvr.llm.settings import RENAMED, LLMRole
from art_rlvr.loops.plan import spell


def _default_text(model: type[BaseModel], name: str) -> str:
    value = model.model_fields[name].get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return ""
    if value is None:
        return "none"
    return f"`{json.dumps(value) if isinstance(value, bool) else value}`"


def _rows(model: type[BaseModel], same_as_run: bool = False) -> list[str]:
    """One row per key; with `same_as_run`, a key the run has with the same default is left
    to the run's table (it is handed down)."""

    def shown(name: str) -> bool:
        if name in _INTERNAL or model.model_fields[name].annotation is LLMRole:
            return False
        inherited = name in RunConfig.model_fields and _default_text(model, name) == _default_text(
            RunConfig, name
        )
        return not (same_as_run and inherited)

    return [
        f"| `{name}` | {_default_text(model, name)} | {_cell(field.description)} |"
        for name, field in model.model_fields.items()
        if shown(name)
    ]


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "/")


def reference_markdown() -> str:
    """The key tables of docs/cli.md, from the models' field descriptions: one source for
    every default (tests/test_docs.py checks the page against it)."""
    header = ["| key | default | meaning |", "|---|---|---|"]
    sections = [
        ("The run", _rows(RunConfig)),
        ("RL (an `rl` phase: `mode=rl` and every list with `rl`; `learning_rate=` or "
         "`rl.learning_rate=`)", _rows(RLConfig)),
        ("GEPA (a `gepa` phase: `mode=gepa`, `gepa_rl`, `gepa_rl_ei`)",
         _rows(GEPAConfig, same_as_run=True)),
        ("Expert iteration (an `ei` phase: `mode=ei`, `gepa_rl_ei`)",
         _rows(EIConfig, same_as_run=True)),
        ("LLM roles: `reflection.<key>` (GEPA) and `teacher.<key>` (expert iteration)",
         _rows(LLMRole)),
        ("The evaluated model: `policy.<key>` (`mode=eval`; the key only from the environment)",
         _rows(PolicyRole)),
    ]  # fmt: skip
    parts = [f"### {title}\n\n" + "\n".join([*header, *rows]) for title, rows in sections]
    parts.append(f"### Modes as lists of phases\n\n{preset_table()}")
    notes = (
        "Keys of the run that GEPA and expert iteration also have (`seed`, `group_size`, "
        "`max_tokens`, `temperature`, `top_p`, `rounds`) are handed down when given (from the "
        "command line and from `RunConfig(...)` alike); where a phase keeps its own default "
        "(GEPA's `group_size`), the run's start line and config.json's `phase_overrides` show "
        "it. "
        f"`teacher.max_tokens` defaults to {TEACHER_DEFAULTS['max_tokens']}. Keys renamed in "
        f"0.1 ({', '.join(sorted(RENAMED))}, `reflection_<key>`, `teacher_<key>`) are refused "
        "with their new name."
    )
    return "\n\n".join([*parts, notes]) + "\n"


# each mode's words, as `preset_table` shows them (with the default keys)
PRESETS = (["mode=eval"], ["mode=rl"], ["mode=rl", "enable_expert_iteration=true"],
           ["mode=gepa"], ["mode=ei"], ["mode=gepa_rl"], ["mode=gepa_rl", "skip_first_gepa=true"],
           ["mode=gepa_rl_ei"])  # fmt: skip


def preset_table() -> str:
    """Each mode as the `phases=` list it runs with the default keys (`RunConfig.plan`)."""
    rows = [f"| `{' '.join(words)}` | `{spell(parse_args(words).plan)}` |" for words in PRESETS]
    return "\n".join(["| mode | phases (default keys) |", "|---|---|", *rows])


# `python -m art_rlvr.run --help`: the keys a newcomer sets first, then each mode's own
MAIN_KEYS = ("scenario", "mode", "phases", "seed", "run_dir", "max_tokens", "val_limit",
             "eval_test", "base_model", "backend", "weave_project")  # fmt: skip
RL_KEYS = ("n_batches", "groups_per_batch", "group_size", "learning_rate", "temperature",
           "loss_fn", "lr_schedule", "lora_rank", "eval_every", "patience")  # fmt: skip
MODE_KEYS: dict[str, tuple[str, ...]] = {
    "eval": ("eval_temperature", "val_limit", "eval_samples", "eval_k", "policy.model",
             "policy.api_base", "policy.api_key_env"),
    "rl": (*RL_KEYS, "enable_expert_iteration"),
    "gepa": ("gepa.*", "reflection.*"),
    "ei": ("ei.*", "teacher.*"),
    "gepa_rl": ("rounds", "rl_batches_per_round", "skip_first_gepa", *RL_KEYS[1:5],
                "max_metric_calls", "reflection.model"),
    "gepa_rl_ei": ("rounds", "rl_batches_per_round", "skip_first_gepa", *RL_KEYS[1:5],
                   "max_metric_calls", "reflection.model", "scenarios_per_round", "distill",
                   "enable_teacher_hints", "teacher.model"),
    "phases": ("phases", "rl_batches_per_round", *RL_KEYS[1:5], "max_metric_calls",
               "reflection.model", "scenarios_per_round", "distill", "enable_teacher_hints",
               "teacher.model", "eval_samples"),
}  # fmt: skip
HELP_FOOTER = (
    "Every key, its default and meaning: docs/cli.md (or python -m art_rlvr.config.reference).\n"
    "A bad key or value stops the run at once with one line naming it (exit 2)."
)


def _key_line(key: str, default: str, meaning: str | None) -> str:
    """`  key=default   meaning`, wrapped under the meaning's column (a long key=default puts
    the meaning on the next line)."""
    head = f"  {key}={default.strip('`') or '...'}"
    indent = " " * 35
    wrap = textwrap.TextWrapper(width=100, subsequent_indent=indent, break_on_hyphens=False)
    if len(head) < 34:
        return wrap.fill(f"{head:<34} {meaning or ''}")
    wrap.initial_indent = indent
    return f"{head}\n{wrap.fill(meaning or '')}"


def _help_keys(keys: tuple[str, ...]) -> list[str]:
    """One line per key (`rl.*` / `gepa.*` / `ei.*` / `reflection.*` / `teacher.*`: every key
    of that section or LLM role); a key is looked up in the run, then RL, GEPA, EI, roles."""
    owners: list[tuple[str, type[BaseModel]]] = [
        ("", RunConfig), ("", RLConfig), ("", GEPAConfig), ("", EIConfig),
        ("policy.", PolicyRole), ("reflection.", LLMRole), ("teacher.", LLMRole),
        ("rl.", RLConfig),
    ]  # fmt: skip
    lines = []
    for key in keys:
        if key.endswith(".*"):
            prefix = key[:-1]
            sections: dict[str, type[BaseModel]] = {
                "rl.": RLConfig, "gepa.": GEPAConfig, "ei.": EIConfig
            }  # fmt: skip
            model = sections.get(prefix, LLMRole)
            shown = "" if model in (RLConfig, GEPAConfig, EIConfig) else prefix
            same = model in (GEPAConfig, EIConfig)
            names = [r.split("`")[1] for r in _rows(model, same_as_run=same)]
            lines += [
                _key_line(shown + n, _default_text(model, n), model.model_fields[n].description)
                for n in names
            ]
            continue
        for prefix, model in owners:
            name = key.removeprefix(prefix)
            if (not prefix or key.startswith(prefix)) and name in model.model_fields:
                field = model.model_fields[name]
                lines.append(_key_line(key, _default_text(model, name), field.description))
                break
    return lines


def help_text(mode: str | None = None) -> str:
    """`python -m art_rlvr.run --help` (every mode, the main keys) or, with a mode, that
    mode's own keys; the full reference stays docs/cli.md."""
    usage = "usage: python -m art_rlvr.run key=value ...   (in a clone: uv run python -m ...)"
    if mode is not None:
        head = f"mode={mode}: {MODE_TITLES[mode]}\n\nits keys (key=default):"
        lines = _help_keys(MODE_KEYS[mode])
        return "\n".join([usage, "", head, *lines, "", HELP_FOOTER]) + "\n"
    modes = [
        f"  {name + (' (default)' if name == 'rl' else ''):<14} {title}"
        for name, title in MODE_TITLES.items()
    ]
    example = "e.g. python -m art_rlvr.run scenario=arith mode=eval val_limit=20"
    return "\n".join([
        usage, example, "", "modes (mode=...; python -m art_rlvr.run mode=gepa --help shows "
        "one mode's keys):", *modes, "", "main keys (key=default):", *_help_keys(MAIN_KEYS),
        "", HELP_FOOTER,
    ]) + "\n"  # fmt: skip


if __name__ == "__main__":
    print(reference_markdown(), end="")
