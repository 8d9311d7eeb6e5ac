"""The dashboard web app (Starlette): one page of charts and tables over the catalog.

Routes: `/` the page (rendered from the catalog on every request), `/api/summary` the same numbers
as JSON, `/healthz`, and `/static/plotly.min.js` (served from the installed plotly package, so
the page needs no network).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import plotly
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse
from starlette.routing import Route

from worldsmith.dashboard.charts import all_charts
from worldsmith.dashboard.data import summary
from worldsmith.storage.catalog import Catalog, open_catalog

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
_TEMPLATES = Environment(
    loader=PackageLoader("worldsmith.dashboard", "templates"), autoescape=select_autoescape(["html", "j2"])
)


def dashboard_app(catalog: Catalog | None = None, prefect_ui_url: str | None = None) -> Starlette:
    """The dashboard over `catalog` (default: the configured one); links to `prefect_ui_url` when given."""

    def current() -> dict:
        with (catalog or open_catalog()).session() as session:
            return summary(session)

    async def page(request: Request) -> HTMLResponse:
        data = current()
        html = _TEMPLATES.get_template("dashboard.html.j2").render(
            data=data,
            charts=all_charts(data),
            prefect_ui_url=prefect_ui_url,
            generated_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        )
        return HTMLResponse(html)

    async def api_summary(request: Request) -> JSONResponse:
        return JSONResponse(current())

    async def healthz(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def plotly_js(request: Request) -> FileResponse:
        return FileResponse(PLOTLY_JS, media_type="application/javascript")

    return Starlette(
        routes=[
            Route("/", page),
            Route("/api/summary", api_summary),
            Route("/healthz", healthz),
            Route("/static/plotly.min.js", plotly_js),
        ]
    )
