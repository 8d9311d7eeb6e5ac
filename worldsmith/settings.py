"""Process-wide settings, read from `WORLDSMITH_*` environment variables (pydantic-settings)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """All knobs of a worldsmith installation; every field maps to `WORLDSMITH_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="WORLDSMITH_", extra="ignore")

    home: Path = Field(Path(".worldsmith"), description="Directory holding local state.")

    # Artifact store and catalog (docs/architecture.md)
    store_url: str | None = Field(
        None, description="Object store: a directory, file:///path or s3://bucket/prefix; default $HOME/store."
    )
    s3_endpoint_url: str | None = Field(None, description="S3 endpoint for MinIO, R2, Ceph...; default AWS.")
    catalog_url: str | None = Field(
        None, description="SQLAlchemy URL of the catalog; default sqlite:///$HOME/catalog.db."
    )

    # LLM generator (OpenAI-compatible endpoint)
    llm_base_url: str | None = Field(None, description="OpenAI-compatible endpoint; default the OpenAI API.")
    llm_api_key: SecretStr | None = Field(None, description="API key of the endpoint.")
    llm_model: str = "gpt-4.1-mini"
    llm_temperature: float = Field(0.7, ge=0, le=2)
    llm_max_tokens: int = Field(8192, ge=1)
    llm_timeout_s: float = Field(120.0, gt=0, description="Timeout of one LLM call.")
    llm_concurrency: int = Field(8, ge=1, description="LLM calls in flight at once, per process.")
    llm_retries: int = Field(5, ge=0, description="Retries of a call on 429, 5xx, timeouts and connection errors.")
    llm_embeddings_model: str | None = Field(
        None, description="Embeddings model for scenario dedup (same endpoint); unset: TF-IDF."
    )
    llm_prices: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description='USD per million tokens by model, e.g. {"gpt-4.1-mini": {"input": 0.4, "output": 1.6}}.',
    )

    # Flows
    task_runner: Literal["threads", "dask"] = Field(
        "threads", description="How flows fan out: threads here, or a Dask cluster."
    )
    dask_address: str | None = Field(None, description="Scheduler of an existing Dask cluster; unset: a local cluster.")
    dask_workers: int = Field(2, ge=1, description="Worker processes of the local Dask cluster.")

    # Sandbox (see docs/security.md)
    sandbox_workers: int = Field(0, ge=0, description="Worker processes; 0 means one per CPU core (at least 2).")
    sandbox_call_timeout_s: float = Field(5.0, gt=0, description="Wall-clock limit of one tool or verifier call.")
    sandbox_cpu_s: float = Field(5.0, gt=0, description="CPU seconds one call may use.")
    sandbox_memory_mb: int = Field(2048, ge=256, description="Address-space limit of one worker process.")
    sandbox_file_size_mb: int = Field(16, ge=1, description="Largest file a worker may write.")
    sandbox_uid: int = Field(65534, description="Unprivileged uid (and gid) workers drop to when started as root.")
    sandbox_isolation: Literal["strict", "fast"] = Field(
        "strict",
        description=(
            "strict: every request that runs generated code gets a process of its own, forked from a clean worker; "
            "fast: episodes of one environment share their worker (only for vetted worlds). See docs/security.md."
        ),
    )

    # MCP gateway
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8765
    gateway_session_idle_s: float = Field(900.0, gt=0, description="Idle MCP sessions (episodes) expire after this.")
    gateway_max_sessions: int = Field(4096, ge=1, description="Open MCP sessions per environment; more get HTTP 503.")

    # Operations (docs/operations.md): the local Prefect server of `worldsmith up` and the dashboard
    prefect_port: int = Field(
        4200, ge=1, le=65535, description="Port of the local Prefect server started by `worldsmith up`."
    )
    dashboard_host: str = Field("127.0.0.1", description="Address the dashboard listens on.")
    dashboard_port: int = Field(8780, ge=1, le=65535, description="Port of the dashboard.")
    dashboard_url: str | None = Field(
        None, description="Public URL of the dashboard for links in Prefect artifacts; default http://HOST:PORT."
    )

    def llm_key(self) -> str | None:
        """The endpoint's API key as plain text (None when unset)."""
        return self.llm_api_key.get_secret_value() if self.llm_api_key else None

    def resolved_store_url(self) -> str:
        return self.store_url or str((self.home / "store").resolve())

    def resolved_catalog_url(self) -> str:
        if self.catalog_url:
            return self.catalog_url
        self.home.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.home / 'catalog.db').resolve()}"

    def resolved_dashboard_url(self) -> str:
        return (self.dashboard_url or f"http://{self.dashboard_host}:{self.dashboard_port}").rstrip("/")

    def worker_count(self) -> int:
        import os

        return self.sandbox_workers or max(2, os.cpu_count() or 2)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process (read once)."""
    return Settings()
