"""Request bodies of the HTTP API (pydantic v2).

OpenAI's conventions: unknown fields are ignored, `null` for an optional field means its
default (the openai client sends `temperature=None` when asked), and values are not
coerced (`"max_tokens": "5"`, `"stream": "yes"` are errors: strict validation). The
bounds are the ones the server keeps, so the OpenAPI document advertises only what it
accepts (`n` is 1; `echo`, `logprobs` and `tools` are not supported).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from core.stops import MAX_STOP_STRINGS

_SEED = Field(default=None, ge=-(2**63), le=2**63 - 1, description="same seed, same output")
_TEMPERATURE_DOC = "0 is greedy; higher samples more freely"
_TOP_K_DOC = "keep the k most likely tokens; 0, or k at or above the vocabulary size: keep all"


class _Body(BaseModel):
    # defer_build: a model's validator is built on first use, not at import: a Lambda cold
    # start that answers /generate builds one, not all of them.
    model_config = ConfigDict(extra="ignore", defer_build=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


def _stops(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if len(stops) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
    if any(not s for s in stops):
        raise ValueError("stop strings must not be empty")
    return stops


# Up to MAX_STOP_STRINGS non-empty strings; validated into a list.
Stop = Annotated[str | list[str] | None, AfterValidator(_stops)]


class GenerateBody(_Body):
    """POST /generate: the simple native API."""

    prompt: str = Field(min_length=1)
    max_new_tokens: int = Field(default=128, ge=1, le=131072)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description=_TEMPERATURE_DOC)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=100000, description=_TOP_K_DOC)
    seed: int | None = _SEED
    stop: Stop = None
    stream: bool = False


class StreamOptions(_Body):
    """OpenAI stream_options."""

    include_usage: bool = False


class _OpenAIBody(_Body):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=131072)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, description=_TEMPERATURE_DOC)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = _SEED
    stop: Stop = None
    n: int = Field(default=1, ge=1, le=1, description="one choice per request")
    stream: bool = False
    stream_options: StreamOptions | None = None


class CompletionBody(_OpenAIBody):
    """POST /v1/completions."""

    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=0, description="not supported")
    echo: Literal[False] = Field(default=False, description="not supported")

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("exactly one prompt is supported")
        return value

    def text(self) -> str:
        """The single prompt."""
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class ContentPart(_Body):
    """One part of a message's content; only text parts are supported."""

    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    """One chat message."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    reasoning_content: str | None = Field(
        default=None, description="an assistant turn's reasoning (templates such as Qwen3's "
        "drop it from earlier turns)",
    )  # fmt: skip
    tool_call_id: str | None = None

    def as_template_input(self) -> dict[str, Any]:
        """The message as chat templates expect it: role, plain-text content (text parts
        joined), and the optional keys that were given."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": content or ""}
        for key in ("name", "reasoning_content", "tool_call_id"):
            value = getattr(self, key)
            if value is not None:
                message[key] = value
        return message


class JsonSchemaFormat(_Body):
    """response_format.json_schema."""

    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """response_format: text, json_object or json_schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatBody(_OpenAIBody):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=131072)
    response_format: ResponseFormat | None = None
    logprobs: Literal[False] = Field(default=False, description="not supported")
    tools: list[dict[str, Any]] | None = Field(
        default=None, max_length=0, description="not supported"
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="extra variables for the model's chat template, e.g. "
        '{"enable_thinking": false} for Qwen3 (as vLLM and llama-server accept)',
    )
