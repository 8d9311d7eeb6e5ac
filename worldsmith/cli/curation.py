"""`worldsmith curate`: an environment set made by the `curate` flow, as its deployment makes one. Its
options are the fields of CurateParameters (worldsmith/tasks/parameters.py), the query's named as
`sets create` names them. The flow imports Prefect, so it is imported when the command runs, after the
inputs are checked."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from worldsmith.cli.config_options import ConfigValues, config_command, options_for
from worldsmith.cli.console import failure, refusals, say
from worldsmith.cli.sets import SET_QUERY_FLAGS
from worldsmith.models.sets import SetQuery
from worldsmith.tasks.parameters import CurateParameters

app = typer.Typer()


def _check(name: str, query: SetQuery) -> None:
    """A one-line answer, before the flow (and Prefect) starts, when set `name` exists from another query
    or the query matches no version."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.publish import CatalogError
    from worldsmith.storage.sets import candidates, get_set, select_members

    with refusals(), open_catalog().session() as session:
        try:
            existing = get_set(session, name)
        except CatalogError:
            existing = None
        if existing is not None:
            if SetQuery.model_validate(existing.query) != query:
                raise failure(
                    f"environment set {name!r} already exists with another query (sets are immutable); "
                    "choose another --name"
                )
            return  # the flow returns the set it made before
        if not select_members(candidates(session, query), query):
            raise failure(
                f"no good environment version matches the query {query.model_dump(exclude_defaults=True)}; "
                "loosen it, or generate or publish environments first (`worldsmith catalog ls` lists them)"
            )


CURATE_OPTIONS = options_for(
    CurateParameters,
    flags={f"query.{name}": SET_QUERY_FLAGS.get(name, f"--{name.replace('_', '-')}") for name in SetQuery.model_fields},
)
"""The set's name, and its query's fields named as `sets create` names them."""


@app.command("curate")
@config_command(CURATE_OPTIONS)
def curate_command(
    fields: ConfigValues,
    as_json: Annotated[bool, typer.Option("--json", help="Print the set's name and members as JSON.")] = False,
) -> None:
    """Curate the catalog's good versions into an environment set with the `curate` flow.

    As the curate deployment does, on the configured Prefect API or a temporary local one; the same
    name and query again returns the set made before. The inputs are checked before Prefect starts."""
    from worldsmith.flows.curate import run_curate

    # a bad value is answered in one line by the root handler (cli/console.AnsweringGroup)
    params = CurateParameters.model_validate(fields)
    _check(params.set_name(), params.query)
    from worldsmith.storage.publish import CatalogError

    with refusals(CatalogError):
        result = run_curate(params, stop_on_signals=True)  # Ctrl-C: one line saying whether the set was made
    if as_json:
        print(json.dumps(result.model_dump(mode="json"), indent=2))
        return
    splits = result.split_counts()
    verb = "created set" if result.created else "set exists from the same query:"
    say(
        f"{verb} {result.name}: {len(result.members)} environment versions ({splits['train']} train, "
        f"{splits['validation']} validation), {result.tasks} tasks",
        highlight=False,
    )
