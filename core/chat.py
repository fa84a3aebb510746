"""Chat templates: find the model's template and render it with sandboxed jinja2.

onnxruntime-genai renders most templates itself; this is the fallback for the ones it
rejects (it has no `.replace()`, for example), rendered the way transformers does.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.errors import InvalidRequestError


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
    """bos/eos/unk/pad token strings from tokenizer_config.json, for templates that use them."""
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


def _strftime_now(fmt: str) -> str:
    return datetime.now(UTC).strftime(fmt)


def render(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tokens: dict[str, str] | None = None,
) -> str:
    """Render a Hugging Face chat template in a sandbox, as transformers does.

    Raises:
        InvalidRequestError: The template rejects these messages (raise_exception) or
            cannot be rendered.
    """
    # jinja2 only for the fallback: importing it costs ~20 ms of every cold start.
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, indent=None: json.dumps(
        value, indent=indent, ensure_ascii=False
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **(tokens or {})
        )
    except TemplateError as exc:
        raise InvalidRequestError(f"the chat template rejected the messages: {exc}") from exc
