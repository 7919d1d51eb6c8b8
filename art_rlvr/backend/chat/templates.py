"""A model's own chat template, with ART's semantics, applied to TorchBackend's tokenizer.

As on ART's own backends, the model carries it in `_internal_config` (`chat_template` or
`chat_template_path`, not both) and it replaces the tokenizer's template for serving and for
training alike. What a run's `chat_template=` means is `art_rlvr.core.chat_template`'s.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from art_rlvr.core.chat_template import ChatTemplateError, check_chat_template, missing_template

if TYPE_CHECKING:
    import art
    from transformers import PreTrainedTokenizerBase


def configured_chat_template(internal_config: Mapping[str, Any] | None) -> str | None:
    """A model's own template from ART's `_internal_config` (as ART's LocalBackend reads it)."""
    config = internal_config or {}
    text, path = config.get("chat_template"), config.get("chat_template_path")
    if text is not None and path is not None:
        raise ChatTemplateError("Set only one of chat_template or chat_template_path.")
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise ChatTemplateError(f"chat_template_path={path!r}: {error.strerror}") from None
    if text is not None:
        check_chat_template(text)
    return text


def model_tokenizer(
    tokenizer: PreTrainedTokenizerBase, model: art.Model, base_model: str
) -> PreTrainedTokenizerBase:
    """The tokenizer that renders `model`'s conversations: the base's, or a shallow copy with the
    model's configured template (ART copies tokenizers the same way). No template at all is a
    `ChatTemplateError` that names the setting."""
    template = configured_chat_template(getattr(model, "_internal_config", None))
    if template is not None:
        tokenizer = copy.copy(tokenizer)
        tokenizer.chat_template = template
    if not tokenizer.chat_template:
        raise ChatTemplateError(missing_template(base_model))
    return tokenizer
