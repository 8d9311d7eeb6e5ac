"""Whether a policy's model can answer at all, checked before a run and while it runs.

An endpoint that cannot be reached, a refused key or a model path that holds no model is the
infrastructure's failure, not the agent's: `preflight` finds it before a run starts, and a policy
whose endpoint fails that way mid-run raises `PolicyUnavailable`, which ends the run (the episode
is never scored as `agent_error`)."""

from __future__ import annotations

from pathlib import Path

from worldsmith.failures import UserFixable
from worldsmith.settings import get_settings

PREFLIGHT_TIMEOUT_S = 10.0


class PolicyUnavailable(UserFixable):
    """The policy's model cannot answer (endpoint down, key refused, no such model); the message names the fix."""

    exit_code = 1


def endpoint_failure(exc: BaseException, model: str) -> PolicyUnavailable | None:
    """`exc` of the openai client as PolicyUnavailable when it is the infrastructure's failure
    (connection, timeout, key, missing model, server error after the client's retries), else None."""
    import openai

    base_url = get_settings().llm_base_url or "the OpenAI API"
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
        return PolicyUnavailable(f"the policy endpoint {base_url} refused the API key; set WORLDSMITH_LLM_API_KEY")
    if isinstance(exc, openai.NotFoundError):
        return PolicyUnavailable(f"the policy endpoint {base_url} has no model {model!r}; check the model name")
    if isinstance(exc, openai.APIConnectionError):  # includes timeouts
        return PolicyUnavailable(
            f"the policy endpoint {base_url} cannot be reached ({type(exc).__name__}); "
            "start it or set WORLDSMITH_LLM_BASE_URL"
        )
    if isinstance(exc, openai.InternalServerError | openai.RateLimitError):
        return PolicyUnavailable(f"the policy endpoint {base_url} keeps failing ({exc.status_code}); retry later")
    return None


def _check_endpoint(model: str) -> None:
    import openai

    settings = get_settings()
    client = openai.OpenAI(
        base_url=settings.llm_base_url,
        api_key=settings.llm_key() or "not-needed",
        timeout=PREFLIGHT_TIMEOUT_S,
        max_retries=1,
    )
    try:
        client.models.list()
    except openai.NotFoundError:  # an endpoint without a model listing: reachable, and that is what we can know
        return
    except openai.APIError as exc:
        failure = endpoint_failure(exc, model)
        if failure is not None:
            raise failure from None


def _looks_like_path(target: str) -> bool:
    return target.startswith(("/", ".", "~")) or target.count("/") > 1


def _check_local_model(target: str) -> None:
    path = Path(target).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise PolicyUnavailable(f"hf policy: {path} holds no model (no config.json); give a model directory")
        return
    cached = None
    if not _looks_like_path(target):  # a model id: only the local Hugging Face cache counts (never downloaded)
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(target, "config.json")
        except ValueError:  # not a valid model id
            cached = None
    if not isinstance(cached, str):
        raise PolicyUnavailable(
            f"hf policy: no model at {target} (a local directory with config.json, or a model id "
            "in the local Hugging Face cache)"
        )


def preflight(spec: str) -> None:
    """Raise PolicyUnavailable naming the fix when the model of policy `spec` cannot answer; a cheap
    check (the endpoint's model listing, a local model's config.json), nothing is loaded."""
    kind, _, target = spec.partition(":")
    if kind == "openai" and target:
        _check_endpoint(target)
    elif kind == "hf" and target:
        _check_local_model(target)
