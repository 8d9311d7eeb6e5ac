"""Planted faults of the real-model worlds (tests/support/realmodel.py), one per class the procedural
planters (llm/procedural/faults*.py) also plant: an edit of one file as a model would get it wrong, and the
tool or task a failed probe must name. Used by the quality tests and bench/probes.py."""

from __future__ import annotations

from dataclasses import dataclass

from support.realmodel import real_sources, real_world
from worldsmith.bundle.contract import Bundle

_WITHDRAW = '''def withdraw_appointment(conn, patient_email: str, confirmation_code: str) -> dict:
    """Withdraw one of the patient's upcoming appointments (it becomes cancelled).

    Args:
        patient_email: Email address of the patient the agent acts for.
        confirmation_code: Appointment confirmation code.
    """
    p = _patient(conn, patient_email)
    a = _appt(conn, p, confirmation_code)
    _require_upcoming(a, "cancelled")
    conn.execute("UPDATE appointments SET status = 'cancelled', updated_at = ? WHERE id = ?", (_now_str(), a["id"]))
    return _appt_full(conn, _appt(conn, p, a["confirmation_code"]))


def confirm_appointment('''


@dataclass(frozen=True)
class RealFault:
    """Fault class `fault` planted in world `world` by replacing `old` with `new` once in `file`; found
    when a failed probe names `target`."""

    fault: str
    world: str
    file: str
    old: str
    new: str
    target: str

    def bundle(self) -> Bundle:
        files = real_sources(self.world)
        assert self.old in files[self.file], self.old
        files[self.file] = files[self.file].replace(self.old, self.new, 1)
        return real_world(self.world, dict(files))


REAL_FAULTS = (
    RealFault(
        "documented_unit_changed",
        "rover",
        "tools.py",
        'changes["weight_kg"] = weight_kg',
        'changes["weight_kg"] = round(weight_kg * 2.20462, 1)',  # documented kilograms, stored as pounds
        "update_pet",
    ),
    RealFault(
        "documented_format_changed",
        "rover",
        "tools.py",
        'changes["birth_date"] = bd.isoformat()',
        'changes["birth_date"] = bd.strftime("%m/%d/%Y")',
        "update_pet",
    ),
    RealFault(
        "dependents_left_unlike_sibling",
        "zocdoc",
        "tools.py",
        "def confirm_appointment(",
        _WITHDRAW,  # cancels like cancel_appointment, leaves the scheduled reminders
        "withdraw_appointment",
    ),
    RealFault(
        "verifier_exact_free_text",
        "zocdoc",
        "tasks.jsonl",
        'reason \\"Scheduling conflict\\"',
        "reason Scheduling conflict",  # not quoted: any case and spacing will do, the verifier wants its own
        "cancel_dental_cleaning",
    ),
    RealFault(
        "verifier_accepts_any_text",
        "zocdoc",
        "verifiers.py",
        '_norm(a1["cancellation_reason"]) == "Scheduling conflict"',
        'bool(_norm(a1["cancellation_reason"]))',
        "cancel_dental_cleaning",
    ),
)
