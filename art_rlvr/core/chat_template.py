"""The chat template a run chooses (`chat_template=`), checked before anything loads.

A base (pretrained) checkpoint often ships no chat template, and a tokenizer without one cannot
render a conversation: every rollout would error. A run names one instead: `plain` (role
prefixes, for base models), `chatml`, a Jinja string or a file. The text travels in ART's
`_internal_config`, which every ART backend reads, so it is no one backend's: here it is only
resolved and checked (Jinja, no transformers), for the config and the backends alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

if TYPE_CHECKING:
    import jinja2.parser

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


def missing_template(base_model: str) -> str:
    """The one line for a base model with no template of its own and none set."""
    return (
        f"base model {base_model} has no chat template; set {SETTING}=plain (role-prefixed "
        f"turns), {SETTING}=chatml, a Jinja string or a template file"
    )
