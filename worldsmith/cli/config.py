"""`worldsmith config show | set-secret`: the settings in force and where each comes from, and the
model endpoint's key stored as a Prefect Secret block (worldsmith/settings.py has the rules)."""

from __future__ import annotations

import json
import re
import sys
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import typer
from pydantic import SecretStr
from rich.table import Table
from rich.text import Text

from worldsmith.cli.console import console, failure, say
from worldsmith.secret_block import prefect_api_url
from worldsmith.settings import (
    CONFIG_FILE_NAME,
    ConfigFile,
    Settings,
    env_name,
    get_settings,
    setting_sources,
)

app = typer.Typer(help="Show the configuration; store the model key as a Prefect Secret block.", no_args_is_help=True)

MASK = "********"
#: Prefect's rule for block names (prefect.types.names).
BLOCK_NAME = re.compile(r"[a-z0-9-]+")


def _masked_url(text: str) -> str:
    """`text` with the password of a URL's user info replaced by MASK (postgresql://u:****@host/db)."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    if not parts.password:
        return text
    netloc = f"{parts.username or ''}:{MASK}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc))


def shown_value(value: Any) -> Any:
    """A setting's value as `config show` prints it: secrets masked, URLs without their passwords, JSON-able."""
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, str):
        return _masked_url(value)
    return json.loads(json.dumps(value, default=str))


def _home_line(settings: Settings, source: str) -> str:
    home = settings.home.resolve()
    state = "exists" if home.is_dir() else "not created yet"
    if settings.home_is_default():
        return f"{home} ({state}; the default: .worldsmith in the working directory, as nothing names a home)"
    return f"{home} ({state}; from {source})"


@app.command("show")
def config_show(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Every setting with its value (secrets masked) and its source.

    The source is `default`, the config file (and its profile's table) or an environment variable;
    the lines above the table say which config file, profile and home are in use."""
    found, settings, sources = ConfigFile.find(), get_settings(), setting_sources()
    searched = [str(path) for path in found.searched]
    rows = [
        {"name": name, "env": env_name(name), "value": shown_value(getattr(settings, name)), "source": sources[name]}
        for name in Settings.model_fields
    ]
    summary = {
        "config_file": str(found.path) if found.path else None,
        "searched": searched,
        "profile": found.profile,
        "home": str(settings.home.resolve()),
        "home_is_default": settings.home_is_default(),
        "settings": rows,
    }
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    if found.path:
        say(f"config file: {found.path}" + (f" (profile {found.profile})" if found.profile else ""), highlight=False)
    else:
        places = ", ".join(searched)
        say(f"config file: none ({CONFIG_FILE_NAME} looked for at {places})", highlight=False)
    say(f"home: {_home_line(settings, sources['home'])}", highlight=False)
    table = Table()
    table.add_column("setting", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("source", no_wrap=True)
    for row in rows:
        value = row["value"]
        text = "" if value is None else value if isinstance(value, str) else json.dumps(value)
        source = row["source"].replace(str(found.path), found.path.name) if found.path else row["source"]
        table.add_row(row["name"], Text(text), Text(source))  # the file by its name: the line above gives its path
    console.print(table)


@app.command("set-secret")
def config_set_secret(
    name: Annotated[str, typer.Argument(help="Name of the block: lowercase letters, digits and dashes.")],
) -> None:
    """Store the model endpoint's API key, read from stdin, as the Prefect Secret block NAME.

    The block goes to the configured Prefect server (PREFECT_API_URL, or the one `worldsmith up`
    started), replacing one of that name; name it in `llm_api_key_block` to use it."""
    if not BLOCK_NAME.fullmatch(name):
        raise failure(f"{name!r} is not a block name: use lowercase letters, digits and dashes")
    if sys.stdin.isatty():
        import getpass

        key = getpass.getpass("API key: ")
    else:
        key = sys.stdin.read()
    key = key.strip()
    if not key:
        raise failure(
            f"no key on stdin: pipe it in, e.g. `printenv OPENAI_API_KEY | worldsmith config set-secret {name}`"
        )
    from prefect.blocks.system import Secret

    api_url = prefect_api_url()
    try:
        # prefect's types know neither a str value (validated as its own Secret) nor async_dispatch's _sync
        Secret(value=key).save(name, overwrite=True, _sync=True)  # type: ignore[arg-type, call-arg]
    except Exception as exc:  # the Prefect API unreachable or refusing: what it says, on one line
        raise failure(f"cannot save the Prefect Secret block {name!r}: {' '.join(str(exc).split())}", code=1) from None
    say(
        f'saved the key as Prefect Secret block {name} at {api_url}; use it with llm_api_key_block = "{name}" in '
        f"{CONFIG_FILE_NAME} or WORLDSMITH_LLM_API_KEY_BLOCK={name}",
        highlight=False,
    )
