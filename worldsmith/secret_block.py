"""The model key in a Prefect Secret block (`llm_api_key_block`): the one place below the flows where
Prefect is imported (inside the functions), so that settings.py itself never reaches Prefect; the
sandbox runtime reads settings and must not (tests/test_layers.py)."""

from __future__ import annotations

from worldsmith.failures import UserFixable


def prefect_api_url() -> str:
    """The Prefect API that Secret blocks live on (Prefect imported here); UserFixable (exit 1) when none is
    configured: a temporary server's blocks would be out of reach of every worker."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        raise UserFixable(
            "Prefect Secret blocks need a Prefect server: start one with `worldsmith up` or set PREFECT_API_URL",
            exit_code=1,
        )
    return url


def read_secret_block(name: str) -> str:
    """The value of the Prefect Secret block `name` on the configured Prefect API (Prefect imported here).
    A missing block is refused (exit 2), no API or an unreachable one is a failure (exit 1), in one line."""
    from prefect.blocks.system import Secret

    prefect_api_url()
    try:
        # _sync=True (async_dispatch's switch, which prefect's types do not know) returns the block itself
        value = Secret.load(name, _sync=True).get()  # type: ignore[call-arg, union-attr]
    except ValueError:
        raise UserFixable(
            f"there is no Prefect Secret block {name!r} (llm_api_key_block): create it with "
            f"`worldsmith config set-secret {name}` or name another"
        ) from None
    except Exception as exc:  # the API unreachable, refusing...: what Prefect says, on one line
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise UserFixable(
            f"cannot read the Prefect Secret block {name!r}: {reason}; check PREFECT_API_URL", exit_code=1
        ) from None
    return str(value)
