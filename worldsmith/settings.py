"""Process-wide settings (pydantic-settings): `WORLDSMITH_*` environment variables over a `worldsmith.toml`.

Where a value comes from, highest first: the environment variable `WORLDSMITH_<NAME>`; the table
`[profiles.<WORLDSMITH_PROFILE>]` of the config file; the config file's top level; the default. The
config file is the one `WORLDSMITH_CONFIG` names, else `./worldsmith.toml`, else
`$XDG_CONFIG_HOME/worldsmith/worldsmith.toml` (`~/.config/...`): the first found, read by
pydantic-settings' TOML source. A relative `home` in the file is relative to the file's directory.

Misspellings are refused rather than ignored: a `WORLDSMITH_*` variable that is not a setting (nor
one of `NOT_SETTINGS`) and a key of the file that is not a setting raise `UserFixable`, one line naming
the closest setting (exit 2 through the CLI's handler), whenever `Settings()` is built. So does a value
that does not validate, naming where it came from.

The model endpoint's key is `llm_api_key`, or the name of a Prefect Secret block in
`llm_api_key_block`, read (Prefect imported) when `Settings.llm_key()` is first called.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from worldsmith.failures import UserFixable

ENV_PREFIX = "WORLDSMITH_"
CONFIG_FILE_NAME = "worldsmith.toml"
#: `WORLDSMITH_*` variables that are not settings: they choose the config file and its profile, or
#: belong to the test suite (tests/conftest.py, tests/kill_after_call, .ci/run).
NOT_SETTINGS = frozenset({"WORLDSMITH_CONFIG", "WORLDSMITH_PROFILE"})
NOT_SETTINGS_PREFIXES = ("WORLDSMITH_TEST_",)
#: The table of the config file that holds the profiles.
PROFILES = "profiles"


def env_name(field: str) -> str:
    """The environment variable of the setting `field` (llm_model -> WORLDSMITH_LLM_MODEL)."""
    return f"{ENV_PREFIX}{field}".upper()


class Settings(BaseSettings):
    """All knobs of a worldsmith installation; every field maps to `WORLDSMITH_<NAME>` and to the key
    `<name>` of worldsmith.toml."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

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
    llm_api_key_block: str | None = Field(
        None, description="Name of a Prefect Secret block holding the API key (instead of llm_api_key)."
    )
    llm_model: str = "gpt-4.1-mini"
    llm_temperature: float = Field(0.7, ge=0, le=2)
    llm_max_tokens: int = Field(8192, ge=1)
    llm_timeout_s: float = Field(120.0, gt=0, description="Timeout of one LLM call.")
    llm_concurrency: int = Field(8, ge=1, description="LLM calls in flight at once, per process.")
    llm_retries: int = Field(5, ge=0, description="Retries of a call on 429, 5xx, timeouts and connection errors.")
    llm_look_protocol: Literal["tools", "text"] = Field(
        "tools",
        description="How the model asks its looks: the chat API's tool calls (the text fallback if the endpoint "
        "refuses them), or ```look blocks in its text.",
    )
    looks_per_attempt: int = Field(
        8, ge=0, description="Looks (SQL queries, tool calls, solution runs) a stage attempt may make; 0: none."
    )
    look_answer_chars: int = Field(4000, ge=200, description="Characters of one look's answer (the rest cut).")
    look_rows: int = Field(30, ge=1, description="Rows of one look's SQL query.")
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
    deep_probe_budget: Literal["full", "quick"] = Field(
        "full",
        description="Deep tool probes: full, or quick (each value of each parameter still, fewer combinations "
        "and invalid calls per tool: for test suites and quick checks).",
    )
    sandbox_call_timeout_s: float = Field(5.0, gt=0, description="Wall-clock limit of one tool or verifier call.")
    sandbox_cpu_s: float = Field(5.0, gt=0, description="CPU seconds one call may use.")
    sandbox_memory_mb: int = Field(
        2048,
        ge=256,
        description="Address-space limit of each worker process, and the memory a worker, its template and its "
        "episode processes (one world's) hold together.",
    )
    sandbox_file_size_mb: int = Field(16, ge=1, description="Largest file a worker may write.")
    sandbox_uid: int = Field(65534, description="Unprivileged uid (and gid) workers drop to when started as root.")
    sandbox_episode_processes: int = Field(
        128,
        ge=1,
        description=(
            "strict isolation: episode processes alive per worker, at most (a few MB each; those serving the parent "
            "directly counted); past it the least recently used idle one goes and its next call forks again. Keep it "
            "at or above the sessions a worker serves."
        ),
    )
    sandbox_spare_processes: int = Field(
        2,
        ge=0,
        le=64,
        description=(
            "strict isolation: processes each worker forks ahead of its episodes (started, database made, confined; "
            "an episode opened afresh takes one, so its first call skips that), counted in "
            "sandbox_episode_processes; 0 forks none."
        ),
    )
    sandbox_first_pages: bool = Field(
        True,
        description=(
            "strict isolation, imported apps: each worker's spares write ahead the pages an episode's first call "
            "writes (learned once per world by a probe that holds no episode), so that call does not copy them; "
            "up to 16 MiB more memory per episode process. false: spares only warm up."
        ),
    )
    sandbox_stand_in_reads: bool = Field(
        True,
        description=(
            "strict isolation, imported apps: each worker's template makes one request to each GET route of the "
            "app (stand-in arguments, a private copy of the world) before it forks any episode's process, so "
            "that an episode's first call finds the web stack's and the ORM's caches filled; only for an app "
            "whose own state a trial shows unchanged by them. false: episodes start from the app as built."
        ),
    )
    sandbox_call_files: int = Field(
        64,
        ge=1,
        description="Files one call may open for writing in its episode's file area (together at most "
        "sandbox_file_size_mb); past it the call is an env_error naming the limit.",
    )
    sandbox_episode_db_growth_mb: int = Field(
        8, ge=0, description="How much an episode's database may grow beyond its world's; past it writes fail."
    )
    sandbox_world_disk_mb: int = Field(
        4096,
        ge=16,
        description="Bytes one worker's episodes (one world's) hold on disk together: databases and file areas.",
    )
    sandbox_world_files: int = Field(
        65536, ge=64, description="Files one worker's episodes (one world's) hold together: databases and file areas."
    )
    sandbox_isolation: Literal["strict", "fast"] = Field(
        "strict",
        description=(
            "strict: every request that runs generated code gets a process of its own, forked from a clean template process; "
            "fast: episodes of one environment share their worker (only for vetted worlds). See docs/security.md."
        ),
    )

    # MCP gateway
    gateway_host: str = "127.0.0.1"
    gateway_port: int = Field(8765, ge=0, le=65535, description="Port of `env serve` (0: any free port, printed).")
    gateway_session_idle_s: float = Field(900.0, gt=0, description="Idle MCP sessions (episodes) expire after this.")
    gateway_max_sessions: int = Field(4096, ge=1, description="Open MCP sessions per environment; more get HTTP 503.")
    gateway_allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names the gateway answers besides localhost, 127.0.0.1, [::1] and its own address (NAME: "
        "any port; NAME:PORT); any other Host or Origin is refused (DNS rebinding).",
    )
    gateway_token_file: Path | None = Field(
        None,
        description="File holding the bearer token gateway callers must send (Authorization: Bearer); unset: none.",
    )
    gateway_world_calls: int = Field(
        32, ge=1, description="Tool calls of one served world running at once (each in a thread); more wait."
    )
    gateway_world_waiting: int = Field(
        1024,
        ge=0,
        description="Tool calls of one served world waiting for a running one; more are refused with an MCP error.",
    )
    gateway_world_control: int = Field(
        8,
        ge=1,
        description="Episodes of one served world opening or closing at once (initialize, session ends, the "
        "first tools/list), in threads of their own: never behind its tool calls.",
    )

    # Operations (docs/operations.md): the local Prefect server of `worldsmith up` and the dashboard
    prefect_port: int = Field(
        4200, ge=1, le=65535, description="Port of the local Prefect server started by `worldsmith up`."
    )
    dashboard_host: str = Field("127.0.0.1", description="Address the dashboard listens on.")
    dashboard_port: int = Field(8780, ge=1, le=65535, description="Port of the dashboard.")
    dashboard_url: str | None = Field(
        None, description="Public URL of the dashboard for links in Prefect artifacts; default http://HOST:PORT."
    )

    _block_key: str | None = PrivateAttr(None)

    @field_validator("home", mode="after")
    @classmethod
    def _expand_user(cls, home: Path) -> Path:
        return home.expanduser()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then the environment (misspelt variables refused), then the config file's layers."""
        refuse_unknown_variables(os.environ)
        return (init_settings, env_settings, *(source for _, source in ConfigFile.find().layers(settings_cls)))

    def llm_key(self) -> str | None:
        """The endpoint's API key as plain text (None when unset): `llm_api_key`, else the value of the
        Prefect Secret block `llm_api_key_block`, read on the first call."""
        if self.llm_api_key:
            return self.llm_api_key.get_secret_value()
        if self.llm_api_key_block and self._block_key is None:
            from worldsmith.secret_block import read_secret_block  # Prefect, only when a block is named

            self._block_key = read_secret_block(self.llm_api_key_block)
        return self._block_key

    def llm_configured(self) -> bool:
        """Whether a model endpoint is configured: a base URL, or a key (or its block) for the OpenAI API."""
        return bool(self.llm_base_url or self.llm_api_key or self.llm_api_key_block)

    def home_is_default(self) -> bool:
        """Whether nothing (environment, config file) named the home: it is ./.worldsmith of the working directory."""
        return "home" not in self.model_fields_set

    def ensure_home(self) -> Path:
        """The home directory, created when missing; creating one at the default place (nothing named a
        home) is said in one line on stderr, so that running elsewhere does not silently start afresh."""
        if not self.home.is_dir():
            self.home.mkdir(parents=True, exist_ok=True)
            if self.home_is_default():
                print(
                    f"created a new WORLDSMITH_HOME at {self.home.resolve()} "
                    f"(set WORLDSMITH_HOME, or home in {CONFIG_FILE_NAME}, to use another)",
                    file=sys.stderr,
                )
        return self.home

    def resolved_store_url(self) -> str:
        return self.store_url or str((self.home / "store").resolve())

    def resolved_catalog_url(self) -> str:
        if self.catalog_url:
            return self.catalog_url
        return f"sqlite:///{(self.ensure_home() / 'catalog.db').resolve()}"

    def resolved_dashboard_url(self) -> str:
        return (self.dashboard_url or f"http://{self.dashboard_host}:{self.dashboard_port}").rstrip("/")

    def worker_count(self) -> int:
        return self.sandbox_workers or max(2, os.cpu_count() or 2)


# -- the config file -----------------------------------------------------------------------------


def _closest(name: str, known: list[str]) -> str:
    """'; did you mean X?' for the known name closest to `name`, or a pointer to the list."""
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else "; `worldsmith config show` lists the settings"


def refuse_unknown_variables(environ: Mapping[str, str]) -> None:
    """Raise UserFixable for the first `WORLDSMITH_*` variable of `environ` that is not a setting."""
    known = [env_name(field) for field in Settings.model_fields]
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(ENV_PREFIX) or upper in NOT_SETTINGS or upper.startswith(NOT_SETTINGS_PREFIXES):
            continue
        if upper not in known:
            raise UserFixable(f"{variable} is not a setting{_closest(upper, known)}")


def _refuse_unknown_keys(table: Mapping[str, Any], where: str) -> None:
    known = list(Settings.model_fields)
    for key in table:
        if key not in known:
            raise UserFixable(f"{where}: {key} is not a setting{_closest(key, known)}")


class _ConfigTable(TomlConfigSettingsSource):
    """One table of a worldsmith.toml (its top level, or `[profiles.NAME]`) as a settings source: the
    TOML source of pydantic-settings, with a relative `home` taken as relative to the file."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path, table: tuple[str, ...] = ()):
        super().__init__(settings_cls, toml_file=path, toml_table_header=table)
        self.path = path

    def __call__(self) -> dict[str, Any]:
        values = {key: value for key, value in super().__call__().items() if key != PROFILES}
        if isinstance(values.get("home"), str):
            values["home"] = self.path.parent / Path(values["home"]).expanduser()
        return values


@dataclass(frozen=True)
class ConfigFile:
    """The worldsmith.toml in use (`path` None: none was found, after looking at `searched`) and the
    profile `WORLDSMITH_PROFILE` selects in it."""

    path: Path | None
    profile: str | None
    searched: tuple[Path, ...]

    @classmethod
    def find(cls, environ: Mapping[str, str] | None = None) -> ConfigFile:
        """The config file `environ` (default os.environ) and the working directory lead to."""
        environ = os.environ if environ is None else environ
        profile = environ.get("WORLDSMITH_PROFILE") or None
        named = environ.get("WORLDSMITH_CONFIG")
        if named:
            path = Path(named).expanduser().resolve()
            if not path.is_file():
                raise UserFixable(
                    f"WORLDSMITH_CONFIG names {path}, which is not a file: create it or unset the variable"
                )
            return cls(path, profile, (path,))
        config_home = Path(environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        searched = (Path.cwd() / CONFIG_FILE_NAME, config_home / "worldsmith" / CONFIG_FILE_NAME)
        found = next((path.resolve() for path in searched if path.is_file()), None)
        if found is None and profile:
            places = " and ".join(map(str, searched))
            raise UserFixable(f"WORLDSMITH_PROFILE={profile} but there is no {CONFIG_FILE_NAME} ({places}): unset it")
        return cls(found, profile, searched)

    def label(self, profile: bool = False) -> str:
        """How `config show` names this file, or its profile's table."""
        return f"{self.path} [{PROFILES}.{self.profile}]" if profile else str(self.path)

    def layers(self, settings_cls: type[BaseSettings]) -> list[tuple[str, PydanticBaseSettingsSource]]:
        """The file's sources, highest first, each with its label: the profile's table, then the top level.
        Raises UserFixable for a file that is not TOML, a key that is not a setting, or a missing profile."""
        if self.path is None:
            return []
        import tomllib

        try:
            top = _ConfigTable(settings_cls, self.path)
        except tomllib.TOMLDecodeError as exc:
            raise UserFixable(f"{self.path} is not valid TOML: {exc}") from None
        data = top.toml_data
        profiles = data.get(PROFILES, {})
        if not isinstance(profiles, dict) or not all(isinstance(table, dict) for table in profiles.values()):
            raise UserFixable(f"{self.path}: {PROFILES} must hold tables, e.g. [{PROFILES}.gpu]")
        _refuse_unknown_keys({key: value for key, value in data.items() if key != PROFILES}, str(self.path))
        for name, table in profiles.items():
            _refuse_unknown_keys(table, f"{self.path} [{PROFILES}.{name}]")
        if not self.profile:
            return [(self.label(), top)]
        if self.profile not in profiles:
            have = ", ".join(profiles) or "none"
            raise UserFixable(
                f"WORLDSMITH_PROFILE={self.profile}: {self.path} has no [{PROFILES}.{self.profile}] (profiles: {have})"
            )
        return [
            (self.label(profile=True), _ConfigTable(settings_cls, self.path, (PROFILES, self.profile))),
            (self.label(), top),
        ]

    def environment(self) -> dict[str, str]:
        """The variables that make a child process (a worker, a flow run) read this same file and profile."""
        env = {"WORLDSMITH_CONFIG": str(self.path)} if self.path else {}
        return env | ({"WORLDSMITH_PROFILE": self.profile} if self.path and self.profile else {})


# -- where each value comes from -----------------------------------------------------------------

DEFAULT = "default"
ENV = "env"


def _layers() -> list[tuple[str, PydanticBaseSettingsSource]]:
    """The sources of `Settings()` after its arguments, highest first, each with its label."""
    refuse_unknown_variables(os.environ)
    return [(ENV, EnvSettingsSource(Settings)), *ConfigFile.find().layers(Settings)]


def setting_sources() -> dict[str, str]:
    """Where each setting's value comes from: `env WORLDSMITH_<NAME>`, the config file's path (with
    `[profiles.NAME]` for its profile's table) or `default`. Raises what `Settings()` raises."""
    sources: dict[str, str] = {}
    for label, source in _layers():
        for field in source():
            if field in Settings.model_fields:
                sources.setdefault(field, f"{ENV} {env_name(field)}" if label == ENV else label)
    return {field: sources.get(field, DEFAULT) for field in Settings.model_fields}


def _invalid(exc: ValidationError | SettingsError) -> UserFixable:
    """A value that does not validate (or a variable that is not the JSON it must be), as one line
    naming where it was set."""
    if isinstance(exc, SettingsError):
        named = re.search(r'field "(\w+)"', str(exc))
        return UserFixable(f"{env_name(named[1]) if named else exc} is not valid JSON: fix its value")
    error = exc.errors()[0]
    field = str(error["loc"][0]) if error.get("loc") else ""
    source, value = setting_sources().get(field, DEFAULT), error.get("input")
    where = f"{env_name(field)}={value}" if source.startswith(f"{ENV} ") else f"{source}: {field} = {value!r}"
    return UserFixable(f"{where} is invalid: {error['msg']}")


def _key_or_block(settings: Settings) -> Settings:
    """Settings with one of llm_api_key and llm_api_key_block: the one from the higher source; both from
    one source are refused."""
    if not (settings.llm_api_key and settings.llm_api_key_block):
        return settings
    order, sources = [label for label, _ in _layers()], setting_sources()

    def rank(field: str) -> int:
        return order.index(ENV if sources[field].startswith(f"{ENV} ") else sources[field])

    key, block = rank("llm_api_key"), rank("llm_api_key_block")
    if key == block:
        raise UserFixable(
            f"llm_api_key ({sources['llm_api_key']}) and llm_api_key_block ({sources['llm_api_key_block']}) "
            "are both set: keep one"
        )
    return settings.model_copy(update={"llm_api_key_block" if key < block else "llm_api_key": None})


def load_settings() -> Settings:
    """Settings from the environment and the config file, refusing what is misspelt or invalid in one line."""
    try:
        settings = Settings()
    except (ValidationError, SettingsError) as exc:
        raise _invalid(exc) from None
    return _key_or_block(settings)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process (read once)."""
    return load_settings()
