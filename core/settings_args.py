"""Command-line flags derived from the settings (as llama-cpp-python's server derives
its flags from its settings model): a flag's type, bounds, choices, environment
variable, default and help come from the settings class, so the two cannot disagree.

The help is the first sentence of the field's entry in its class's `Attributes:`
docstring section (Google style), the one place each setting is described.
"""

from __future__ import annotations

import argparse
import inspect
import re
from functools import cache
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import AliasChoices, TypeAdapter, ValidationError
from pydantic_settings import BaseSettings

_ENTRY = re.compile(r"^    (\w+): (.*)$")


@cache
def attribute_docs(cls: type) -> dict[str, str]:
    """Each attribute's text in the `Attributes:` sections of `cls`'s docstring and its
    bases' (a subclass's own entry wins), joined into one line."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        text = inspect.cleandoc(klass.__dict__.get("__doc__") or "")
        name = None
        inside = False
        for line in text.splitlines():
            if line.strip() == "Attributes:":
                inside, name = True, None
                continue
            if not inside:
                continue
            if line and not line.startswith(" "):  # the section ended
                inside = False
            elif match := _ENTRY.match(line):
                name = match.group(1)
                docs[name] = match.group(2)
            elif name is not None and line.startswith("        "):
                docs[name] += " " + line.strip()
    return docs


def env_name(settings: type[BaseSettings], name: str) -> str:
    """The environment variable a setting is read from."""
    alias = settings.model_fields[name].validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    prefix = str(settings.model_config.get("env_prefix", ""))
    return f"{prefix}{name}".upper()


def _help(settings: type[BaseSettings], name: str, default: Any) -> str:
    doc = attribute_docs(settings).get(name)
    if doc is None:
        raise ValueError(f"{settings.__name__}.{name} has no entry in its Attributes: docstring")
    first = _first_sentence(doc)
    first = first[:1].lower() + first[1:]
    env = env_name(settings, name)
    shown = [] if env in first else [env]
    if default not in (None, False, [], ""):
        shown.append(f"default {default}")
    return f"{first} ({', '.join(shown)})" if shown else first


def _first_sentence(text: str) -> str:
    """`text` up to its first full stop outside parentheses (without it)."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "." and depth == 0 and (i + 1 == len(text) or text[i + 1] == " "):
            return text[:i]
    return text


def _converter(settings: type[BaseSettings], name: str) -> Any:
    field = settings.model_fields[name]
    shape: Any = field.annotation
    if field.metadata:  # its bounds (ge, le, min_length)
        shape = Annotated[(shape, *field.metadata)]
    adapter: TypeAdapter[Any] = TypeAdapter(shape)

    def convert(text: str) -> Any:
        try:
            return adapter.validate_strings(text)
        except ValidationError as exc:
            raise argparse.ArgumentTypeError(exc.errors()[0]["msg"]) from None

    convert.__name__ = name  # argparse names the type in its error messages
    return convert


def add_setting_argument(
    parser: argparse.ArgumentParser,
    settings: type[BaseSettings],
    name: str,
    *flags: str,
    **kwargs: Any,
) -> argparse.Action:
    """Add the flag of setting `name` (default `--name-with-dashes`) to `parser`: its value
    is checked as the setting's (type and bounds), its help is the setting's own, and it
    is None when not given (the environment, then the default, apply). `kwargs` go to
    `add_argument` (e.g. `metavar`; `help` replaces the derived one, `action` a flag's
    conversion)."""
    field = settings.model_fields[name]
    default = None if field.default_factory is not None else field.default
    kwargs.setdefault("help", _help(settings, name, default))
    if field.annotation is bool:
        kwargs.setdefault("action", "store_true")
    elif "action" not in kwargs:
        kwargs.setdefault("type", _converter(settings, name))
        if get_origin(field.annotation) is Literal:
            kwargs.setdefault("choices", get_args(field.annotation))
    kwargs.setdefault("default", None)
    return parser.add_argument(*(flags or (f"--{name.replace('_', '-')}",)), dest=name, **kwargs)
