"""Chat templates: find the model's template and render it as transformers does.

transformers is the reference for what a template means, so every template is rendered
here with sandboxed jinja2 set up the way transformers 5 sets it up (trim_blocks,
lstrip_blocks, loop controls, its `tojson`, `raise_exception`, `strftime_now`, `dict` and
`namespace`). onnxruntime-genai's own renderer is never used: 0.18 evaluates
`'x' in some_string` as false without an error (Qwen3's template then keeps old
`<think>` blocks) and rejects some templates outright (`.replace()`).

Control tokens in user text: by default a message that contains `<|im_end|>` gets the
real control token, as transformers and vLLM do. With `sanitize=True` (the setting
`ORTSERVE_CHAT_PLAIN_CONTROL_TOKENS`), the strings the caller sent are marked before
rendering and encoded as plain text afterwards, as transformers'
`apply_chat_template(..., sanitize_control_tokens=True)` does (`core.text`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from ortserve.core.errors import InvalidRequestError

# transformers' private-use markers around control tokens found in user-supplied strings.
MARK_START = "\U000f0000"
MARK_END = "\U000f0001"
# A message's reasoning goes by these names; templates read the first (transformers).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def find_template(folder: Path) -> str | None:
    """The model's chat template from a baked folder, or None when it has none."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    for name in ("chat_template.json", "tokenizer_config.json"):
        path = folder / name
        if not path.is_file():
            continue
        template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(template, list):  # named templates: use "default"
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if isinstance(template, str) and template:
            return template
    return None


def special_tokens(folder: Path) -> dict[str, str]:
    """bos/eos/unk/pad token strings from tokenizer_config.json, for templates that use them
    (a bake records transformers' own map; this is the fallback for older bakes)."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    tokens = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[key] = value
    return tokens


def _raise_exception(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja2's own tojson escapes HTML characters; transformers' does not, and takes these.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)  # local time, as transformers


@lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    # jinja2 is imported on the first chat request, not at every cold start (~20 ms).
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

    class TemplateNamespace(Namespace):
        """`namespace()` that refuses underscore attributes (transformers' sandbox rule)."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            for name in dict(*rest, **kwargs):
                TemplateNamespace._check(name)
            Namespace.__init__(self, *rest, **kwargs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check(name)
            Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: object) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is refused")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = dict
    env.globals["namespace"] = TemplateNamespace
    try:
        return env.from_string(template)
    except jinja2.TemplateError as exc:
        raise InvalidRequestError(f"the model's chat template does not compile: {exc}") from exc


def _template_input(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as transformers hands them to a template: keys whose value is None dropped,
    reasoning under each of its names."""
    out = []
    for message in messages:
        plain = {k: v for k, v in message.items() if v is not None}
        reasoning = next((plain[k] for k in _REASONING_FIELDS if plain.get(k) is not None), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        out.append(plain)
    return out


def control_token_pattern(control_tokens: Sequence[str]) -> re.Pattern[str]:
    """A regex for any of `control_tokens`, the longest first (transformers' order)."""
    longest = sorted(control_tokens, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, longest)) or "(?!)")


def _mark(value: Any, pattern: re.Pattern[str]) -> Any:
    """Wrap the control tokens in user-supplied strings with the private-use markers."""
    if isinstance(value, str):
        value = value.replace(MARK_START, "").replace(MARK_END, "")  # no forged markers
        return pattern.sub(f"{MARK_START}\\g<0>{MARK_END}", value)
    if isinstance(value, dict):
        return {k: _mark(v, pattern) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_mark(v, pattern) for v in value]
    return value


def render(
    template: str,
    messages: Sequence[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tokens: dict[str, str] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    mark_controls: re.Pattern[str] | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
) -> str:
    """Render a Hugging Face chat template as transformers' `apply_chat_template` does.

    Args:
        template: The jinja2 chat template.
        messages: The conversation (role, content and any other keys).
        add_generation_prompt: Open the assistant's turn.
        tokens: The tokenizer's special tokens map (bos_token, eos_token, ...).
        template_kwargs: Extra template variables (`chat_template_kwargs`, e.g.
            `enable_thinking`); they override `tokens` of the same name, as in transformers.
        mark_controls: When given, control tokens in the caller's strings are wrapped in
            MARK_START/MARK_END for `core.text` to encode as plain text.
        tools: The tools' JSON schemas (`{"type": "function", "function": {...}}`), the
            template's `tools` variable, as transformers passes them.

    Raises:
        InvalidRequestError: The template rejects these messages (raise_exception) or
            cannot be rendered.
    """
    from jinja2 import TemplateError

    chat = _template_input(messages)
    extra = dict(template_kwargs or {})
    tool_list = list(tools) if tools else None
    if mark_controls is not None:
        chat = _mark(chat, mark_controls)
        extra = _mark(extra, mark_controls)
        tool_list = _mark(tool_list, mark_controls) if tool_list else None
    variables = {**(tokens or {}), **extra}
    # The template's own variables win over a caller's kwargs of the same name.
    for name in ("messages", "add_generation_prompt", "tools", "documents"):
        variables.pop(name, None)
    try:
        return str(
            _compiled(template).render(
                messages=chat,
                tools=tool_list,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        )
    except TemplateError as exc:
        raise InvalidRequestError(f"the chat template rejected the messages: {exc}") from exc
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        # A template that trips over the caller's data (a missing key, a wrong type).
        raise InvalidRequestError(f"the chat template failed on these messages: {exc}") from exc
