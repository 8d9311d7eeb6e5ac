"""How a generator call can fail. Stdlib only.

Every fault has a `kind` (its class in the stage-attempt records, counted by the dashboard) and a
`fatal` flag: a fatal fault is run-wide (the endpoint's settings are wrong, so every call fails the
same way) and stops the whole run instead of failing one world.

- OutputFault (invalid_json, schema_mismatch, truncated, empty_choices, refusal, content_filter): the
  stage's repair loop feeds it back to the model and tries again;
- RequestFault (context_length, bad_request): the stage fails at once (the same request fails again);
- EndpointConfigFault (not_found) and EndpointAuthFault (auth): fatal, the run stops;
- TransientFault (transient): raised for Prefect to retry the stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worldsmith.errors import WorldsmithError

if TYPE_CHECKING:
    from worldsmith.llm.backend import Usage
    from worldsmith.llm.looks import Look


class GenerationFault(WorldsmithError):
    """A generator call that produced nothing usable. `kind` names why; `text` is the raw output
    (if any), fed back to the model in the next attempt of the stage's repair loop."""

    kind = "fault"
    #: Run-wide: every call of the run would fail the same way, so the run stops (no retries).
    fatal = False

    def __init__(self, message: str, *, text: str = "", kind: str | None = None):
        super().__init__(message)
        self.text = text
        if kind is not None:
            self.kind = kind
        #: What the call spent before it failed (None: nothing known), set by the backend that raised it.
        self.usage: Usage | None = None
        #: The looks the model made in the failed call (llm/looks.py), in order.
        self.looks: list[Look] = []


class OutputFault(GenerationFault):
    """The model answered, but not with what was asked. Kinds: invalid_json (no parseable JSON object),
    schema_mismatch (JSON that does not validate), truncated (cut off: finish_reason=length or an
    unterminated JSON), empty_choices (no answer at all), refusal and content_filter (the model's or
    the endpoint's refusal; `text` keeps what the model said)."""

    kind = "invalid_json"


class RequestFault(GenerationFault):
    """The endpoint rejected the request itself (HTTP 4xx): asking again the same way fails again, so
    it is neither retried nor repaired. Kinds: context_length (the prompt and `max_tokens` exceed the
    model's context), bad_request (any other rejection)."""

    kind = "bad_request"


class EndpointConfigFault(RequestFault):
    """The endpoint's settings are wrong (HTTP 404: no such model or path): fatal; the message names
    the setting to fix."""

    kind = "not_found"
    fatal = True


class EndpointAuthFault(EndpointConfigFault):
    """The endpoint refused the API key (HTTP 401 or 403): fatal, never retried; the message names the
    setting to fix."""

    kind = "auth"


class TransientFault(GenerationFault):
    """The endpoint failed (429, 5xx, timeout, connection) and kept failing through the retries."""

    kind = "transient"
