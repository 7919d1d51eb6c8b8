"""Constrained decoding with xgrammar: the grammars the server asks for, the masks the engine
applies.

Why xgrammar: computing the allowed-token mask along a nested 4-key schema with SmolLM2's 49k
vocabulary takes 3.4 us a token against 57 us for llguidance (the other candidate measured)
(`uv run --with llguidance python benchmarks/agent_endpoint.py --libraries --concurrency
--auto-samples 0`, best of 5, shared 2-core CPU); lm-format-enforcer 0.11 does not import with
transformers 5; outlines was not tried (its JSON path compiles a regex automaton per schema).
xgrammar runs on CPU, is vLLM's default structured-output backend, and its structural tags
express the Hermes tool-call format we render (`<tool_call>\n{"name": ..., "arguments":
...}\n</tool_call>`), so a constrained reply parses with the same parser and re-renders to the
same text in training. Its cost: one wheel plus apache-tvm-ffi (triton comes with torch).

A request's constraint travels as a structural tag in JSON text (hashable, so it fits the
frozen `SamplingParams`); the engine compiles it once per distinct tag (xgrammar caches) and
keeps one matcher per row. Rows without a constraint pay nothing.
"""

from __future__ import annotations

import json
import threading
from functools import lru_cache
from typing import Any

import numpy as np
import torch
import xgrammar as xgr
from xgrammar.structural_tag import GrammarFormat, StructuralTag, TagFormat, TagsWithSeparatorFormat

from art_rlvr.backend.chat.render import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

# Arguments and JSON replies in json.dumps' layout, no free whitespace: the layout the model
# has seen most, the one a re-rendered call has, and a 135M model under a flexible-whitespace
# grammar otherwise pads (`{ "city" : "Paris" }`, seen) or loops on newlines.
JSON_SEPARATORS = (", ", ": ")


def tool_call_grammar(tools: list[dict[str, Any]], *, parallel: bool) -> str:
    """The reply is one Hermes call (several if `parallel`) to one of `tools`, nothing else."""
    tags = [_call_tag(t["function"]) for t in tools]
    if len(tags) == 1 and not parallel:
        return StructuralTag(format=tags[0]).model_dump_json()
    return StructuralTag(
        format=TagsWithSeparatorFormat(
            tags=tags, separator="\n", at_least_one=True, stop_after_first=not parallel
        )
    ).model_dump_json()


def json_grammar(schema: dict[str, object] | bool) -> str:
    """The reply is one JSON value matching `schema` (`True`: any JSON object or value)."""
    return StructuralTag(format=_json(schema)).model_dump_json()


def _call_tag(function: dict[str, Any]) -> TagFormat:
    name = json.dumps(function["name"], ensure_ascii=False)
    return TagFormat(
        begin=f'{TOOL_CALL_OPEN}\n{{"name": {name}, "arguments": ',
        content=_json(function.get("parameters") or {"type": "object"}),
        end=f"}}\n{TOOL_CALL_CLOSE}",
    )


def _json(schema: dict[str, object] | bool) -> GrammarFormat:
    """JSON matching `schema` in one fixed layout (no free whitespace)."""
    return GrammarFormat(grammar=_json_ebnf(json.dumps(schema)))


@lru_cache(maxsize=256)
def _json_ebnf(schema: str) -> str:
    try:
        grammar = xgr.Grammar.from_json_schema(
            schema, any_whitespace=False, separators=JSON_SEPARATORS
        )
    except (RuntimeError, ValueError, TypeError) as error:
        raise ValueError(f"cannot build a grammar for this JSON schema: {error}") from error
    return str(grammar)


class Grammars:
    """Compiles grammars for one tokenizer and turns matchers into logit masks.

    The vocabulary table is built on first use (about a second), so engines that never see a
    constrained request never pay for it.
    """

    def __init__(self, tokenizer, vocab_size: int, stop_ids: set[int]) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_ids = sorted(stop_ids)
        self._compiler: xgr.GrammarCompiler | None = None
        self._lock = threading.Lock()

    def compile(self, grammar: str) -> xgr.CompiledGrammar:
        """Compile a structural tag; a bad schema raises ValueError (a 400 at the edge)."""
        with self._lock:
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self._vocab_size, stop_token_ids=self._stop_ids
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            compiler = self._compiler
        try:
            return compiler.compile_structural_tag(grammar)
        except (RuntimeError, ValueError, TypeError) as error:
            raise ValueError(f"cannot build a grammar for this request: {error}") from error

    @staticmethod
    def matcher(compiled: xgr.CompiledGrammar) -> xgr.GrammarMatcher:
        return xgr.GrammarMatcher(compiled)

    def mask(self, logits: torch.Tensor, matchers: list[xgr.GrammarMatcher | None]) -> None:
        """Set the logits of tokens each row's grammar forbids to -inf, in place."""
        rows = [i for i, m in enumerate(matchers) if m is not None]
        if not rows:
            return
        bitmask = xgr.allocate_token_bitmask(len(rows), self._vocab_size)
        for slot, row in enumerate(rows):
            matcher = matchers[row]
            assert matcher is not None
            matcher.fill_next_token_bitmask(bitmask, slot)
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=-1, bitorder="little")
        allowed = torch.from_numpy(bits[:, : logits.shape[-1]].astype(bool)).to(logits.device)
        index = torch.tensor(rows, device=logits.device)
        logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
