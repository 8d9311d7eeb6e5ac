"""Coverage of inputs (quality/boundary_inputs.py, quality/input_probes.py, quality/tool_replays.py): tools
that crash only on boundary dates, NULL columns or quotes, and tools whose output depends on unseeded
randomness or set iteration order, are each found and named, in tools no task uses; clean worlds raise no
false alarm."""

from __future__ import annotations

import json

import pytest

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.loader import build_bundle
from worldsmith.jsonvalue import JsonObject
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.llm.procedural.faults import SOURCES
from worldsmith.quality.boundary_inputs import boundary_dates
from worldsmith.quality.input_probes import boundary_probes
from worldsmith.quality.probe_results import Probe, ProbeFailure
from worldsmith.quality.tool_replays import replay_tools
from worldsmith.stages.order import Stage
from worldsmith.stages.routing import owning_step

pytestmark = pytest.mark.sandbox

#: Planted tools, none used by a task: each crashes, or varies, only on the inputs the rule names.
PLANTED_TOOLS = '''

def month_end_report(conn, day: str) -> dict | list:
    """Appointments up to the end of the month of a day.

    Args:
        day: A day (YYYY-MM-DD).
    """
    from datetime import date, timedelta
    d = date.fromisoformat(day)
    end = date(d.year, d.month + 1, 1) - timedelta(days=1)
    return {"month_end": end.isoformat()}


def lucky_patient(conn, limit: int = 5) -> dict | list:
    """A patient drawn at random.

    Args:
        limit: How many patients to draw from (1-100).
    """
    import random
    names = [r[0] for r in conn.execute("SELECT full_name FROM patients ORDER BY id LIMIT ?", (limit,))]
    return {"winner": random.Random().choice(names) if names else None, "draw": random.Random().random()}


def patient_names_set(conn, limit: int = 50) -> dict | list:
    """The distinct names of patients and doctors.

    Args:
        limit: At most this many names (1-100).
    """
    rows = conn.execute("SELECT full_name FROM patients UNION ALL SELECT full_name FROM doctors").fetchall()
    return list({r[0] for r in rows})[:limit]


def patient_phone_digits(conn, patient_id: int) -> dict | list:
    """The digits of a patient's phone.

    Args:
        patient_id: The patient's id.
    """
    row = conn.execute("SELECT phone FROM patients WHERE id = ?", (patient_id,)).fetchone()
    if row is None:
        raise ToolError(f"patient {patient_id} does not exist")
    return {"digits": row[0].replace("-", "")}


def search_patients_by_name(conn, name: str) -> dict | list:
    """Patients whose name contains some text.

    Args:
        name: Part of the patient's name.
    """
    return [dict(r) for r in conn.execute(f"SELECT * FROM patients WHERE full_name LIKE '%{name}%'")]
'''
#: The planted tool, and the probe and failure that must name it.
EXPECTED = {
    "month_end_report": ProbeFailure.BOUNDARY_INPUT_CRASHED,
    "patient_phone_digits": ProbeFailure.BOUNDARY_INPUT_CRASHED,
    "search_patients_by_name": ProbeFailure.BOUNDARY_INPUT_CRASHED,
    "lucky_patient": ProbeFailure.TOOL_REPLAY_DIFFERS,
    "patient_names_set": ProbeFailure.TOOL_REPLAY_DIFFERS,
}


def _planted(bundle: Bundle) -> Bundle:
    """`bundle` (the procedural clinic) with the planted tools, and patients' phone nullable."""
    sources = {name: bundle.files[name].decode() for name in SOURCES}
    sources["tools.py"] += PLANTED_TOOLS
    sources["schema.sql"] = sources["schema.sql"].replace("phone TEXT NOT NULL", "phone TEXT", 1)
    manifest: JsonObject = {"env_id": f"{bundle.env_id}_inputs", "scenario": bundle.manifest.scenario.model_dump()}
    return build_bundle(sources, manifest)


@pytest.mark.unit
def test_boundary_dates_keep_the_shape_of_the_values():
    assert ("2025-12-31 09:00", "31 December (year rollover)") in boundary_dates("2025-03-14 09:00")
    assert ("2028-02-29T10:00:00Z", "29 February of a leap year") in boundary_dates("2025-03-14T10:00:00Z")
    assert [d for d, _ in boundary_dates("2025-03")] == ["2025-12", "2028-02"]
    assert boundary_dates("Monday") == []


def test_each_planted_input_defect_is_found_and_named_and_nothing_else(runtime):
    bundle = _planted(procedural_bundle("clinic", 2))
    assert not {t for step in bundle.tasks for t in [s.tool for s in step.solution]} & set(EXPECTED)
    results = boundary_probes(runtime, bundle) + replay_tools(runtime, bundle)
    failed = {r.target: r for r in results if not r.passed}
    assert {name: r.failure for name, r in failed.items()} == EXPECTED, [r.detail for r in failed.values()]
    for result in failed.values():
        assert owning_step(result) == (Stage.TOOLS, "code")
    assert "December" in failed["month_end_report"].detail
    assert "NULL in patients.phone" in failed["patient_phone_digits"].detail
    assert "quote" in failed["search_patients_by_name"].detail
    assert "{" in failed["lucky_patient"].detail  # the arguments that showed it


def test_clean_worlds_raise_no_false_alarm(runtime, golden):
    for bundle in (golden, procedural_bundle("banking", 3), procedural_bundle("events", 2)):
        results = boundary_probes(runtime, bundle) + replay_tools(runtime, bundle)
        assert [r.detail for r in results if not r.passed] == [], bundle.env_id
        tools = {t.name for t in bundle.tools}
        assert {r.target for r in results if r.probe == Probe.BOUNDARY_INPUTS} == tools
        assert {r.target for r in results if r.probe == Probe.TOOL_DETERMINISTIC} == tools
    assert json.dumps([r.record() for r in results])  # records stay JSON
