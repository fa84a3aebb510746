"""Tool calling (OpenAI's `tools` and `tool_choice`): the tools in the prompt and the tool
calls out of the text, for each chat-template family — in this one module.

Families, detected from the model's chat template:

- `hermes`: the template takes `tools` and asks for `<tool_call>{"name": ..., "arguments":
  ...}</tool_call>` (Qwen2.5, Qwen3, Hermes): the tools go to the template as
  transformers passes them, calls are read from those tags.
- `generic`: any other template (SmolLM2's, Llama 3.0's, Gemma's take no tools): the tools
  are described in a system message, the model answers a call as one JSON object
  `{"name": ..., "arguments": ...}` (as llama-server's generic format), and tool results
  go back as user turns (such templates know no `tool` role).

With `tool_choice` `required` or a named function, the output is constrained to that JSON
object by onnxruntime-genai's guidance (a JSON schema built from the tools' `parameters`),
so the arguments always parse and validate, even from a 135M model.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from ortserve.core.errors import InvalidRequestError
from ortserve.core.generation import Completion, Guidance
from ortserve.core.protocol.bodies import Body, JsonSchema, json_guidance
from ortserve.core.protocol.patterns import closed_objects
from ortserve.core.protocol.replies import OllamaReplyToolCall
from ortserve.core.protocol.replies import ToolCall as OpenAIToolCall
from ortserve.core.protocol.serving import Served

ToolFamily = Literal["hermes", "generic"]
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_GENERIC_PROMPT = (
    "You can call these functions (JSON schemas, one per line):\n{tools}\n\n"
    "To call one, reply with only a JSON object: "
    '{{"name": "<function name>", "arguments": {{<its arguments>}}}}. '
    "Otherwise, reply to the user normally."
)


class FunctionDef(Body):
    """A tool's function: its name, what it does, its parameters' JSON schema."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: JsonSchema | None = None
    strict: bool | None = None


class Tool(Body):
    """One tool (OpenAI's and Ollama's: a function)."""

    type: Literal["function"]
    function: FunctionDef


#: The most tools one request may offer.
MAX_TOOLS = 64


def family(template: str) -> ToolFamily:
    """The tool-call family of a chat template."""
    if "<tool_call>" in template and "tools" in template:
        return "hermes"
    return "generic"


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: `arguments` is a JSON object as a string (OpenAI's)."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> OpenAIToolCall:
        """OpenAI's `tool_calls` entry."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    def as_ollama(self) -> OllamaReplyToolCall:
        """Ollama's `tool_calls` entry: the arguments as an object."""
        return {"function": {"name": self.name, "arguments": json.loads(self.arguments)}}


@dataclass(frozen=True)
class ToolPlan:
    """What one request's tools need: how to prompt, constrain and read calls.

    Attributes:
        family: The template's family.
        tools: The tools' JSON schemas (`{"type": "function", "function": {...}}`).
        choice: `auto`, `required`, or the name of the one function to call.
    """

    family: ToolFamily
    tools: list[dict[str, Any]]
    choice: str

    @property
    def names(self) -> list[str]:
        """The functions' names."""
        return [str(t["function"]["name"]) for t in self.tools]

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The chat template's `tools` (none for the generic family: the prompt has them)."""
        return self.tools if self.family == "hermes" else None

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation as this family's template takes it: earlier calls and tool
        results as the template knows them, the tools described where it does not."""
        if self.family == "hermes":
            return [_hermes_message(m) for m in messages]
        out = [_generic_message(m) for m in messages]
        lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in self.tools)
        prompt = _GENERIC_PROMPT.format(tools=lines)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
        return out

    def guidance(self) -> Guidance | None:
        """The constraint `required` or a named function puts on the output: one JSON
        object naming a function and giving arguments valid against its parameters."""
        if self.choice == "auto":
            return None
        chosen = [t["function"] for t in self.tools]
        chosen = [f for f in chosen if self.choice in ("required", f["name"])]
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": _parameters(f)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for f in chosen
        ]
        schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
        return json_guidance(schema, "tools", closed=False)

    def parse(self, text: str) -> list[ToolCall]:
        """The calls in the model's text (none: it answered in words)."""
        found = [m.group(1) for m in _HERMES_CALL.finditer(text)] if self.family == "hermes" else []
        candidates = found or [text.strip()]
        calls = [call for c in candidates if (call := self._call(c)) is not None]
        return calls if len(calls) == len(candidates) else []

    def ending(self, done: Completion) -> str:
        """How an answer ended, for its record: `tool_calls` when it stopped on calls."""
        if done.finish_reason == "stop" and self.parse(done.text):
            return "tool_calls"
        return done.finish_reason

    def _call(self, text: str) -> ToolCall | None:
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("name") not in self.names:
            return None
        arguments = data.get("arguments", data.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as a string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        encoded = json.dumps(arguments, ensure_ascii=False)
        return ToolCall(f"call_{uuid.uuid4().hex[:24]}", str(data["name"]), encoded)


def with_tools(
    plan: ToolPlan | None, messages: list[dict[str, Any]], guidance: Guidance | None
) -> tuple[list[dict[str, Any]], Guidance | None, list[dict[str, Any]] | None]:
    """A chat request's conversation, output constraint and template tools once its tool
    `plan` applies (None: no tools, all as they were): a forced call's constraint wins
    over a response format's."""
    if plan is None:
        return messages, guidance, None
    return plan.messages(messages), plan.guidance() or guidance, plan.template_tools()


def function_tool(
    name: str, description: str | None, parameters: dict[str, Any] | None, strict: bool | None
) -> Tool:
    """The chat API's tool for a function given in another API's shape (the Responses
    API's flat one, Anthropic's `input_schema`)."""
    function = FunctionDef(name=name, description=description, parameters=parameters, strict=strict)
    return Tool(type="function", function=function)


def plan_choice(
    tools: list[Tool] | None,
    choice: str | None,
    served: Served,
    field: str = "tool_choice",
) -> ToolPlan | None:
    """The plan for `tools` and a `tool_choice` as chat's: None or `auto`, `none`,
    `required`, or the name of the function the model must call (`field`: where the
    request named it). None: no tools, or `none`.

    Raises:
        InvalidRequestError: A tool_choice without tools, or naming another function.
    """
    if choice is not None and not tools:
        raise InvalidRequestError("tool_choice needs tools", "tool_choice")
    if not tools or choice == "none":
        return None
    names = [t.function.name for t in tools]
    if choice not in (None, "auto", "required") and choice not in names:
        raise InvalidRequestError(
            f"tool_choice names {choice!r}, which is not one of the tools", field
        )
    return plan_tools(tools, choice or "auto", served)


def plan_tools(tools: list[Tool], choice: str, served: Served) -> ToolPlan:
    """The plan for `tools` on the served model's chat template.

    Raises:
        InvalidRequestError: The model has no chat template.
    """
    if served.chat_template is None:
        raise InvalidRequestError("this model has no chat template: it cannot call tools", "tools")
    dumped = [t.model_dump(exclude_none=True) for t in tools]
    return ToolPlan(family(served.chat_template), dumped, choice)


def _parameters(function: dict[str, Any]) -> dict[str, Any]:
    """A function's parameters as the constraint takes them: its objects closed at their
    declared properties (`closed_objects`) unless the function says `strict: false`.

    OpenAI's `strict: true` means `additionalProperties: false`; without `strict` this
    server closes them too, because a small model allowed more keys keeps adding them
    until its token limit. `strict: false` keeps the schema as written (JSON Schema's
    open objects)."""
    parameters: dict[str, Any] = function.get("parameters") or {"type": "object"}
    return parameters if function.get("strict") is False else closed_objects(parameters)


def _arguments(call: dict[str, Any]) -> Any:
    """A call's arguments as templates take them: the object, not OpenAI's string."""
    arguments = call["function"]["arguments"]
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return arguments


def _hermes_message(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {
        **message,
        "tool_calls": [
            {**c, "function": {"name": c["function"]["name"], "arguments": _arguments(c)}}
            for c in calls
        ],
    }


def _generic_message(message: dict[str, Any]) -> dict[str, Any]:
    if message["role"] == "tool":  # OpenAI's results name the call, Ollama's the function
        call_id, name = message.get("tool_call_id"), message.get("name")
        call = f" of call {call_id}" if call_id else f" of {name}" if name else ""
        return {"role": "user", "content": f"Result{call}: {message.get('content') or ''}"}
    calls = message.get("tool_calls")
    if not calls:
        return message
    text = "\n".join(
        json.dumps({"name": c["function"]["name"], "arguments": _arguments(c)}, ensure_ascii=False)
        for c in calls
    )
    rest = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**rest, "content": text}
