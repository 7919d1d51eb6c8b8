"""The CLI reference (docs/cli.md's key tables), generated from the config models' field
descriptions, so every default has one source. `python -m art_rlvr.config_reference` prints it;
tests/test_docs.py checks the page against it."""

from __future__ import annotations

import json

from pydantic import BaseModel

from art_rlvr.config import _INTERNAL, RunConfig
from art_rlvr.config_keys import RUN_RENAMED, SUB_RENAMED
from art_rlvr.ei.config import TEACHER_DEFAULTS, EIConfig
from art_rlvr.gepa.config import GEPAConfig
from art_rlvr.llm_settings import LLMRole
from art_rlvr.policy import PolicyRole


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
        ("GEPA (`mode=gepa`, `gepa_rl`, `gepa_rl_ei`)", _rows(GEPAConfig, same_as_run=True)),
        ("Expert iteration (`mode=ei`, `gepa_rl_ei`)", _rows(EIConfig, same_as_run=True)),
        ("LLM roles: `reflection.<key>` (GEPA) and `teacher.<key>` (expert iteration)",
         _rows(LLMRole)),
        ("The evaluated model: `policy.<key>` (`mode=eval`; the key only from the environment)",
         _rows(PolicyRole)),
    ]  # fmt: skip
    parts = [f"### {title}\n\n" + "\n".join([*header, *rows]) for title, rows in sections]
    notes = (
        "Keys of the run that GEPA and expert iteration also have (`seed`, `group_size`, "
        "`max_tokens`, `temperature`, `top_p`, `rounds`) are handed down when given. "
        f"`teacher.max_tokens` defaults to {TEACHER_DEFAULTS['max_tokens']}. Old names "
        f"({', '.join(sorted({**RUN_RENAMED, **SUB_RENAMED}))}, `reflection_<key>`, "
        "`teacher_<key>`) still work and warn."
    )
    return "\n\n".join([*parts, notes]) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
