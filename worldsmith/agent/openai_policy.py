"""A policy backed by an OpenAI-compatible chat model: native tool calls, or the text format
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` for models without tool calling; either
one optionally through the two meta-tools `list_tools` and `call_tool` (the reference paper's agent)."""

from __future__ import annotations

import json
import re
import time
from typing import Any, Literal

import openai
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)

from worldsmith.agent.messages import Message, PolicyTurn, ToolCall
from worldsmith.agent.policies import META_TOOLS
from worldsmith.agent.policy_checks import endpoint_failure
from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.bundle import TaskSpec
from worldsmith.toolschema import ToolSchemaJson

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
META_FORMAT = (
    '\n\nCall the tools above through the meta-tool call_tool with {"tool_name": <tool>, "arguments": {...}}; '
    "list_tools lists them again."
)
TEXT_FORMAT = (
    '\n\nTo call a tool, write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call> '
    "(one block per call). Tool results come back in <tool_response> blocks. Reply without a block when done."
)


def to_meta(call: ToolCall) -> tuple[str, JsonObject]:
    """How a real tool call is written through the meta-tools."""
    if call.name == "list_tools":
        return "list_tools", {}
    return "call_tool", {"tool_name": call.name, "arguments": call.arguments}


def from_meta(call: ToolCall) -> tuple[ToolCall | None, str | None]:
    """The real tool call behind a meta-tool call; a call_tool without a tool name is a format error."""
    if call.name != "call_tool":
        return call, None
    name, arguments = call.arguments.get("tool_name"), call.arguments.get("arguments", {})
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return None, 'call_tool needs {"tool_name": str, "arguments": object}'
    return ToolCall(id=call.id, name=name, arguments=arguments), None


def parse_text_calls(content: str, turn: int) -> tuple[list[ToolCall], str | None]:
    """Tool calls written in the text format; a malformed block is a format error."""
    calls = []
    for index, block in enumerate(_TOOL_CALL.findall(content), start=1):
        try:
            data = json.loads(block)
        except json.JSONDecodeError as exc:
            return [], f"tool call {index} is not valid JSON: {exc.msg}"
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("name"), str)
            or not isinstance(data.get("arguments", {}), dict)
        ):
            return [], f'tool call {index} must be {{"name": str, "arguments": object}}'
        calls.append(ToolCall(id=f"call_{turn}_{index}", name=data["name"], arguments=data.get("arguments", {})))
    if not calls and "<tool_call>" in content:
        return [], "unterminated <tool_call> block"
    return calls, None


class OpenAIPolicy:
    """Chat with an OpenAI-compatible endpoint; `mode` is "native" (tools parameter) or "text";
    `meta` routes every call through `list_tools` / `call_tool`."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        mode: Literal["native", "text"] = "native",
        meta: bool = False,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        timeout_s: float = 60.0,
    ):
        self.name = f"openai:{model}" + ("" if mode == "native" else f"[{mode}]") + ("[meta]" if meta else "")
        self.model, self.mode, self.meta, self.temperature, self.max_tokens = model, mode, meta, temperature, max_tokens
        self.client = openai.OpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout_s, max_retries=2
        )

    @property
    def shows_tools(self) -> bool:
        """Native tool calling hands the model the tools itself (see loop.system_prompt)."""
        return self.mode == "native" and not self.meta

    def start(self, bundle: Bundle, task: TaskSpec, seed: int) -> None:
        self.turn = 0

    def _written(self, call: ToolCall) -> tuple[str, JsonObject]:
        """A tool call as the model wrote it: through the meta-tools in meta mode."""
        return to_meta(call) if self.meta else (call.name, call.arguments)

    def _wire(self, view: list[Message]) -> list[ChatCompletionMessageParam]:
        wire: list[ChatCompletionMessageParam] = []
        for m in view:
            if m.role == "system":
                wire.append(
                    {
                        "role": "system",
                        "content": m.content
                        + (META_FORMAT if self.meta else "")
                        + (TEXT_FORMAT if self.mode == "text" else ""),
                    }
                )
            elif m.role == "assistant" and m.tool_calls and self.mode == "native":
                wire.append(
                    {
                        "role": "assistant",
                        "content": m.content or None,
                        "tool_calls": [self._native_call(c) for c in m.tool_calls],
                    }
                )
            elif m.role == "assistant" and m.tool_calls:
                blocks = "".join(
                    f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
                    for c in m.tool_calls
                    for name, arguments in [self._written(c)]
                )
                wire.append({"role": "assistant", "content": (m.content + "\n" if m.content else "") + blocks})
            elif m.role == "tool" and self.mode == "text":
                wire.append({"role": "user", "content": f"<tool_response>{m.content}</tool_response>"})
            elif m.role == "tool":  # the loop answers every call by its id (policies.tool_message)
                wire.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content})
            elif m.role == "user":
                wire.append({"role": "user", "content": m.content})
            else:
                wire.append({"role": "assistant", "content": m.content})
        return wire

    def _native_call(self, call: ToolCall) -> ChatCompletionMessageFunctionToolCallParam:
        name, arguments = self._written(call)
        return {"id": call.id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}

    @staticmethod
    def _tool(schema: ToolSchemaJson) -> ChatCompletionFunctionToolParam:
        """A tool schema as the `tools` parameter takes it."""
        parameters: dict[str, object] = dict(schema["parameters"])  # the SDK's FunctionParameters
        return {
            "type": "function",
            "function": {"name": schema["name"], "description": schema["description"], "parameters": parameters},
        }

    def act(self, view: list[Message], tools: list[ToolSchemaJson]) -> PolicyTurn:
        self.turn += 1
        offered = (
            [self._tool(t) for t in (META_TOOLS if self.meta else tools)] if self.mode == "native" else openai.omit
        )
        started = time.perf_counter()
        try:
            response = self.client.chat.completions.create(
                model=self.model,
                messages=self._wire(view),
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                tools=offered,
            )
        except openai.APIError as exc:  # the infrastructure's failure ends the run; any other is the agent's
            failure = endpoint_failure(exc, self.model)
            if failure is not None:
                raise failure from exc
            raise
        seconds = time.perf_counter() - started
        usage = response.usage
        tokens_in, tokens_out = (usage.prompt_tokens, usage.completion_tokens) if usage else (0, 0)
        message = response.choices[0].message
        content = message.content or ""
        if self.mode == "text":
            calls, problem = parse_text_calls(content, self.turn)
            content = _TOOL_CALL.sub("", content).strip()
        else:
            calls, problem = self._native_calls(message.tool_calls or [])
        if problem is None and self.meta:
            unwrapped = [from_meta(c) for c in calls]
            problem = next((p for _, p in unwrapped if p), None)
            calls = [c for c, _ in unwrapped if c is not None]
        if problem:
            return PolicyTurn(format_error=problem, tokens_in=tokens_in, tokens_out=tokens_out, seconds=seconds)
        return PolicyTurn(
            message=Message(role="assistant", content=content, tool_calls=calls),
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            seconds=seconds,
        )

    @staticmethod
    def _native_calls(natives: list[Any]) -> tuple[list[ToolCall], str | None]:
        calls = []
        for native in natives:
            try:
                arguments = json.loads(native.function.arguments or "{}")
            except json.JSONDecodeError as exc:
                return [], f"arguments of {native.function.name} are not valid JSON: {exc.msg}"
            if not isinstance(arguments, dict):
                return [], f"arguments of {native.function.name} must be a JSON object"
            calls.append(ToolCall(id=native.id, name=native.function.name, arguments=arguments))
        return calls, None
