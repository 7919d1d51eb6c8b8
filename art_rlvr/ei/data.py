"""Plain data of an expert-iteration run: what a round distils, what it measured, and the
resumable state. Everything here is JSON (pydantic), because the round buffer is written to
the run folder atomically *before* training, so a run killed mid-distillation resumes from the
buffer instead of sampling (and asking the teacher) again."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator


class Episode(BaseModel):
    """The turns of an episode after its opening, as JSON that round-trips through the buffer:
    a sampled turn is its `Choice` dumped (`model_dump(mode="json")`), every other turn (a
    tool result, the environment's reply) its message dict; `sampled` says which is which."""

    model_config = ConfigDict(frozen=True)

    turns: tuple[dict[str, Any], ...]
    sampled: tuple[bool, ...]
    tools: tuple[dict[str, Any], ...] | None = None  # the episode's tool schemas, if any

    @model_validator(mode="after")
    def _aligned(self) -> Episode:
        if len(self.turns) != len(self.sampled):
            raise ValueError(f"{len(self.turns)} turns but {len(self.sampled)} sampled flags")
        return self

    @classmethod
    def reply(cls, text: str) -> Episode:
        """One sampled reply known only by its text (a record written before episodes were
        kept): a choice with no token ids or logprobs, which the trainer re-renders."""
        choice = {"index": 0, "finish_reason": "stop", "logprobs": None}
        message = {"role": "assistant", "content": text}
        return cls(turns=({**choice, "message": message},), sampled=(True,))


class DistillExample(BaseModel):
    """One training example: the clean prompt (exactly what a clean rollout sends) and a
    verified episode after it (`completion` is its last sampled turn's text). Hints never live
    here; `source` only says where the episode came from."""

    model_config = ConfigDict(frozen=True)

    scenario_id: str
    messages: tuple[dict[str, Any], ...]
    completion: str
    reward: float
    source: Literal["clean", "hinted"]
    completion_tokens: int = 0
    hint_reliance: float | None = None  # nats: log p(y | hinted) - log p(y | clean)
    episode: Episode  # left out (older buffers): the completion as the one turn

    @model_validator(mode="before")
    @classmethod
    def _with_episode(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("episode") is None:
            return {**data, "episode": Episode.reply(str(data.get("completion", "")))}
        return data


class RLGroup(BaseModel):
    """A group for `distill=rl`: episodes under one clean prompt with their rewards."""

    model_config = ConfigDict(frozen=True)

    scenario_id: str
    messages: tuple[dict[str, Any], ...]
    completions: tuple[str, ...]  # each episode's last sampled text (for reading the buffer)
    rewards: tuple[float, ...]
    relabelled: tuple[bool, ...]  # True where the episode came from a hinted rollout
    episodes: tuple[Episode, ...]  # left out (older buffers): one reply per completion

    @model_validator(mode="before")
    @classmethod
    def _with_episodes(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("episodes"):
            replies = tuple(Episode.reply(str(c)) for c in data.get("completions", ()))
            return {**data, "episodes": replies}
        return data

    @model_validator(mode="after")
    def _aligned(self) -> RLGroup:
        sizes = {len(self.completions), len(self.rewards), len(self.relabelled)}
        if sizes != {len(self.episodes)}:
            raise ValueError("completions, rewards, relabelled and episodes differ in length")
        return self


class HintAttempt(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str
    verdict: Literal["accepted", "leak", "empty", "error"]
    detail: str = ""


class HintRecord(BaseModel):
    """What the teacher was asked for one unsolved scenario, and what came of it."""

    model_config = ConfigDict(frozen=True)

    scenario_id: str
    attempts: tuple[HintAttempt, ...] = ()
    hint: str | None = None
    dropped: Literal["leak", "teacher_error", "empty"] | None = None
    truncated: bool = False
    hinted_attempts: int = 0
    hinted_correct: int = 0


class RoundStats(BaseModel):
    """The per-round numbers that say whether expert iteration is working."""

    model_config = ConfigDict(frozen=True)

    round: int
    scenarios: int = 0
    clean_attempts: int = 0
    clean_accuracy: float = 0.0  # fraction of clean attempts that are correct
    clean_solved: int = 0
    clean_solve_rate: float = 0.0  # fraction of scenarios with at least one correct attempt
    rollout_errors: int = 0
    hints_requested: int = 0
    hints_generated: int = 0  # accepted hints
    hints_leak_rejected: int = 0  # teacher replies refused by the leak check
    hints_truncated: int = 0
    hints_dropped: int = 0  # scenarios given up this round (leaks or empty replies)
    teacher_errors: int = 0  # scenarios whose teacher call failed after retries
    hinted_attempts: int = 0
    hinted_accuracy: float | None = None
    hinted_solve_rate: float | None = None  # over scenarios that got a hint
    hinted_echo_rejected: int = 0  # correct hinted completions that quote the hint: not kept
    hinted_unrelabelled: int = 0  # a rollout function's hinted episodes it did not hint as told
    recovered: int = 0  # unsolved clean, solved with the hint (by a completion that was kept)
    examples_distilled: int = 0
    examples_from_hints: int = 0
    hint_reliance_mean: float | None = None  # nats per completion
    hint_reliance_per_token: float | None = None
    rl_groups: int = 0
    seconds_sampling: float = 0.0
    seconds_teacher: float = 0.0


class RoundBuffer(BaseModel):
    """Everything a round decided before training: the EI buffer that is checkpointed."""

    model_config = ConfigDict(frozen=True)

    round: int
    scenario_ids: tuple[str, ...]
    examples: tuple[DistillExample, ...]
    rl_groups: tuple[RLGroup, ...] = ()
    hints: tuple[HintRecord, ...] = ()
    stats: RoundStats


class EIState(BaseModel):
    """The ei phase's state: `state.json` of `mode=ei` (in a longer list, the list state's
    `ei` section): the rounds done (within the phase), evaluations by round (alone), the
    pending buffer, and the totals and teacher counters every EI phase of the run adds to.

    `pending` is set (with the model step it was taken at) before a round trains and cleared
    after; on resume, a pending buffer with the model already past `pending_step` means the
    training finished and only the bookkeeping was lost."""

    model_config = ConfigDict(frozen=True)

    fingerprint: str  # "" in a list converted from an older art_rlvr: set by its next round
    rounds_done: int = 0
    evals: dict[str, float] = Field(default_factory=dict)  # round -> val accuracy
    eval_steps: dict[str, int] = Field(default_factory=dict)  # round -> model step
    pending: RoundBuffer | None = None
    pending_step: int | None = None
    totals: dict[str, float] = Field(default_factory=dict)
    teacher_counters: dict[str, JsonValue] | None = None  # llm.LLMCounters.snapshot()
