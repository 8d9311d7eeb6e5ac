"""Whether a model endpoint can answer, checked once before a run: the one mechanism behind the
preflight of `generate --backend openai`, `eval` (a policy's endpoint) and `train` with a judge.

An endpoint is named by `Endpoint`: who it is for, its URL, key and model, and the settings that set
each. `check_endpoint` asks its model listing (GET /models) once: an endpoint that cannot be reached,
a refused key, or a listing without the model is an `EndpointUnavailable` whose one line names the URL
and the setting to fix; an endpoint without a listing (404) passes, as its first call then tells.
`endpoint_problem` words an openai client error the same way, for a failure while a run goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from worldsmith.failures import UserFixable

PREFLIGHT_TIMEOUT_S = 10.0
#: The served models named in a refusal at most.
LISTED = 5


class EndpointUnavailable(UserFixable):
    """A model endpoint that cannot answer (down, key refused, no such model); the message names the fix."""

    exit_code = 1


@dataclass(frozen=True)
class Endpoint:
    """A model endpoint as a run uses it: `who` it is for ("the model endpoint"), its base URL (None: the
    OpenAI API), key and model, and the setting (an environment variable or an option) of each."""

    who: str
    base_url: str | None
    api_key: str | None = field(repr=False)
    model: str
    base_url_setting: str = "WORLDSMITH_LLM_BASE_URL"
    key_setting: str = "WORLDSMITH_LLM_API_KEY"
    model_setting: str = "WORLDSMITH_LLM_MODEL"

    @property
    def url(self) -> str:
        return (self.base_url or "https://api.openai.com/v1").rstrip("/")


def endpoint_problem(exc: BaseException, endpoint: Endpoint) -> str | None:
    """The one line (naming the URL and the setting to fix) for an openai client error that is the
    endpoint's failure (connection, timeout, key, missing model, server error), else None."""
    import openai

    who, url = endpoint.who, endpoint.url
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
        fix = f"set {endpoint.key_setting} to a valid key" if endpoint.api_key else f"{endpoint.key_setting} is not set"
        return f"{who} {url} refused the API key (HTTP {exc.status_code}): {fix}"
    if isinstance(exc, openai.NotFoundError):
        return (
            f"{who} {url} has no model {endpoint.model!r} (HTTP 404): check {endpoint.model_setting} "
            f"and {endpoint.base_url_setting}"
        )
    if isinstance(exc, openai.APIConnectionError):  # includes timeouts
        return f"{who} {url} cannot be reached ({type(exc).__name__}): start it or set {endpoint.base_url_setting}"
    if isinstance(exc, openai.InternalServerError | openai.RateLimitError):
        return f"{who} {url} keeps failing (HTTP {exc.status_code}): retry later"
    return None


def check_endpoint(endpoint: Endpoint) -> None:
    """Raise EndpointUnavailable naming the fix when `endpoint` cannot answer: one GET of its model
    listing (reachable, key accepted, model served); nothing is generated. An endpoint with neither a
    base URL nor a key is refused without a request (the OpenAI API would refuse it)."""
    import openai

    if endpoint.base_url is None and not endpoint.api_key:
        raise EndpointUnavailable(
            f"{endpoint.who} is not set: set {endpoint.base_url_setting} (an OpenAI-compatible endpoint) "
            f"or {endpoint.key_setting} (the OpenAI API)"
        )
    client = openai.OpenAI(
        base_url=endpoint.base_url,
        api_key=endpoint.api_key or "not-needed",
        timeout=PREFLIGHT_TIMEOUT_S,
        max_retries=1,
    )
    try:
        served = [model.id for model in client.models.list()]
    except openai.NotFoundError:  # no model listing: reachable, and that is what can be known
        return
    except openai.APIError as exc:
        problem = endpoint_problem(exc, endpoint)
        if problem is None:
            raise
        raise EndpointUnavailable(problem) from None
    if served and endpoint.model not in served:
        shown = ", ".join(served[:LISTED]) + (f" and {len(served) - LISTED} more" if len(served) > LISTED else "")
        raise EndpointUnavailable(
            f"{endpoint.who} {endpoint.url} serves no model {endpoint.model!r} (it serves {shown}): "
            f"check {endpoint.model_setting}"
        )


def configured_endpoint(who: str, model: str | None = None, model_setting: str = "WORLDSMITH_LLM_MODEL") -> Endpoint:
    """The endpoint of the settings (WORLDSMITH_LLM_*) for `who`, asking for `model` (default WORLDSMITH_LLM_MODEL)."""
    from worldsmith.settings import get_settings

    settings = get_settings()
    return Endpoint(
        who, settings.llm_base_url, settings.llm_key(), model or settings.llm_model, model_setting=model_setting
    )
