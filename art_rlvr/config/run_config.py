"""Run configuration: one validated pydantic model, built from `key=value` arguments.

Errors are one line that names the key and the valid choices (the CLI exits 2 on them).
Keys under `source.` patch the scenario's `[source]` table (e.g. `source.max_value=50`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from art_rlvr.backend import DEFAULT_BASE_MODEL, BackendName
from art_rlvr.config.keys import (
    ConfigError,
    coerce_source_value,
    first_error,
    mask_secrets,
)
from art_rlvr.config.rl_config import RLConfig
from art_rlvr.core.chat_template import resolve_chat_template
from art_rlvr.core.text import did_you_mean
from art_rlvr.ei.config import EIConfig
from art_rlvr.eval.policy import PolicyRole
from art_rlvr.gepa.config import GEPAConfig
from art_rlvr.llm.settings import ROLES, LLMRole, refuse_renamed, renamed_to
from art_rlvr.loops.plan import PlanEntry, kinds_of, parse_phases, plan, spell
from art_rlvr.rollouts.sampling import SHARED_KNOBS, GroupSize, MaxTokens, Temperature, TopP
from art_rlvr.scenarios.mixture import MixtureEntry, parse_mixture
from art_rlvr.scenarios.scenario import builtin_scenarios

# where an error sends a reader for the keys (the list itself is too long for one line)
KEYS_POINTER = "every key: python -m art_rlvr.run --help, or docs/cli.md"

# One line per mode, for the log and the report's title. Each mode is a named list of phases
# (`RunConfig.plan`, art_rlvr/loops/plan.py); `phases=` spells any list.
MODE_TITLES = {
    "eval": "evaluation only",
    "rl": "RL-only (fixed prompt)",
    "gepa": "GEPA prompt evolution (weights fixed)",
    "gepa_rl": "GEPA + RL block coordinate ascent",
    "gepa_rl_ei": "GEPA + RL + expert iteration",
    "ei": "expert iteration (best-of-N self-distillation, optional teacher hints)",
    "phases": "a list of phases (phases=...)",
}


class RunConfig(BaseModel):
    """Everything a run needs; logged to `config.json` at start (seeds included, no secrets)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    scenario: str = Field(
        default="arith",
        description="a built-in scenario name or a .toml path; several with optional weights "
        "(arith:2,gsm8k:1) train on a seeded mixture (mode=eval|rl) and are scored apart",
    )
    mode: Literal["eval", "rl", "gepa", "ei", "gepa_rl", "gepa_rl_ei", "phases"] = Field(
        default="rl",
        description="eval, rl, gepa, ei, gepa_rl or gepa_rl_ei (see the mode table): each a "
        "named list of phases; phases= sets the mode to phases",
    )
    phases: str | None = Field(
        default=None,
        description="the run as a list of phases in order, e.g. gepa,rl:8,ei,rl:8: rl:N is N "
        "RL steps (rl: rl_batches_per_round), ei:N N expert-iteration rounds (ei: one), gepa "
        "one GEPA search (max_metric_calls), eval a val evaluation; replaces mode=",
    )
    seed: int = Field(
        default=0, description="seeds the scenario order, sampling, LoRA init and every RNG"
    )
    run_name: str | None = Field(
        default=None, description="the run's folder name; default <scenario>-<mode>-s<seed>"
    )
    run_dir: Path | None = Field(
        default=None, description="where the run lives; default runs/<run_name>"
    )
    resume: bool = Field(
        default=True,
        description="continue a run found in run_dir; false refuses to touch an existing run",
    )
    base_model: str = Field(
        default=DEFAULT_BASE_MODEL,
        description="the embedded model, a local Hugging Face folder, or a reachable hub id",
    )
    backend: BackendName = Field(
        default="torch",
        description="torch, local, serverless or tinker (what is missing is a one-line error)",
    )
    project: str = Field(default="art-rlvr", description="ART's project name for the model")
    system_prompt: str | None = Field(
        default=None, description="the system prompt s; default the scenario's"
    )
    chat_template: str | None = Field(
        default=None,
        description="plain (System:/User:/Assistant: turns, for base models), chatml, a Jinja "
        "string or a template file; replaces the tokenizer's (kept as text in config.json)",
    )
    source_overrides: dict[str, JsonValue] = Field(default_factory=dict)

    # sampling
    max_tokens: MaxTokens = Field(default=32, description="completion tokens per rollout")
    temperature: Temperature = Field(
        default=1.0, description="rollout sampling temperature in training"
    )
    top_p: TopP = Field(default=1.0, description="rollout nucleus sampling in training")
    eval_temperature: Temperature = Field(
        default=0.0,
        description="evaluation sampling temperature (greedy by default)",
    )
    val_limit: int | None = Field(
        default=None, ge=1, description="evaluate on the first N val scenarios; default all"
    )
    eval_test: bool = Field(default=True, description="evaluate on the test split at the end")
    eval_samples: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="mode=eval: samples per item (n of pass@k and pass^k; n > 1 needs "
        "eval_temperature > 0)",
    )
    eval_k: tuple[int, ...] | None = Field(
        default=None,
        description="mode=eval: the k of pass@k and pass^k, e.g. 1,2,4 (each <= eval_samples); "
        "default 1,n",
    )
    # mode=eval or mode=gepa on an external model: policy.model=openai/gpt-4o-mini, or
    # policy.model=openai/x policy.api_base=http://127.0.0.1:8000/v1 policy.api_key_env=MY_KEY
    policy: PolicyRole = Field(default_factory=PolicyRole)

    # rollouts (the RL group; GEPA and EI have their own, handed down when given)
    group_size: GroupSize = Field(
        default=6,
        description="rollouts per scenario (RL group; handed to GEPA and EI when given)",
    )
    lora_rank: int = Field(
        default=16,
        ge=1,
        le=512,
        description="LoRA rank of TorchBackend's adapter (ART's defaults apply elsewhere)",
    )
    max_exceptions: float = Field(
        default=0.1,
        ge=0.0,
        description="tolerated fraction of failed rollout groups per step (ART's semantics)",
    )

    # watching the run: Weave tracing (the rl section has the early stop and the alarm)
    weave_project: str | None = Field(
        default=None,
        description="entity/project (or project): trace the run with W&B Weave; default off",
    )
    weave_offline: bool = Field(
        default=False,
        description="record the Weave traces on disk, with no W&B key or server (needs "
        "weave_project=entity/project); upload later: python -m art_rlvr.observe.upload",
    )

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="DEBUG, INFO, WARNING or ERROR"
    )

    # GEPA + RL block coordinate ascent (mode=gepa_rl; gepa_rl_ei adds expert-iteration rounds)
    rounds: int = Field(
        default=3, ge=0, description="rounds of the GEPA + RL schedule (handed to EI when given)"
    )
    rl_batches_per_round: int = Field(default=8, ge=0, description="RL steps per schedule round")
    skip_first_gepa: bool = Field(default=False, description="start the schedule with RL")
    enable_expert_iteration: bool = Field(
        default=False,
        description="an EI round after each RL phase: gepa_rl -> gepa_rl_ei; rl -> rounds x "
        "(rl:rl_batches_per_round, ei), n_batches unused (refused if given)",
    )

    # RL (an rl phase): its own section, rl.learning_rate=... or learning_rate=... as ever
    rl: RLConfig = Field(default_factory=RLConfig)
    # GEPA (mode=gepa): its own keys on the command line, e.g. max_metric_calls=200
    gepa: GEPAConfig = Field(default_factory=GEPAConfig)
    # expert iteration (mode=ei): its own keys, e.g. hinted_samples_per_x=8 distill=sft
    ei: EIConfig = Field(default_factory=EIConfig)

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: object) -> object:
        refuse_renamed(data, "RunConfig")
        return data

    @model_validator(mode="before")
    @classmethod
    def _rl_section(cls, data: object) -> object:
        """The rl phase's keys given flat (`learning_rate=...`, as ever) go to its section."""
        if not isinstance(data, dict) or not set(data) & set(RLConfig.model_fields):
            return data
        given = data.get("rl")
        section = (
            given.model_dump(exclude_unset=True)
            if isinstance(given, RLConfig)
            else dict(given or {})
        )
        flat = {k: v for k, v in data.items() if k in RLConfig.model_fields}
        rest = {k: v for k, v in data.items() if k not in RLConfig.model_fields}
        return {**rest, "rl": {**section, **flat}}

    @model_validator(mode="before")
    @classmethod
    def _phase_sections(cls, data: object) -> object:
        """A run key that a phase's section also has (seed, group_size, max_tokens,
        temperature, top_p; EI's rounds), given, sets it there too unless the section sets
        its own: one `seed=` seeds every phase, from the command line and from Python alike.
        Resolved once, here; a phase reads only its section."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, model in SUBCONFIGS.items():
            run_keys = {
                k: data[k] for k in model.model_fields if k in data and k in cls.model_fields
            }
            if not run_keys:
                continue
            given = data.get(name)
            section = (
                given.model_dump(exclude_unset=True)
                if isinstance(given, BaseModel)
                else dict(given or {})
            )
            out[name] = {**run_keys, **section}
        return out

    @model_validator(mode="before")
    @classmethod
    def _phases_mode(cls, data: object) -> object:
        """`phases=` is its own mode: a list given with another mode is refused, not merged."""
        if not isinstance(data, dict):
            return data
        mode, phases = data.get("mode"), data.get("phases")
        if phases is not None and mode not in (None, "phases"):
            raise ValueError(
                f"phases= replaces mode=: give one (mode={mode} is the list "
                "shown in its config.json as phases=...)"
            )
        if phases is not None:
            return {**data, "mode": "phases"}
        if mode == "phases":
            raise ValueError("mode=phases needs phases=..., e.g. phases=gepa,rl:8,ei,rl:8")
        return data

    @model_validator(mode="after")
    def _plan(self) -> RunConfig:
        """The list parses, and the expert-iteration flag means one thing per mode."""
        if self.phases is not None:
            try:
                parse_phases(self.phases, rl_steps=self.rl_batches_per_round)
            except ValueError as error:
                raise ValueError(str(error)) from None
        if not self.enable_expert_iteration:
            return self
        if self.mode in ("eval", "gepa", "phases"):
            where = "an ei phase in phases=" if self.mode == "phases" else "mode=rl or gepa_rl"
            raise ValueError(
                f"enable_expert_iteration does not apply to mode={self.mode}; use {where}"
            )
        if self.mode == "rl" and "n_batches" in self.rl.model_fields_set:
            raise ValueError(
                "mode=rl with enable_expert_iteration=true runs rounds x (rl_batches_per_round "
                f"RL steps, one EI round): phases={spell(self.plan)}; n_batches is not used, "
                "drop it (or write the list as phases=)"
            )
        return self

    @model_validator(mode="after")
    def _rl_groups(self) -> RunConfig:
        trains_rl = "rl" in kinds_of(self.plan)
        if trains_rl and self.group_size < 2:
            raise ValueError(
                f"group_size must be >= 2 for mode={self.mode}: a group of one has no advantage"
            )
        return self

    @field_validator("scenario")
    @classmethod
    def _mixture(cls, value: str) -> str:
        parse_mixture(value)
        return value

    @field_validator("chat_template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        return None if value is None else resolve_chat_template(value)

    @field_validator("weave_project")
    @classmethod
    def _project_name(cls, value: str | None) -> str | None:
        if value is not None and (value.count("/") > 1 or not all(value.split("/"))):
            raise ValueError("must be 'entity/project' or 'project'")
        return value

    @field_validator("run_name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        if value is not None and (not value or "/" in value or value.startswith(".")):
            raise ValueError("must be a plain folder name (no '/', not starting with '.')")
        return value

    @field_validator("eval_k", mode="before")
    @classmethod
    def _k_list(cls, value: object) -> object:
        return (
            [p.strip() for p in value.split(",") if p.strip()] if isinstance(value, str) else value
        )

    @model_validator(mode="after")
    def _offline_traces(self) -> RunConfig:
        if self.weave_offline and (self.weave_project or "").count("/") != 1:
            raise ValueError(
                "weave_offline=true needs weave_project=entity/project (the W&B entity the "
                "traces will be uploaded to)"
            )
        return self

    @model_validator(mode="after")
    def _sampled_eval(self) -> RunConfig:
        n = self.eval_samples
        if self.policy.model is not None and self.mode not in ("eval", "gepa"):
            raise ValueError(
                "policy.model is an external model whose weights a run cannot train: it needs "
                f"mode=eval or mode=gepa, not {self.mode}"
            )
        if self.policy.model is not None and self.chat_template is not None:
            raise ValueError("chat_template applies to the run's own model, not to policy.model")
        if len(self.mixture) > 1 and not kinds_of(self.plan) <= {"eval", "rl"}:
            raise ValueError(
                f"scenario={self.scenario}: a mixture runs with mode=eval or mode=rl (eval and "
                "rl phases); GEPA and expert iteration work on one scenario"
            )
        if n > 1 and self.eval_temperature == 0.0:
            raise ValueError(
                f"eval_samples={n} with eval_temperature=0 samples one greedy reply {n} times; "
                "set eval_temperature > 0 (e.g. 0.7)"
            )
        if self.eval_k is not None and not all(1 <= k <= n for k in self.eval_k):
            raise ValueError(f"eval_k={list(self.eval_k)}: every k must be in 1..eval_samples={n}")
        return self

    @property
    def pass_ks(self) -> tuple[int, ...]:
        """The k of pass@k reported: eval_k, or 1 and n."""
        return tuple(sorted(set(self.eval_k or (1, self.eval_samples))))

    @property
    def mixture(self) -> tuple[MixtureEntry, ...]:
        return parse_mixture(self.scenario)

    @property
    def plan(self) -> tuple[PlanEntry, ...]:
        """The run's phases: `phases=` as given, else the mode's preset."""
        if self.phases is not None:
            return parse_phases(self.phases, rl_steps=self.rl_batches_per_round)
        if self.mode in ("eval", "gepa"):
            return (PlanEntry(kind=self.mode),)
        if self.mode == "ei":
            return (PlanEntry(kind="ei", count=self.ei.rounds),)
        if self.mode == "rl" and not self.enable_expert_iteration:
            return (PlanEntry(kind="rl", count=self.rl.n_batches),)
        return plan(
            self.rounds,
            gepa=self.mode != "rl",
            skip_first_gepa=self.skip_first_gepa,
            expert_iteration=self.mode == "gepa_rl_ei" or self.enable_expert_iteration,
            rl_steps=self.rl_batches_per_round,
        )

    @property
    def rl_steps(self) -> int:
        """The RL steps the run's phases train in all (what `lr_schedule` decays over)."""
        return sum(p.count for p in self.plan if p.kind == "rl")

    @property
    def with_expert_iteration(self) -> bool:
        return "ei" in kinds_of(self.plan)

    @property
    def with_gepa(self) -> bool:
        return "gepa" in kinds_of(self.plan)

    def phase_overrides(self) -> dict[str, dict[str, JsonValue]]:
        """The shared knobs (group_size, max_tokens, ...) that a GEPA or EI phase of this run
        runs with a value other than the run's: logged at start and kept in config.json."""
        subs = {"gepa": self.gepa, "ei": self.ei}
        found = {
            kind: {k: getattr(sub, k) for k in SHARED_KNOBS if getattr(sub, k) != getattr(self, k)}
            for kind, sub in subs.items()
            if kind in kinds_of(self.plan)
        }
        return {kind: knobs for kind, knobs in found.items() if knobs}

    @property
    def name(self) -> str:
        scenarios = "+".join(Path(e.name).stem.replace(":", "-") for e in self.mixture)
        return self.run_name or f"{scenarios}-{self.mode}-s{self.seed}"

    @property
    def directory(self) -> Path:
        return self.run_dir or Path("runs") / self.name

    def public_dump(self) -> dict[str, JsonValue]:
        """The config as JSON-able data with anything secret-looking masked: the sub-configs
        of the phases it runs, the rl section's keys flat (as config.json has always had
        them), its phases spelt as `phases=` words (a mode as its preset) and the knobs a
        phase overrides."""
        unused = set(SUBCONFIGS) - kinds_of(self.plan)
        dumped = json.loads(self.model_dump_json(exclude={*unused, "rl"}))
        # the rl section's keys where config.json has always had them (report, compare)
        dumped |= json.loads(self.rl.model_dump_json())
        dumped |= {"phases": spell(self.plan), "phase_overrides": self.phase_overrides()}
        masked = mask_secrets(dumped)
        assert isinstance(masked, dict)
        return masked


# Sub-configs: each has its own keys on the command line (e.g. max_metric_calls=200 goes to
# `gepa`); a key that several sub-configs know goes to each of them. Run keys that a sub-config
# also has (seed, max_tokens, ...) reach it when given (`RunConfig._phase_sections`).
SUBCONFIGS: dict[str, type[BaseModel]] = {"gepa": GEPAConfig, "ei": EIConfig}
_INTERNAL = {"source_overrides", "policy", "rl", *SUBCONFIGS}


def _subconfig_keys() -> dict[str, list[str]]:
    """Command-line key -> the sub-configs that own it (keys of RunConfig excluded)."""
    owners: dict[str, list[str]] = {}
    for name, model in SUBCONFIGS.items():
        for key in model.model_fields:
            if key not in RunConfig.model_fields and key not in ROLES:
                owners.setdefault(key, []).append(name)
    return owners


def _unknown(key: str, fields: Mapping[str, object], owners: dict[str, list[str]]) -> ConfigError:
    """An unknown key: the closest known one and where the list is, not the list itself."""
    roles = [f"{r}.{f}" for r in ROLES for f in LLMRole.model_fields]
    roles += [f"policy.{f}" for f in PolicyRole.model_fields]
    roles += [f"{name}.{f}" for name, model in SUBCONFIGS.items() for f in model.model_fields]
    roles += [*RLConfig.model_fields, *(f"rl.{f}" for f in RLConfig.model_fields)]
    hint = did_you_mean(key, [*fields, *owners, *roles])
    return ConfigError(f"unknown key {key!r}{hint}; {KEYS_POINTER}")


def _bare_word_hint(word: str) -> str:
    """A word without `=` that names a scenario or a mode: the key it was meant for."""
    if word in builtin_scenarios():
        return f" (did you mean scenario={word}?)"
    if word in MODE_TITLES:
        return f" (did you mean mode={word}?)"
    return f"; {KEYS_POINTER}" if word.startswith("-") else ""


def parse_args(argv: list[str]) -> RunConfig:
    """`key=value` words -> RunConfig, or a ConfigError with one clear line. A key only a
    phase has goes to its section (`max_metric_calls=` to `gepa`); run keys that a section
    also has reach it through `RunConfig` itself (`_phase_sections`)."""
    fields = {k: v for k, v in RunConfig.model_fields.items() if k not in _INTERNAL}
    owners = _subconfig_keys()
    values: dict[str, object] = {}
    sub: dict[str, dict[str, object]] = {name: {} for name in SUBCONFIGS}
    source: dict[str, JsonValue] = {}
    policy: dict[str, str | None] = {}
    rl: dict[str, str] = {}  # the rl section: `learning_rate=` or `rl.learning_rate=`
    seen: set[str] = set()
    for word in argv:
        given, sep, raw = word.partition("=")
        given = given.strip()
        if not sep or not given:
            raise ConfigError(f"expected key=value, got {word!r}{_bare_word_hint(word)}")
        if (new := renamed_to(given)) is not None:
            raise ConfigError(f"{given} was renamed {new}: write {new}={raw}")
        key = given
        if key in seen:
            raise ConfigError(f"key {given!r} given twice")
        seen.add(key)
        value = None if raw.lower() in ("none", "null") else raw
        role, dot, field = key.partition(".")
        if role == "source" and dot:
            source[field] = coerce_source_value(raw)
        elif role == "policy" and dot:
            if field not in PolicyRole.model_fields:
                raise _unknown(key, fields, owners)
            policy[field] = value
        elif role in ROLES and dot:
            if field not in LLMRole.model_fields:
                raise _unknown(key, fields, owners)
            keys = sub[ROLES[role]].setdefault(role, {})
            assert isinstance(keys, dict)
            keys[field] = value
        elif (role == "rl" and dot) or key in RLConfig.model_fields:
            name = field if dot else key
            if name not in RLConfig.model_fields:
                raise _unknown(key, fields, owners)
            if name in rl:
                raise ConfigError(f"key {name!r} given twice (as {name}= and rl.{name}=)")
            rl[name] = raw
        elif role in SUBCONFIGS and dot:  # `gepa.group_size=1`: that sub-config only
            if field not in SUBCONFIGS[role].model_fields:
                raise _unknown(key, fields, owners)
            sub[role][field] = value
        elif key in owners:
            for name in owners[key]:
                sub[name][key] = value
        elif key in fields:
            values[key] = value if key in _NULLABLE else raw
        else:
            raise _unknown(key, fields, owners)
    if source:
        values["source_overrides"] = source
    if policy:
        values["policy"] = policy
    try:  # first, so the run's checks across keys see the rl section as given
        values["rl"] = RLConfig.model_validate(rl)
    except ValidationError as error:
        raise first_error(error, rl) from None
    for name, model in SUBCONFIGS.items():  # first, so an error names the section's own key
        if sub[name]:
            try:
                values[name] = model.model_validate(sub[name])
            except ValidationError as error:
                raise first_error(error, sub[name]) from None
    try:
        return RunConfig.model_validate(values)
    except ValidationError as error:
        raise first_error(error, values) from None


_NULLABLE = {
    "run_name", "run_dir", "system_prompt", "val_limit", "eval_k", "chat_template", "phases"
}  # fmt: skip
