"""The dashboard web app (Starlette): a front page of charts and tables over the catalog, and drill-down
pages from a night to its runs and stages, a stage's worlds, a world's versions and attempts, one attempt.

Routes: `/` the front page, `/nights/{night}`, `/nights/{night}/stages/{stage}`, `/worlds` (`?status=`),
`/failed-worlds`, `/worlds/{env_id}`, `/attempts/{id}`, `/runs` (`?kind=`, `?status=`: every run with its
status) and `/runs/{kind}/{id}` (one run: how it ended, its error, the stage it died in); every page takes the filters `date_from`,
`date_to`, `run`, `backend`, `category` (and lists `limit`, `offset`), `refresh=SECONDS` reloads it.
The front page also names, once each, what keeps runs that are due from starting (no live worker on a pool).
`/api/summary` the front page's numbers as JSON, `/healthz`, and `/static/plotly.min.js` (served from the
installed plotly package, so the pages need no network). Every page is read from the catalog per request.

The handlers that read the catalog are plain functions: Starlette runs them in its thread pool, so a slow
page never holds the event loop (`/healthz` answers while one renders); the async ones do no blocking work.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import plotly
from jinja2 import Environment, PackageLoader, select_autoescape
from sqlmodel import Session
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse
from starlette.routing import Route

from worldsmith.dashboard import drilldown, runs
from worldsmith.dashboard.charts import all_charts
from worldsmith.dashboard.data import summary
from worldsmith.dashboard.filters import Filters, filter_choices, parse_night
from worldsmith.dashboard.paging import PageRequest
from worldsmith.dashboard.rows import StalledRow
from worldsmith.dashboard.trace import attempt_trace, failing_attempts
from worldsmith.models.runs import RunKind, RunStatus
from worldsmith.stages.order import Stage
from worldsmith.storage.catalog import Catalog, open_catalog
from worldsmith.storage.objectstore import ObjectStore, configured_store
from worldsmith.storage.run_listing import listed_run, recorded_runs

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
_TEMPLATES = Environment(
    loader=PackageLoader("worldsmith.dashboard", "templates"), autoescape=select_autoescape(["html", "j2"])
)
_TEMPLATES.filters["path"] = lambda text: quote(str(text), safe="")


def flow_run_url(prefect_ui_url: str | None, flow_run_id: str | None) -> str | None:
    """The Prefect UI page of a flow run, when both the UI address and the flow run id are known."""
    if not prefect_ui_url or not flow_run_id:
        return None
    return f"{prefect_ui_url.rstrip('/')}/runs/flow-run/{flow_run_id}"


def _filters(request: Request) -> Filters:
    try:
        return Filters.from_query(request.query_params)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


def _page_request(request: Request) -> PageRequest:
    try:
        return PageRequest.from_query(request.query_params)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


def _night(text: str) -> Any:
    try:
        return parse_night(text)
    except ValueError as exc:
        raise HTTPException(404, str(exc)) from None


Choice = TypeVar("Choice", bound=StrEnum)


def _choice(request: Request, name: str, choices: type[Choice], path: bool = False) -> Choice | None:
    """The query parameter (or, `path`, path parameter) `name` as one of `choices`, None when not given;
    400 (404 for a path) naming the choices otherwise."""
    value = (request.path_params if path else request.query_params).get(name) or None
    if value is None:
        return None
    try:
        return choices(value)
    except ValueError:
        raise HTTPException(404 if path else 400, f"{name} is one of: {', '.join(choices)}") from None


def _links(request: Request, filters: Filters) -> dict[str, Callable[..., str]]:
    """Template helpers: `here(**changes)` this page with query parameters changed (None drops one);
    `to(path, **extra)` another page keeping the filters."""

    def here(**changes: Any) -> str:
        params = dict(request.query_params)
        for key, value in changes.items():
            if value is None:
                params.pop(key, None)
            else:
                params[key] = str(value)
        return request.url.path + (f"?{urlencode(params)}" if params else "")

    def to(path: str, **extra: Any) -> str:
        return path + filters.query(**extra)

    return {"here": here, "to": to}


def stalled(prefect_api_url: str | None) -> list[StalledRow] | None:
    """What keeps runs that are due from starting, read from the Prefect API at `prefect_api_url`: each
    problem once (a pool with no live worker, with its fix), with the deployments it holds up whose runs
    are due (waiting, their start passed). A deployment nothing asked to run (a GPU deployment with no GPU
    worker, a schedule's next run) is not named. None when there is no API to ask or it does not answer
    within a second."""
    if not prefect_api_url:
        return None
    from worldsmith.ops.orchestration import due_runs, stalled_deployments

    found = stalled_deployments(prefect_api_url, timeout_s=1.0)
    if not found:
        return None if found is None else []
    try:
        due = due_runs(prefect_api_url, timeout_s=1.0)
    except Exception:  # noqa: BLE001 - an API failing mid-read says nothing to warn about
        return None
    problems: dict[str, StalledRow] = {}
    for d in found:
        if d.problem is None or not due.get(d.name):
            continue
        problem = d.problem.removeprefix(f"{d.name}: ")  # the problem is its pool's, for every deployment on it
        row = problems.setdefault(problem, {"problem": problem, "deployments": [], "due": 0})
        row["deployments"].append(d.name)
        row["due"] += due[d.name]
    return list(problems.values())


def dashboard_app(
    catalog: Catalog | None = None,
    prefect_ui_url: str | None = None,
    prefect_api_url: str | None = None,
    store: ObjectStore | None = None,
) -> Starlette:
    """The dashboard over `catalog` (default: the configured one) and, for the attempts' traces, `store` (default:
    the configured one); links to `prefect_ui_url` when given. The front page names the deployments whose runs
    would not start, from `prefect_api_url` (default: `prefect_ui_url`/api)."""
    prefect_api_url = prefect_api_url or (f"{prefect_ui_url.rstrip('/')}/api" if prefect_ui_url else None)

    def session() -> AbstractContextManager[Session]:
        return (catalog or open_catalog()).session()

    def object_store() -> ObjectStore:
        return store or configured_store()

    def render(template: str, request: Request, filters: Filters, db: Session, **context: Any) -> HTMLResponse:
        refresh = request.query_params.get("refresh", "")
        html = _TEMPLATES.get_template(template).render(
            **context,
            **_links(request, filters),
            filters=filters,
            request_path=request.url.path,
            choices=filter_choices(db),
            refresh=int(refresh) if refresh.isdigit() and int(refresh) > 0 else None,
            prefect_ui_url=prefect_ui_url,
            flow_run_url=lambda flow_run_id: flow_run_url(prefect_ui_url, flow_run_id),
            generated_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        )
        return HTMLResponse(html)

    def page(request: Request) -> HTMLResponse:
        filters = _filters(request)
        with session() as db:
            data = summary(db, filters)
            return render(
                "dashboard.html.j2",
                request,
                filters,
                db,
                data=data,
                charts=all_charts(data),
                stalled=stalled(prefect_api_url),
                latest_runs=recorded_runs(db, limit=runs.LATEST_RUNS),
            )

    def night_page(request: Request) -> HTMLResponse:
        filters, night = _filters(request), _night(request.path_params["night"])
        with session() as db:
            return render(
                "night.html.j2",
                request,
                filters,
                db,
                night=night.isoformat(),
                runs=drilldown.night_runs(db, night, filters, _page_request(request)),
                stages=drilldown.night_stages(db, night, filters),
            )

    def stage_page(request: Request) -> HTMLResponse:
        filters, night = _filters(request), _night(request.path_params["night"])
        stage, error_class = request.path_params["stage"], request.query_params.get("error_class") or None
        with session() as db:
            worlds = drilldown.stage_worlds(db, night, stage, filters, _page_request(request), error_class)
            scenario_runs = runs.scenario_runs(db, night, filters) if stage == Stage.SCENARIO.value else None
            return render(
                "stage.html.j2",
                request,
                filters,
                db,
                night=night.isoformat(),
                stage=stage,
                error_class=error_class,
                worlds=worlds,
                scenario_runs=scenario_runs,
            )

    def worlds_page(request: Request) -> HTMLResponse:
        filters, status = _filters(request), request.query_params.get("status") or None
        if status is not None and status not in drilldown.WORLD_STATUSES:
            raise HTTPException(400, f"status is one of: {', '.join(drilldown.WORLD_STATUSES)}")
        with session() as db:
            worlds = drilldown.worlds_page(db, filters, _page_request(request), status)
            return render("worlds.html.j2", request, filters, db, worlds=worlds, status=status)

    def failed_worlds_page(request: Request) -> HTMLResponse:
        filters = _filters(request)
        with session() as db:
            failed = drilldown.failed_worlds(db, filters, _page_request(request))
            failing = failing_attempts(db, [(w["env_id"], w["failed_stage"]) for w in failed.rows])
            return render("failed_worlds.html.j2", request, filters, db, failed=failed, failing=failing)

    def world_page(request: Request) -> HTMLResponse:
        filters, env_id = _filters(request), request.path_params["env_id"]
        stage = request.query_params.get("stage") or None
        with session() as db:
            versions = drilldown.world_versions(db, env_id)
            attempts = drilldown.world_attempts(db, env_id, _page_request(request), stage)
            if not versions and not attempts.total:
                raise HTTPException(404, f"no world {env_id!r} in the catalog")
            return render(
                "world.html.j2", request, filters, db, env_id=env_id, stage=stage, versions=versions, attempts=attempts
            )

    def attempt_page(request: Request) -> HTMLResponse:
        filters = _filters(request)
        with session() as db:
            attempt = drilldown.attempt(db, request.path_params["attempt_id"])
            if attempt is None:
                raise HTTPException(404, "no such stage attempt")
            trace = attempt_trace(db, object_store(), request.path_params["attempt_id"])
            return render("attempt.html.j2", request, filters, db, attempt=attempt, trace=trace)

    def runs_list_page(request: Request) -> HTMLResponse:
        filters = _filters(request)
        kind, status = _choice(request, "kind", RunKind), _choice(request, "status", RunStatus)
        with session() as db:
            listed = runs.runs_page(db, _page_request(request), kind, status)
            return render(
                "runs.html.j2",
                request,
                filters,
                db,
                runs=listed,
                kind=kind,
                status=status,
                kinds=[k.value for k in RunKind],
                statuses=[s.value for s in RunStatus],
            )

    def run_page(request: Request) -> HTMLResponse:
        filters = _filters(request)
        kind = _choice(request, "kind", RunKind, path=True)
        with session() as db:
            run = listed_run(db, kind, request.path_params["run_id"]) if kind is not None else None
            if run is None:
                raise HTTPException(404, "no such run in the catalog")
            return render("run.html.j2", request, filters, db, run=run)

    def api_summary(request: Request) -> JSONResponse:
        filters = _filters(request)
        with session() as db:
            return JSONResponse(summary(db, filters))

    async def healthz(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def plotly_js(request: Request) -> FileResponse:
        return FileResponse(PLOTLY_JS, media_type="application/javascript")

    return Starlette(
        routes=[
            Route("/", page),
            Route("/nights/{night}", night_page),
            Route("/nights/{night}/stages/{stage}", stage_page),
            Route("/worlds", worlds_page),
            Route("/failed-worlds", failed_worlds_page),
            Route("/worlds/{env_id}", world_page),
            Route("/attempts/{attempt_id:int}", attempt_page),
            Route("/runs", runs_list_page),
            Route("/runs/{kind}/{run_id}", run_page),
            Route("/api/summary", api_summary),
            Route("/healthz", healthz),
            Route("/static/plotly.min.js", plotly_js),
        ]
    )
