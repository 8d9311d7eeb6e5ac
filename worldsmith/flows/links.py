"""Links from Prefect artifacts to the dashboard: every flow run's markdown summary ends with one."""

from __future__ import annotations

from worldsmith.settings import get_settings

#: Dashboard sections (anchors of the dashboard page) by flow.
SECTIONS = {
    "generate": "generation",
    "curate": "sets",
    "evaluate": "evaluations",
    "train": "training",
    "cotrain": "cotraining",
}


def dashboard_link(flow_name: str) -> str:
    """A markdown line linking to the dashboard section that shows runs of `flow_name`."""
    section = SECTIONS[flow_name]
    return f"[Open the {section} section of the worldsmith dashboard]({get_settings().resolved_dashboard_url()}/#{section})"
