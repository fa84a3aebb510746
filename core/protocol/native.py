"""The native API: POST /generate, its body and its answers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ConfigDict, Field, JsonValue, model_validator

from ortserve.core.generation import (
    Completion,
    GenerationRequest,
    Guidance,
    SamplingOptions,
    TokenLogprob,
)
from ortserve.core.http import Request, Response
from ortserve.core.protocol.bodies import (
    IGNORE_EOS_DOC,
    MIN_TOKENS_DOC,
    NO_MINIMUM,
    REPETITION_PENALTY_DOC,
    SEED,
    SPECULATIVE_DOC,
    TEMPERATURE_DOC,
    TOP_K_DOC,
    TOP_P_DOC,
    GenerationBody,
    Grammar,
    Int,
    JsonSchema,
    Regex,
    Seed,
    Stop,
    TokenCount,
    TokenLimit,
    TopK,
    json_guidance,
)
from ortserve.core.protocol.patterns import ecma_classes
from ortserve.core.protocol.replies import Generated, GeneratedEnd, GeneratedText
from ortserve.core.protocol.serving import Reply, Served

if TYPE_CHECKING:  # core.api imports core.routes, which imports this module
    from ortserve.core.api import Api, Context

_GUIDED = ("guided_json", "guided_regex", "guided_grammar")
_RULES: list[JsonValue] = [
    {
        "if": {
            "properties": {"num_beams": {"type": "integer", "minimum": 2}},
            "required": ["num_beams"],
        },
        "then": {"properties": {name: {"type": "null"} for name in _GUIDED}},
    },
]
_RULES += [
    {
        "if": {"properties": {name: {"not": {"type": "null"}}}, "required": [name]},
        "then": NO_MINIMUM,
    }
    for name in _GUIDED
]
MAX_BEAMS = 8
DEFAULT_MAX_NEW_TOKENS = 128


class GenerateBody(GenerationBody):
    """POST /generate: the simple native API.

    Constrained decoding takes vLLM's field names: `guided_json` (a JSON schema),
    `guided_regex` or `guided_grammar` (a Lark grammar, as onnxruntime-genai's
    llguidance reads it); at most one.
    """

    # The schema says the rules between fields: a beam search takes no guidance, and
    # guidance no minimum length.
    model_config = ConfigDict(json_schema_extra={"allOf": _RULES})

    prompt: str = Field(min_length=1)
    max_new_tokens: TokenLimit | None = Field(
        default=None,
        description=f"default {DEFAULT_MAX_NEW_TOKENS}, or the server's limit if lower",
    )
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, description=TEMPERATURE_DOC)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, description=TOP_P_DOC)
    top_k: TopK | None = Field(default=None, description=TOP_K_DOC)
    repetition_penalty: float | None = Field(
        default=None, gt=0.0, le=2.0, description=REPETITION_PENALTY_DOC
    )
    seed: Seed | None = SEED
    stop: Stop = None
    min_tokens: TokenCount = Field(default=0, description=MIN_TOKENS_DOC)
    ignore_eos: bool = Field(default=False, description=IGNORE_EOS_DOC)
    speculative: bool = Field(default=True, description=SPECULATIVE_DOC)
    num_beams: Int = Field(
        default=1,
        ge=1,
        le=MAX_BEAMS,
        description="beam search with this many beams (above 1; deterministic: temperature, "
        "top_p, top_k and seed do not apply; no guidance; streamed, the text comes whole)",
    )
    length_penalty: float = Field(
        default=1.0, ge=-10.0, le=10.0, description="beam search: above 1 favours longer beams"
    )
    early_stopping: bool = Field(
        default=True, description="beam search: end once num_beams beams have ended"
    )
    guided_json: JsonSchema | None = Field(
        default=None, description="the output is JSON valid against this schema"
    )
    guided_regex: Regex | None = Field(
        default=None, min_length=1, description="the output matches this regular expression"
    )
    guided_grammar: Grammar | None = Field(
        default=None, min_length=1, description="the output follows this Lark grammar"
    )

    @model_validator(mode="after")
    def _one_guide(self) -> GenerateBody:
        given = [name for name in _GUIDED if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of {', '.join(_GUIDED)}, not {' and '.join(given)}")
        if given and self.num_beams > 1:
            raise ValueError(f"a beam search (num_beams {self.num_beams}) takes no {given[0]}")
        return self

    def _guidance(self) -> Guidance | None:
        if self.guided_json is not None:
            return json_guidance(self.guided_json, "guided_json")
        if self.guided_regex is not None:
            return Guidance("regex", ecma_classes(self.guided_regex))
        if self.guided_grammar is not None:
            return Guidance("lark_grammar", self.guided_grammar)
        return None

    def to_generation(self, served: Served) -> GenerationRequest:
        limit = self.max_new_tokens
        if limit is None:
            default = max(DEFAULT_MAX_NEW_TOKENS, self.min_tokens)
            limit = min(default, served.max_new_tokens)
        # The server checks it against its limit (Service.budget); ignore_eos: all of it,
        # and a min_tokens above the limit still says so (it is refused above the server's).
        minimum = max(limit, self.min_tokens) if self.ignore_eos else self.min_tokens
        options = SamplingOptions(
            max_new_tokens=limit,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            repetition_penalty=self.repetition_penalty,
            seed=self.seed,
            min_new_tokens=minimum,
            num_beams=self.num_beams,
            length_penalty=self.length_penalty,
            early_stopping=self.early_stopping,
            speculative=self.speculative,
        )
        return GenerationRequest(
            prompt=self.prompt,
            options=options,
            stop=tuple(self.stop or ()),
            guidance=self._guidance(),
            limit_field="max_new_tokens",
        )

    def reply(self, request_id: str, served: Served) -> Reply:
        return GenerateReply()


class GenerateReply(Reply):
    """/generate's answer: `{"generated_text", counts}`, or events of `{"text"}` and a
    final `{"done": true, counts}` (no `[DONE]`)."""

    done_marker = False

    def delta(self, text: str, logprobs: list[TokenLogprob] | None = None) -> GeneratedText:
        return {"text": text}

    def final_events(self, done: Completion) -> list[GeneratedEnd]:
        return [
            {
                "done": True,
                "tokens_generated": done.completion_tokens,
                "prompt_tokens": done.prompt_tokens,
                "finish_reason": done.finish_reason,
            }
        ]

    def body(self, done: Completion) -> Generated:
        return {
            "generated_text": done.text,
            "tokens_generated": done.completion_tokens,
            "prompt_tokens": done.prompt_tokens,
            "finish_reason": done.finish_reason,
        }


# -- the route's answer (core.routes) ----------------------------------------------------


def generate(api: Api, request: Request, ctx: Context) -> Response:
    """POST /generate."""
    return api.generate(GenerateBody, request, ctx)
