"""The engine's request and result types, shared by the engine, its batch and the server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """Per-request sampling settings, validated at the HTTP edge."""

    model_config = ConfigDict(frozen=True)

    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # vLLM's option: keep sampling past end-of-sequence (benchmarks)
    grammar: str | None = None  # an xgrammar structural tag (JSON text): constrained decoding
    top_logprobs: int = Field(default=0, ge=0, le=20)  # the most likely tokens at each step


@dataclass
class Completion:
    """One generated sequence: exact tokens, their logprobs, and the visible text."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" | "length"
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token, when asked for


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token of choice `index`, reported as soon as it is sampled (streaming)."""

    index: int
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class EngineStats:
    batches: int = 0
    prefills: int = 0  # prefill passes (one per group of requests admitted together)
    sequences: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    max_batch_rows: int = 0
    prefix_tokens_saved: int = 0  # prompt tokens not recomputed thanks to a shared prefix
    running_rows: int = 0  # rows in the batch after the last step
    cancelled_requests: int = 0  # requests whose rows left the batch unfinished (client gone)


class ContextLengthError(ValueError):
    """The request cannot fit in the model's context window."""


class EngineClosed(RuntimeError):
    """The engine has stopped (its backend is closing): a request still waiting, or one that
    arrives now, fails with this; the server answers it with a 503, not a traceback."""


def embedding_weight(model: torch.nn.Module, which: Literal["input", "output"]) -> torch.Tensor:
    """The input or output embedding matrix of a transformers model, or of a peft wrapper
    (which forwards `get_*_embeddings` to its base model; nn.Module's typing knows neither)."""
    return getattr(model, f"get_{which}_embeddings")().weight


def eos_ids(model: torch.nn.Module, tokenizer) -> set[int]:
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    for value in (getattr(config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(value)
    return ids
