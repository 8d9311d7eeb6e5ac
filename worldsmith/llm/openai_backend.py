"""The `openai` generator backend: any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM,
SGLang, Ollama, gateways) through the `openai` SDK.

Structured output: the spec's JSON Schema as `response_format` (falling back to JSON mode, with
the schema in the prompt, on endpoints that refuse it), then repair of near-JSON and validation
by the pydantic spec. Transient faults (429 honouring Retry-After, 5xx, timeouts, connection
errors) are retried with backoff by tenacity; every retry is recorded in the call's usage.

Every other failure is one `GenerationFault` with its kind (llm/errors.py), never retried here: a
401/403 is an `EndpointAuthFault` naming the API-key setting, a 404 an `EndpointConfigFault`, a
context-length rejection a `RequestFault` of kind context_length; an answer without choices, a
refusal, a content-filter stop or an answer cut off (finish_reason=length, or JSON left unterminated
whatever the finish reason) an `OutputFault` of that kind, with the model's text kept.

Looks (llm/looks.py): a prompt that offers them is a conversation. The looks go out as the request's
`tools` (the chat API's tool calls), their answers back as `tool` messages; an endpoint that refuses
`tools` (HTTP 400 naming them), or the setting `llm_look_protocol=text`, switches to the text fallback:
no `tools`, no response format while looks are left (the schema in the prompt), the model's ```look blocks
answered in a user message. Looks in the text are answered in either mode. Each request of the conversation
is one completion as above; the looks made are kept in the generation (or the fault) and bounded by the
offer's budget: once it is spent the request says `tool_choice: none` (the text fallback: a response
format again), and a model that keeps looking past it fails the attempt (`too_many_looks`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, NotRequired, TypedDict

import openai
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from openai.types.chat.completion_create_params import ResponseFormat
from pydantic import BaseModel
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from worldsmith.llm.backend import Generation, Prompt, Spec, Usage, decode
from worldsmith.llm.errors import (
    EndpointAuthFault,
    EndpointConfigFault,
    GenerationFault,
    OutputFault,
    RequestFault,
    TransientFault,
)
from worldsmith.llm.looks import (
    MAX_REFUSED_LOOKS,
    LookSession,
    chat_tools,
    instructions,
    parse_arguments,
    text_answers,
    text_looks,
)
from worldsmith.settings import Settings, get_settings

MAX_RETRY_AFTER_S = 60.0
#: How endpoints (OpenAI, vLLM, SGLang, Ollama, gateways) word a prompt that does not fit the context.
CONTEXT_LENGTH = re.compile(
    r"context[ _]length|context window|maximum context|too many tokens|prompt is too long|input is too long"
    r"|reduce the length",
    re.IGNORECASE,
)


def setting_name(field: str) -> str:
    """The environment variable of the `Settings` field `field` (e.g. WORLDSMITH_LLM_API_KEY)."""
    return f"{Settings.model_config.get('env_prefix', '')}{field}".upper()


def _is_transient(exc: BaseException) -> bool:
    if isinstance(
        exc, (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError)
    ):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return False


def _retry_after(exc: BaseException | None) -> float | None:
    response = getattr(exc, "response", None)
    if response is None:
        return None
    value = response.headers.get("retry-after")
    try:
        return min(float(value), MAX_RETRY_AFTER_S) if value is not None else None
    except ValueError:
        return None


def _waiter(initial_s: float) -> Callable[[RetryCallState], float]:
    backoff = wait_exponential_jitter(initial=initial_s, max=30)

    def wait(state: RetryCallState) -> float:
        """Retry-After when the endpoint says how long, else exponential backoff with jitter."""
        exc = state.outcome.exception() if state.outcome else None
        given = _retry_after(exc)
        return given if given is not None else backoff(state)

    return wait


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    return f"{type(exc).__name__}" + (f" (HTTP {status})" if status else "") + f": {str(exc)[:200]}"


class ChatRequest(TypedDict):
    """The keyword arguments of one chat-completions request (the SDK's own types)."""

    model: str
    temperature: float
    max_tokens: int
    response_format: NotRequired[ResponseFormat]
    messages: list[ChatCompletionMessageParam]
    tools: NotRequired[list[ChatCompletionToolParam]]
    tool_choice: NotRequired[Literal["none"]]


class OpenAIGenerator:
    """Generate pydantic specs with an OpenAI-compatible chat model."""

    backend = "openai"

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float = 0.7,
        max_tokens: int = 8192,
        timeout_s: float = 120.0,
        concurrency: int = 8,
        retries: int = 5,
        prices: dict[str, dict[str, float]] | None = None,
        backoff_s: float = 0.5,
        look_protocol: str = "tools",
    ):
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.retries = retries
        self.prices = prices or {}
        self._wait = _waiter(backoff_s)
        self._key_set = bool(api_key)
        self.client = openai.OpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout_s, max_retries=0
        )
        self._slots = threading.BoundedSemaphore(concurrency)
        self._schema_mode = True  # JSON-schema response_format until the endpoint refuses it
        self._tool_calls = look_protocol == "tools"  # looks as tool calls until the endpoint refuses `tools`

    @classmethod
    def from_settings(cls, settings: Settings | None = None, *, model: str | None = None) -> OpenAIGenerator:
        s = settings or get_settings()
        return cls(
            model=model or s.llm_model,
            base_url=s.llm_base_url,
            api_key=s.llm_key(),
            temperature=s.llm_temperature,
            max_tokens=s.llm_max_tokens,
            timeout_s=s.llm_timeout_s,
            concurrency=s.llm_concurrency,
            retries=s.llm_retries,
            prices=s.llm_prices,
            look_protocol=s.llm_look_protocol,
        )

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        price = self.prices.get(self.model, {})
        return tokens_in / 1e6 * price.get("input", 0.0) + tokens_out / 1e6 * price.get("output", 0.0)

    def _request(
        self,
        prompt: Prompt,
        spec: type[BaseModel],
        conversation: list[ChatCompletionMessageParam] | None = None,
        looking: LookSession | None = None,
    ) -> ChatRequest:
        """The request of `prompt` (and the `conversation` of its looks so far): the response format, and while
        looks are left either the looks as `tools` or, in the text fallback, free text (the schema in the prompt)."""
        schema = spec.model_json_schema()
        system = prompt.system
        looks_left = looking is not None and looking.left > 0
        if looking is not None:
            system += instructions(looking.offer, self._tool_calls)
        request: ChatRequest = {
            "model": self.model,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "messages": [],
        }
        if looks_left and not self._tool_calls:  # look blocks or the answer: no response format binds the text
            system += "\n\nThe answer: one JSON object matching this JSON Schema:\n" + json.dumps(schema)
        elif self._schema_mode:
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": spec.__name__, "schema": schema, "strict": False},
            }
        else:
            request["response_format"] = {"type": "json_object"}
            system += "\n\nAnswer with one JSON object matching this JSON Schema:\n" + json.dumps(schema)
        if looking is not None and self._tool_calls:  # the same tools all along; none callable once spent
            request["tools"] = chat_tools(looking.offer)  # type: ignore[typeddict-item]
            if not looks_left:
                request["tool_choice"] = "none"
        request["messages"] = [
            {"role": "system", "content": system},
            {"role": "user", "content": prompt.user},
            *(conversation or []),
        ]
        return request

    def _rejected(
        self, exc: openai.APIStatusError, model: str | None = None, model_field: str = "llm_model"
    ) -> GenerationFault:
        """The fault an HTTP error that is not transient stands for (see the module's docstring); `model`
        (default the chat model) is the one asked for, set by the Settings field `model_field`."""
        status, where, model = exc.status_code, f"{self.client.base_url}".rstrip("/"), model or self.model
        key = setting_name("llm_api_key")
        if status in (401, 403):
            fix = f"set {key} to a valid key" if self._key_set else f"{key} is not set: set it"
            return EndpointAuthFault(
                f"the endpoint {where} refused the API key for model {model!r} (HTTP {status}): {fix}"
            )
        if status == 413 or CONTEXT_LENGTH.search(f"{exc.code or ''} {exc}"):
            return RequestFault(
                f"the prompt and max_tokens={self.max_tokens} do not fit the model's context: {_describe(exc)}",
                kind="context_length",
            )
        if status == 404:
            return EndpointConfigFault(
                f"the endpoint {where} has no model {model!r} (HTTP 404): check {setting_name(model_field)} "
                f"and {setting_name('llm_base_url')}"
            )
        return RequestFault(f"the endpoint rejected the request: {_describe(exc)}")

    def _complete(
        self,
        prompt: Prompt,
        spec: type[BaseModel],
        usage: Usage,
        conversation: list[ChatCompletionMessageParam] | None = None,
        looking: LookSession | None = None,
    ) -> Any:
        """One chat completion, retried on transient faults; falls back to JSON mode once if refused, and to
        the text fallback of looks once if `tools` are refused; any other HTTP error is the GenerationFault
        it stands for."""

        def attempt() -> Any:
            with self._slots:
                started = time.perf_counter()
                usage.calls += 1
                try:
                    return self.client.chat.completions.create(**self._request(prompt, spec, conversation, looking))
                finally:
                    usage.seconds += time.perf_counter() - started

        def record(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            assert exc is not None  # called after an attempt that raised a transient fault
            usage.retries.append(_describe(exc))

        retrying = Retrying(
            stop=stop_after_attempt(self.retries + 1),
            wait=self._wait,
            retry=retry_if_exception(_is_transient),
            before_sleep=record,
            reraise=True,
        )
        try:
            return retrying(attempt)
        except Exception as exc:
            if _is_transient(exc):
                raise TransientFault(f"{usage.calls} attempts failed; last: {_describe(exc)}") from exc
            if not isinstance(exc, openai.APIStatusError):
                raise
            fault = self._rejected(exc)
            refused = str(exc).lower() if fault.kind == "bad_request" else ""
            if self._schema_mode and "response_format" in refused:
                self._schema_mode = False
                return self._complete(prompt, spec, usage, conversation, looking)
            if looking is not None and self._tool_calls and "tool" in refused:
                self._tool_calls = False
                return self._complete(prompt, spec, usage, conversation, looking)
            raise fault from exc

    def embed(self, texts: list[str], model: str) -> list[list[float]]:
        """Embeddings of `texts` from the endpoint's embeddings API (retried like completions)."""
        retrying = Retrying(
            stop=stop_after_attempt(self.retries + 1),
            wait=self._wait,
            retry=retry_if_exception(_is_transient),
            reraise=True,
        )

        def call() -> list[list[float]]:
            with self._slots:
                response = self.client.embeddings.create(model=model, input=texts)
            return [item.embedding for item in sorted(response.data, key=lambda d: d.index)]

        try:
            return retrying(call)
        except Exception as exc:
            if _is_transient(exc):
                raise TransientFault(f"embeddings failed: {_describe(exc)}") from exc
            if isinstance(exc, openai.APIStatusError):
                raise self._rejected(exc, model, "llm_embeddings_model") from exc
            raise

    def generate(self, prompt: Prompt, spec: type[Spec]) -> Generation[Spec]:
        """A valid `spec` for `prompt`, or a GenerationFault of its kind with the call's usage in `fault.usage`
        (and the looks made in `fault.looks`). A prompt offering looks is a conversation: the model's looks
        answered until it answers (see the module docstring)."""
        usage = Usage()
        looking = LookSession(prompt.looks) if prompt.looks is not None else None
        conversation: list[ChatCompletionMessageParam] = []
        try:
            while True:
                response = self._complete(prompt, spec, usage, conversation, looking)
                if response.usage is not None:
                    usage.tokens_in += response.usage.prompt_tokens or 0
                    usage.tokens_out += response.usage.completion_tokens or 0
                usage.cost_usd = self.cost(usage.tokens_in, usage.tokens_out)
                if looking is not None and self._looked(response, looking, conversation):
                    continue
                text = self._answer(response)
                return Generation(decode(text, spec, usage), usage, text, looking.looks if looking else [])
        except GenerationFault as fault:
            fault.usage = usage
            fault.looks = looking.looks if looking else []
            raise

    def _looked(self, response: Any, looking: LookSession, conversation: list[ChatCompletionMessageParam]) -> bool:
        """Whether `response` asks for looks (tool calls, or ```look blocks in its text): if so, they are
        answered and the exchange added to `conversation`; an OutputFault once the model kept looking past
        its budget MAX_REFUSED_LOOKS times."""
        message = response.choices[0].message if response.choices else None
        if message is None:
            return False
        calls = [c for c in message.tool_calls or [] if getattr(c, "function", None) is not None]
        text = message.content or ""
        if calls:
            conversation.append(
                {
                    "role": "assistant",
                    "content": text or None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments},
                        }
                        for c in calls
                    ],
                }
            )
            for c in calls:
                answer = looking.take(c.function.name, parse_arguments(c.function.arguments), "tool_call")
                conversation.append({"role": "tool", "tool_call_id": c.id, "content": answer})
        else:
            asked = text_looks(text)
            if not asked:
                return False
            answers = [(kind, looking.take(kind, arguments, "text")) for kind, arguments in asked]
            conversation += [{"role": "assistant", "content": text}, {"role": "user", "content": text_answers(answers)}]
        if looking.past_budget >= MAX_REFUSED_LOOKS:
            raise OutputFault(
                f"the model kept looking after its {looking.offer.budget.looks} looks instead of answering",
                text=text,
                kind="too_many_looks",
            )
        return True

    def _answer(self, response: Any) -> str:
        """The text of the response's first choice; an OutputFault when there is none, the model refused,
        the content filter stopped it or it hit max_tokens."""
        if not response.choices:
            raise OutputFault("the endpoint answered with an empty `choices` list (no answer)", kind="empty_choices")
        choice = response.choices[0]
        message = choice.message
        text = (message.content if message is not None else None) or ""
        refusal = getattr(message, "refusal", None)
        if refusal:
            raise OutputFault(f"the model refused to answer: {refusal}", text=text, kind="refusal")
        if choice.finish_reason == "content_filter":
            raise OutputFault(
                f"the endpoint's content filter stopped the answer (finish_reason=content_filter); "
                f"the model's text: {text or '(none)'}",
                text=text,
                kind="content_filter",
            )
        if choice.finish_reason == "length":
            raise OutputFault(f"output truncated at max_tokens={self.max_tokens}", text=text, kind="truncated")
        return text
