"""`worldsmith curate`: an environment set made by the `curate` flow, as its deployment makes one.
The flow imports Prefect, so it is imported when the command runs, after the inputs are checked."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from worldsmith.cli.console import failure, refusals, say

app = typer.Typer()


def _check(name: str, query: Any) -> None:
    """A one-line answer, before the flow (and Prefect) starts, when set `name` exists from another query
    or the query matches no version."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.publish import CatalogError
    from worldsmith.storage.sets import SetQuery, candidates, get_set, select_members

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
            raise failure(f"no good environment version matches the query {query.model_dump(exclude_defaults=True)}")


@app.command("curate")
def curate_command(
    name: Annotated[str | None, typer.Option(help="Name of the set (default curated-YYYY-MM-DD, UTC).")] = None,
    category: Annotated[list[str] | None, typer.Option(help="Keep envs with this category (repeatable).")] = None,
    env: Annotated[list[str] | None, typer.Option(help="Keep only this env (repeatable).")] = None,
    count: Annotated[int | None, typer.Option(help="Sample this many envs.")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling and split seed (default 0).")] = None,
    validation_fraction: Annotated[
        float | None, typer.Option(help="Share of envs in the validation split (default 0.1).")
    ] = None,
    min_tasks: Annotated[int | None, typer.Option(help="Minimum tasks per env.")] = None,
    min_tools: Annotated[int | None, typer.Option(help="Minimum tools per env.")] = None,
    require_passed: Annotated[
        list[str] | None,
        typer.Option(help="Quality check that must have passed (repeatable; default expectations and probes)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the set's name and members as JSON.")] = False,
) -> None:
    """Curate the catalog's good versions into an environment set with the `curate` flow.

    As the curate deployment does, on the configured Prefect API or a temporary local one; the same
    name and query again returns the set made before. The inputs are checked before Prefect starts."""
    from worldsmith.flows.curate import CurateParameters, curate
    from worldsmith.storage.sets import SetQuery

    given = {
        "categories": category,
        "env_ids": env,
        "count": count,
        "seed": seed,
        "validation_fraction": validation_fraction,
        "min_tasks": min_tasks,
        "min_tools": min_tools,
        "require_passed": require_passed,
    }
    defaults = CurateParameters().query.model_dump()
    # a bad value is answered in one line by the root handler (cli/console.AnsweringGroup)
    query = SetQuery(**{**defaults, **{k: v for k, v in given.items() if v is not None}})
    params = CurateParameters(name=name, query=query)
    _check(params.set_name(), query)
    from worldsmith.storage.publish import CatalogError

    with refusals(CatalogError):
        result = curate(params)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    members = result["members"]
    splits = {s: sum(1 for m in members if m["split"] == s) for s in ("train", "validation")}
    verb = "created set" if result["created"] else "set exists from the same query:"
    say(
        f"{verb} {result['name']}: {len(members)} environment versions ({splits['train']} train, "
        f"{splits['validation']} validation), {sum(m['tasks'] for m in members)} tasks",
        highlight=False,
    )
