"""Chat templates a run chooses (`chat_template=`), with ART's semantics for a model's own.

A base (pretrained) checkpoint often ships no chat template, and a tokenizer without one cannot
render a conversation: every rollout would error. A run names one instead: `plain` (role
prefixes, for base models), `chatml`, a Jinja string or a file. As on ART's own backends, the
model carries it in `_internal_config` (`chat_template` or `chat_template_path`, not both) and
it replaces the tokenizer's template for serving and for training alike.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

if TYPE_CHECKING:
    import art
    import jinja2.parser
    from transformers import PreTrainedTokenizerBase

# "System: ...\nUser: ...\nAssistant: ..." with the end-of-sequence token closing each reply,
# so a sampled reply stops there and a trained one learns to.
PLAIN = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}{{ '\\n' }}"
    "{{ message['content'] }}<|im_end|>{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}"
)
NAMED_TEMPLATES = {"plain": PLAIN, "chatml": CHATML}
SETTING = "chat_template"
_SAMPLE = [{"role": "system", "content": "s-ping"}, {"role": "user", "content": "u-ping"}]


class ChatTemplateError(ValueError):
    """A chat template that is missing, unreadable or not valid Jinja; one line."""


def resolve_chat_template(value: str) -> str:
    """The template text for a `chat_template=` value: a name (`plain`, `chatml`), a Jinja
    string (it holds `{{` or `{%`), else a path to a template file. Checked by rendering."""
    if value in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[value]
    if "{{" in value or "{%" in value:
        text = value
    else:
        path = Path(value).expanduser()
        if not path.is_file():
            raise ChatTemplateError(
                f"{SETTING}={value!r}: no such file, and not a template name "
                f"({', '.join(NAMED_TEMPLATES)}) or a Jinja string"
            )
        text = path.read_text(encoding="utf-8")
    check_chat_template(text)
    return text


class _Generation(jinja2.ext.Extension):
    """transformers' `{% generation %}` block (marks assistant tokens): parsed, not tracked."""

    tags: set[str] = {"generation"}  # noqa: RUF012 (jinja2 declares it so, per instance)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def check_chat_template(text: str) -> None:
    """Compile `text` as transformers does and render a system + user prompt with it: a syntax
    error or a template that drops the messages is a `ChatTemplateError`, before any load."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.globals["raise_exception"] = _raise
    try:
        rendered = env.from_string(text).render(
            messages=_SAMPLE, add_generation_prompt=True, eos_token="</s>", bos_token="<s>"
        )
    except jinja2.TemplateSyntaxError as error:
        raise ChatTemplateError(
            f"{SETTING}: not a valid Jinja template (line {error.lineno}: {error.message})"
        ) from None
    except (jinja2.TemplateError, TypeError, KeyError, IndexError) as error:
        raise ChatTemplateError(
            f"{SETTING}: rendering a system + user prompt failed: {error}"
        ) from None
    if "u-ping" not in rendered:
        raise ChatTemplateError(f"{SETTING}: the template does not render the messages' content")


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


def trainable_model(
    name: str,
    project: str,
    base_model: str,
    chat_template: str | None = None,
    internal: Mapping[str, object] | None = None,
) -> art.TrainableModel:
    """A run's `art.TrainableModel` (run_name = name). A chat template travels in ART's own
    `_internal_config`, which ART's backends and TorchBackend both read, to serve and train;
    `internal` adds a backend's own entries (`choose.model_config`)."""
    import art
    from art.dev.model import InternalModelConfig

    entries = {
        **(internal or {}),
        **({} if chat_template is None else {"chat_template": chat_template}),
    }
    config = cast(InternalModelConfig, entries) if entries else None
    return art.TrainableModel(
        name=name, project=project, run_name=name, base_model=base_model, _internal_config=config
    )


def missing_template(base_model: str) -> str:
    return (
        f"base model {base_model} has no chat template; set {SETTING}=plain (role-prefixed "
        f"turns), {SETTING}=chatml, a Jinja string or a template file"
    )
