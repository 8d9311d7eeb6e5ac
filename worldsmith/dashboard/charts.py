"""The dashboard's charts: plotly figures drawn from `data.summary()`, rendered as HTML fragments.

Each chart is a `<div id="chart-NAME">` whose traces hold exactly the numbers of the summary, so
what a browser shows can be checked against the catalog (the browser tests do).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from worldsmith.dashboard.data import RATES

_LAYOUT = {
    "height": 320,
    "margin": {"l": 50, "r": 20, "t": 40, "b": 60},
    "template": "plotly_white",
    "legend": {"orientation": "h", "y": -0.25},
}


def _html(name: str, figure: go.Figure) -> str:
    return pio.to_html(
        figure,
        full_html=False,
        include_plotlyjs=False,
        div_id=f"chart-{name}",
        config={"displaylogo": False, "responsive": True},
    )


def generation_charts(generation: dict[str, Any]) -> dict[str, str]:
    """One line chart per rate (first-attempt success, repair, failure) over the nights, a line per stage."""
    charts = {}
    for rate in RATES:
        figure = go.Figure(
            layout={
                **_LAYOUT,
                "title": rate.replace("_", " "),
                "yaxis": {"range": [0, 1.05], "tickformat": ".0%"},
                "xaxis": {"type": "category", "title": "night (UTC)"},
            }
        )
        for stage, series in generation["stages"].items():
            figure.add_trace(
                go.Scatter(x=generation["nights"], y=series[rate], name=stage, mode="lines+markers", connectgaps=False)
            )
        charts[f"generation-{rate}"] = _html(f"generation-{rate}", figure)
    return charts


def _tokens(series: dict[str, list]) -> list[int | None]:
    """Tokens in plus out per night (None where the stage did not run)."""
    return [None if i is None else i + o for i, o in zip(series["tokens_in"], series["tokens_out"], strict=True)]


def usage_charts(generation: dict[str, Any]) -> dict[str, str]:
    """LLM cost and tokens (in plus out) per night, stacked by stage."""
    charts = {}
    for name, title, values in (
        ("generation-cost", "LLM cost per night (USD)", lambda series: series["cost_usd"]),
        ("generation-tokens", "tokens per night (in + out)", _tokens),
    ):
        layout = {**_LAYOUT, "title": title, "barmode": "stack", "xaxis": {"type": "category", "title": "night (UTC)"}}
        figure = go.Figure(layout=layout)
        for stage, series in generation["stages"].items():
            figure.add_trace(go.Bar(x=generation["nights"], y=values(series), name=stage))
        charts[name] = _html(name, figure)
    return charts


def environment_charts(environments: list[dict[str, Any]]) -> dict[str, str]:
    """Cost per environment, and tokens in and out per environment (stacked)."""
    envs = [e["env_id"] for e in environments]
    cost = go.Figure(
        go.Bar(x=envs, y=[e["cost_usd"] for e in environments], name="cost (USD)"),
        layout={**_LAYOUT, "title": "LLM cost per environment (USD)"},
    )
    tokens = go.Figure(layout={**_LAYOUT, "title": "tokens per environment", "barmode": "stack"})
    tokens.add_trace(go.Bar(x=envs, y=[e["tokens_in"] for e in environments], name="tokens in"))
    tokens.add_trace(go.Bar(x=envs, y=[e["tokens_out"] for e in environments], name="tokens out"))
    return {"env-cost": _html("env-cost", cost), "env-tokens": _html("env-tokens", tokens)}


def quality_chart(quality: dict[str, Any]) -> dict[str, str]:
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


def evaluation_chart(evaluations: list[dict[str, Any]]) -> dict[str, str]:
    """pass@1 and env_error rate of each evaluation run."""
    labels = [f"#{e['id']} {e['policy']} on {e['set']}" for e in evaluations]
    figure = go.Figure(layout={**_LAYOUT, "title": "evaluations", "barmode": "group", "yaxis": {"range": [0, 1.05]}})
    figure.add_trace(go.Bar(x=labels, y=[e["pass@1"] for e in evaluations], name="pass@1"))
    figure.add_trace(go.Bar(x=labels, y=[e["env_error_rate"] for e in evaluations], name="env_error rate"))
    return {"evaluations": _html("evaluations", figure)}


def training_chart(training: list[dict[str, Any]]) -> dict[str, str]:
    """Mean reward per step, a line per training run."""
    figure = go.Figure(layout={**_LAYOUT, "title": "reward per step", "xaxis": {"title": "step"}})
    for run in training:
        figure.add_trace(
            go.Scatter(x=run["steps"], y=run["reward"], name=f"run {run['id']} ({run['model']})", mode="lines+markers")
        )
    return {"training": _html("training", figure)}


def cotraining_chart(cotraining: list[dict[str, Any]]) -> dict[str, str]:
    """Per co-training run and round: real success rate, evaluation pass@1 and the world model's accuracy on fresh real data."""
    figure = go.Figure(
        layout={
            **_LAYOUT,
            "title": "co-training per round",
            "xaxis": {"title": "round", "dtick": 1},
            "yaxis": {"range": [0, 1.05]},
        }
    )
    for run in cotraining:
        for key, label in (
            ("real_success_rate", "real success"),
            ("eval_pass@1", "eval pass@1"),
            ("wm_accuracy_fresh", "world model accuracy"),
        ):
            figure.add_trace(
                go.Scatter(x=run["steps"], y=run[key], name=f"run {run['id']}: {label}", mode="lines+markers")
            )
    return {"cotraining": _html("cotraining", figure)}


def all_charts(summary: dict[str, Any]) -> dict[str, str]:
    """Every chart of the page by name."""
    return {
        **generation_charts(summary["generation"]),
        **usage_charts(summary["generation"]),
        **environment_charts(summary["environments"]),
        **quality_chart(summary["quality"]),
        **evaluation_chart(summary["evaluations"]),
        **training_chart(summary["training"]),
        **cotraining_chart(summary["cotraining"]),
    }
