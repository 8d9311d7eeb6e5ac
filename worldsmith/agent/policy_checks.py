"""Whether a policy's model can answer at all, checked before a run and while it runs.

An endpoint that cannot be reached, a refused key or a model path that holds no model is the
infrastructure's failure, not the agent's: `preflight` finds it before a run starts, and a policy
whose endpoint fails that way mid-run raises `PolicyUnavailable`, which ends the run (the episode
is never scored as `agent_error`)."""

from __future__ import annotations

from pathlib import Path

from worldsmith.llm.endpoint_check import (
    Endpoint,
    EndpointUnavailable,
    check_endpoint,
    configured_endpoint,
    endpoint_problem,
)


class PolicyUnavailable(EndpointUnavailable):
    """The policy's model cannot answer (endpoint down, key refused, no such model); the message names the fix."""


def policy_endpoint(model: str) -> Endpoint:
    """The configured endpoint (WORLDSMITH_LLM_*) as policy `openai:<model>` uses it."""
    return configured_endpoint("the policy endpoint", model, model_setting="the model of --policy")


def endpoint_failure(exc: BaseException, model: str) -> PolicyUnavailable | None:
    """`exc` of the openai client as PolicyUnavailable when it is the infrastructure's failure
    (connection, timeout, key, missing model, server error after the client's retries), else None."""
    problem = endpoint_problem(exc, policy_endpoint(model))
    return None if problem is None else PolicyUnavailable(problem)


def _check_endpoint(model: str) -> None:
    try:
        check_endpoint(policy_endpoint(model))
    except EndpointUnavailable as exc:
        raise PolicyUnavailable(str(exc)) from None


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
