"""The dashboard's charts: plotly figures drawn from `data.summary()`, rendered as HTML fragments. Per-night
series are bars (readable with one night), value axes start at zero, long category labels are shortened.

Each chart is a `<div id="chart-NAME">` whose traces hold exactly the numbers of the summary, so
what a browser shows can be checked against the catalog (the browser tests do).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import plotly.colors
import plotly.graph_objects as go
import plotly.io as pio

from worldsmith.dashboard.data import RATES
from worldsmith.dashboard.rows import (
    CotrainingRow,
    CotrainLine,
    EvaluationRate,
    EvaluationRow,
    FailureClasses,
    GenerationByNight,
    QualitySummary,
    StageSeries,
    Summary,
    TrainingRow,
    WorldRow,
)
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.stages.order import RECORD_NAMES

_LAYOUT = {
    "height": 320,
    "margin": {"l": 50, "r": 20, "t": 40, "b": 60},
    "legend": {"orientation": "h", "y": -0.25},
    "modebar": {"orientation": "v"},  # down the right edge, off the title
}


#: Up to this many nights, per-night series are bars (one night reads as one bar, not one dot); beyond, lines.
BAR_NIGHTS = 31
#: Category labels (world ids, run labels) longer than this are cut on the axis; the hover shows them whole.
LABEL_CHARS = 18


#: The charts' look (plotly's `plotly_white`), as JSON once: a figure built with a template name copies and
#: validates the whole template, the most of a page's rendering time.
_TEMPLATE = pio.templates["plotly_white"].to_plotly_json()


def _html(name: str, figure: go.Figure) -> str:
    drawn = figure.to_plotly_json()
    drawn["layout"]["template"] = _TEMPLATE
    html: str = pio.to_html(
        drawn,
        validate=False,
        full_html=False,
        include_plotlyjs=False,
        div_id=f"chart-{name}",
        config={"displaylogo": False, "responsive": True},
    )
    return html


def short(label: str, chars: int = LABEL_CHARS) -> str:
    """`label` cut to `chars` characters in the middle (an ellipsis marks the cut): generated ids share
    their beginnings and differ at their ends, so both stay."""
    if len(label) <= chars:
        return label
    head = chars // 3
    return f"{label[:head]}…{label[len(label) - (chars - head - 1) :]}"


def value_axis(values: Sequence[float | None], title: str | None = None, **extra: JsonValue) -> JsonObject:
    """A y axis from zero (down to the lowest value when one is negative) that stays 0..1 when there is
    nothing but zero to show (not -1..1)."""
    axis: JsonObject = {"rangemode": "tozero", "title": title, **extra}
    if not any(isinstance(v, int | float) and v != 0 for v in values):
        axis["range"] = [0, 1]
    return axis


#: Colours of the stages, by record name in pipeline order (a stage keeps its colour whatever a filter leaves out).
STAGE_PALETTE: tuple[str, ...] = tuple(plotly.colors.qualitative.Dark24)


def stage_colour(stage: str) -> str:
    """The colour of stage `stage` (a record name: `tools:spec`) in every chart: fixed by its place in the
    pipeline (worldsmith/stages/order.RECORD_NAMES), an unknown one's by its name's checksum."""
    if stage in RECORD_NAMES:
        return STAGE_PALETTE[RECORD_NAMES.index(stage)]
    return STAGE_PALETTE[len(RECORD_NAMES) + zlib.crc32(stage.encode()) % (len(STAGE_PALETTE) - len(RECORD_NAMES))]


def category_axis(labels: list[str], title: str | None = None) -> JsonObject:
    """An x axis of categories whose long labels are shortened and slanted so they never overlap."""
    axis: JsonObject = {"type": "category", "title": title, "automargin": True}
    if any(len(label) > 10 for label in labels) or len(labels) > 12:
        axis.update(tickangle=-35, tickvals=[*labels], ticktext=[short(label) for label in labels])
    return axis


def _nightly(nights: list[str], values: list[float | None], name: str) -> go.Bar | go.Scatter:
    """A stage's per-night series in its colour: bars for up to BAR_NIGHTS nights, a line beyond."""
    if len(nights) <= BAR_NIGHTS:
        return go.Bar(x=nights, y=values, name=name, marker_color=stage_colour(name))
    return go.Scatter(
        x=nights, y=values, name=name, mode="lines+markers", connectgaps=False, line_color=stage_colour(name)
    )


def generation_charts(generation: GenerationByNight) -> dict[str, str]:
    """One chart per rate (first-attempt success, repair, failure) over the nights, a series per stage."""
    charts = {}
    for rate in RATES:
        figure = go.Figure(
            layout={
                **_LAYOUT,
                "title": rate.replace("_", " "),
                "barmode": "group",
                "yaxis": {"range": [0, 1.05], "tickformat": ".0%"},
                "xaxis": category_axis(generation["nights"], "night (UTC)"),
            }
        )
        for stage, series in generation["stages"].items():
            figure.add_trace(_nightly(generation["nights"], series[rate], stage))
        charts[f"generation-{rate}"] = _html(f"generation-{rate}", figure)
    return charts


def _tokens(series: StageSeries) -> list[float | None]:
    """Tokens in plus out per night (None where the stage did not run)."""
    return [
        None if i is None or o is None else i + o
        for i, o in zip(series["tokens_in"], series["tokens_out"], strict=True)
    ]


def _cost(series: StageSeries) -> list[float | None]:
    return series["cost_usd"]


def usage_charts(generation: GenerationByNight) -> dict[str, str]:
    """LLM cost and tokens (in plus out) per night, stacked by stage."""
    charts = {}
    for name, title, values, unit in (
        ("generation-cost", "LLM cost per night (USD)", _cost, "USD"),
        ("generation-tokens", "tokens per night (in + out)", _tokens, "tokens"),
    ):
        traces = {stage: values(series) for stage, series in generation["stages"].items()}
        layout = {
            **_LAYOUT,
            "title": title,
            "barmode": "stack",
            "xaxis": category_axis(generation["nights"], "night (UTC)"),
            "yaxis": value_axis([v for ys in traces.values() for v in ys], unit),
        }
        figure = go.Figure(layout=layout)
        for stage, ys in traces.items():
            figure.add_trace(go.Bar(x=generation["nights"], y=ys, name=stage, marker_color=stage_colour(stage)))
        charts[name] = _html(name, figure)
    return charts


def failure_class_chart(failure_classes: FailureClasses) -> dict[str, str]:
    """Failed attempts per night, stacked by `stage: error class` (the most frequent; the rest as `other`)."""
    nights, series = failure_classes["nights"], failure_classes["series"]
    figure = go.Figure(
        layout={
            **_LAYOUT,
            "height": 360,
            "title": "failed attempts per night by stage and error class",
            "barmode": "stack",
            "xaxis": category_axis(nights, "night (UTC)"),
            "yaxis": value_axis([v for ys in series.values() for v in ys], "failed attempts"),
        }
    )
    for key, counts in series.items():
        figure.add_trace(go.Bar(x=nights, y=counts, name=key))
    if not series:
        figure.add_annotation(text="no failed attempts", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return {"failure-classes": _html("failure-classes", figure)}


def environment_charts(environments: list[WorldRow]) -> dict[str, str]:
    """Cost per environment, and tokens in and out per environment (stacked): the rows given (the front
    page gives the most expensive few), ids shortened on the axis."""
    envs = [e["env_id"] for e in environments]
    costs = [e["cost_usd"] for e in environments]
    cost = go.Figure(
        go.Bar(x=envs, y=costs, name="cost (USD)"),
        layout={
            **_LAYOUT,
            "title": "LLM cost per environment (USD, most expensive)",
            "xaxis": category_axis(envs),
            "yaxis": value_axis(costs, "USD"),
        },
    )
    tokens = go.Figure(
        layout={
            **_LAYOUT,
            "legend": {"orientation": "h", "x": 1, "xanchor": "right", "y": 1, "yanchor": "bottom"},
            "title": "tokens per environment",
            "barmode": "stack",
            "xaxis": category_axis(envs),
            "yaxis": value_axis([e["tokens_in"] + e["tokens_out"] for e in environments], "tokens"),
        }
    )
    tokens.add_trace(go.Bar(x=envs, y=[e["tokens_in"] for e in environments], name="tokens in"))
    tokens.add_trace(go.Bar(x=envs, y=[e["tokens_out"] for e in environments], name="tokens out"))
    return {"env-cost": _html("env-cost", cost), "env-tokens": _html("env-tokens", tokens)}


def quality_chart(quality: QualitySummary) -> dict[str, str]:
    """Versions that passed and failed each quality check."""
    kinds = list(quality["checks"])
    figure = go.Figure(layout={**_LAYOUT, "title": "quality checks", "barmode": "group"})
    figure.add_trace(
        go.Bar(x=kinds, y=[quality["checks"][k]["passed"] for k in kinds], name="passed", marker_color="#2ca02c")
    )
    figure.add_trace(
        go.Bar(x=kinds, y=[quality["checks"][k]["failed"] for k in kinds], name="failed", marker_color="#d62728")
    )
    return {"quality": _html("quality", figure)}


#: The rates of an evaluation run the chart shows, with their legend names.
EVALUATION_RATES: dict[EvaluationRate, str] = {
    "pass@1": "pass@1",
    "env_error_rate": "env_error rate",
    "format_error_rate": "format_error rate",
    "agent_error_rate": "agent_error rate",
}


def evaluation_chart(evaluations: list[EvaluationRow]) -> dict[str, str]:
    """pass@1 and the env_error, format_error and agent_error rates of each evaluation run."""
    labels = [f"#{e['id']} {e['policy']} on {e['set']}" for e in evaluations]
    figure = go.Figure(
        layout={
            **_LAYOUT,
            "title": "evaluations",
            "barmode": "group",
            "yaxis": {"range": [0, 1.05]},
            "xaxis": category_axis(labels),
        }
    )
    for key, name in EVALUATION_RATES.items():
        figure.add_trace(go.Bar(x=labels, y=[e[key] for e in evaluations], name=name))
    return {"evaluations": _html("evaluations", figure)}


def training_chart(training: list[TrainingRow]) -> dict[str, str]:
    """Mean reward per step, a line per training run, on an axis from zero."""
    rewards = [float(r) for run in training for r in run["reward"] if isinstance(r, int | float)]
    figure = go.Figure(
        layout={
            **_LAYOUT,
            "title": "reward per step",
            "xaxis": {"title": "step"},
            "yaxis": value_axis(rewards, "mean reward"),
        }
    )
    for run in training:
        figure.add_trace(
            go.Scatter(x=run["steps"], y=run["reward"], name=f"run {run['id']} ({run['model']})", mode="lines+markers")
        )
    return {"training": _html("training", figure)}


def cotraining_chart(cotraining: list[CotrainingRow]) -> dict[str, str]:
    """Per co-training run and round: real success rate, evaluation pass@1 and the world model's accuracy on
    fresh real data."""
    figure = go.Figure(
        layout={
            **_LAYOUT,
            "title": "co-training per round",
            "xaxis": {"title": "round", "dtick": 1},
            "yaxis": {"range": [0, 1.05]},
        }
    )
    lines: tuple[tuple[CotrainLine, str], ...] = (
        ("real_success_rate", "real success"),
        ("eval_pass@1", "eval pass@1"),
        ("wm_accuracy_fresh", "world model accuracy"),
    )
    for run in cotraining:
        for key, label in lines:
            figure.add_trace(
                go.Scatter(x=run["steps"], y=run[key], name=f"run {run['id']}: {label}", mode="lines+markers")
            )
    return {"cotraining": _html("cotraining", figure)}


def all_charts(summary: Summary) -> dict[str, str]:
    """Every chart of the page by name."""
    return {
        **generation_charts(summary["generation"]),
        **usage_charts(summary["generation"]),
        **failure_class_chart(summary["failure_classes"]),
        **environment_charts(summary["environments"]),
        **quality_chart(summary["quality"]),
        **evaluation_chart(summary["evaluations"]),
        **training_chart(summary["training"]),
        **cotraining_chart(summary["cotraining"]),
    }
