"""`qa_search`: two-hop questions over a corpus of short passages that the model can only reach
through a `search` tool (BM25, from the `bm25s` library) and a `read` tool (one passage by id).

The first hop names a person or a place, the second gives the fact about it, so one search for
the question rarely suffices. The final reply is scored by exact match and token F1 against the
gold answers (the `qa` reward's SQuAD normalisation); `support_recall` counts how many of the
record's supporting passages the searches showed, tool calls and errors are counted by the
episode. With `tools = false` the same scenario runs closed-book (the "without the tool" row).

Records: {"id", "question", "answers", "support": [passage ids]}; the corpus is JSONL of
{"id", "title", "text"} (default: the one shipped with the built-in scenarios).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from art_rlvr.core.types import Messages, Record, Score
from art_rlvr.scenarios.environments.base import Environment, assistant_texts
from art_rlvr.scenarios.rewards.qa import QAReward

SHIPPED_CORPUS = "qa_search_corpus.jsonl"
_CITED = re.compile(r"\[(?P<id>[^\[\]\s]{1,64})\]")


def shipped(name: str) -> Path:
    """A data file shipped with the built-in scenarios (inside the wheel, or the checkout's)."""
    package = Path(__file__).resolve().parents[2]  # art_rlvr/
    folders = (package / "_scenarios" / "data", package.parent / "scenarios" / "data")
    found = [folder / name for folder in folders if (folder / name).is_file()]
    if not found:
        raise ValueError(f"{name} is not shipped with this install; give corpus = <path>")
    return found[0]


class Passage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(min_length=1, max_length=64, pattern=r"^[^\[\]\s]+$")
    title: str = ""
    text: str

    def line(self, chars: int) -> str:
        body = self.text if len(self.text) <= chars else self.text[: chars - 3] + "..."
        return f"[{self.id}] {self.title}: {body}" if self.title else f"[{self.id}] {body}"


def read_corpus(path: Path) -> list[Passage]:
    """Passages from JSONL; a bad line or a repeated id names the file and line."""
    if not path.is_file():
        raise ValueError(f"corpus {path} not found")
    passages: list[Passage] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            passages.append(Passage.model_validate(json.loads(line)))
        except ValueError as error:
            detail = " ".join(str(error).split())[:200]
            raise ValueError(f"{path}:{number}: not a passage ({detail})") from None
    ids = [p.id for p in passages]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: passage ids repeat")
    if not passages:
        raise ValueError(f"{path}: no passages")
    return passages


def tokens(texts: list[str]) -> list[list[str]]:
    """Lower-cased words of two or more letters, English stop words dropped (bm25s's own)."""
    import bm25s  # on first use: with scipy it takes seconds to import

    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class Corpus(BaseModel):
    """Passages with a BM25 index over title and text; `search` and `read` are the tools."""

    model_config = ConfigDict(frozen=True)

    passages: tuple[Passage, ...]
    snippet_chars: int = Field(default=300, ge=40)
    _index: Any = PrivateAttr()  # bm25s.BM25
    _by_id: dict[str, Passage] = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        import bm25s

        index = bm25s.BM25()
        index.index(tokens([f"{p.title} {p.text}" for p in self.passages]), show_progress=False)
        self._index, self._by_id = index, {p.id: p for p in self.passages}

    def search(self, query: str, k: Annotated[int, Field(ge=1, le=10)] = 3) -> str:
        """Search the passages by key words; returns the best matches with their ids.

        Args:
            query: names or key words, e.g. "Varda Bridge designer".
            k: how many passages to return (1 to 10).
        """
        words = tokens([query])[0]
        if not words:
            raise ValueError("the query has no searchable words; search for names or key words")
        found, scores = self._index.retrieve(
            [words], k=min(k, len(self.passages)), show_progress=False
        )
        hits = [self.passages[int(i)] for i, s in zip(found[0], scores[0], strict=True) if s > 0]
        if not hits:
            return f"No passage matches {query!r}. Try other key words from the question."
        return "\n".join(p.line(self.snippet_chars) for p in hits)

    def read(self, doc_id: str) -> str:
        """Read one passage in full by the id shown in search results, e.g. "p0012".

        Args:
            doc_id: a passage id from a search result.
        """
        passage = self._by_id.get(doc_id.strip().strip("[]"))
        if passage is None:
            raise ValueError(f"no passage has the id {doc_id!r}; use an id from search results")
        return passage.line(len(passage.text) + 3)


def shown_ids(episode: Messages) -> set[str]:
    """Passage ids that tool results put before the model."""
    return {
        m["id"]
        for message in episode
        if message.get("role") == "tool"
        for m in _CITED.finditer(str(message.get("content") or ""))
    }


class QASearch(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    corpus: str | None = None  # a JSONL path (relative to the working directory); None: shipped
    tools: bool = True
    snippet_chars: int = Field(default=300, ge=40)
    max_turns: int = Field(default=4, ge=1, le=32)
    answers_field: str = "answers"
    support_field: str = "support"
    reward_metric: Literal["f1", "em"] = "f1"

    def reward(self, x: Record, episode: Messages) -> Score:
        """The `qa` reward on the final reply, with how much of the support the searches
        found."""
        replies = assistant_texts(episode)
        score = QAReward(answers_field=self.answers_field, reward_metric=self.reward_metric)(
            x, replies[-1] if replies else ""
        )
        listed = x.get(self.support_field) or ()
        if not isinstance(listed, Iterable):
            raise TypeError(f"{self.support_field!r} of a record is not a list")
        support = set(listed)
        recall = len(support & shown_ids(episode)) / len(support) if support else 0.0
        return score.model_copy(update={"metrics": {**score.metrics, "support_recall": recall}})


def environment(**params: Any) -> Environment:
    """The corpus is read and indexed once, when the scenario loads."""
    settings = QASearch(**params)
    if not settings.tools:
        return Environment(reward=settings.reward, max_turns=1)
    path = Path(settings.corpus).expanduser() if settings.corpus else shipped(SHIPPED_CORPUS)
    corpus = Corpus(passages=tuple(read_corpus(path)), snippet_chars=settings.snippet_chars)
    return Environment(
        tools=(corpus.search, corpus.read), reward=settings.reward, max_turns=settings.max_turns
    )
