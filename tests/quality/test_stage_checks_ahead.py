"""Checks started while the model answers (quality/ahead.py): the verifiers stage's checks reuse what
they computed and reach the same outcome."""

from __future__ import annotations

import dataclasses

import pytest
from support.patience import PROCESS_S, wait_until
from support.procedural import procedural_work

from worldsmith.llm.procedural.backend import ProceduralGenerator, procedural_bundle
from worldsmith.llm.procedural.faults import plant
from worldsmith.models.specs import VerifierCode
from worldsmith.quality import ahead as checks_ahead
from worldsmith.quality.ahead import ChecksAhead
from worldsmith.quality.deep_probes import deep_probes, prepare_tool_calls
from worldsmith.quality.expectations import validate_world
from worldsmith.quality.probe_results import Probe
from worldsmith.quality.tool_calls import tool_behaviour_key
from worldsmith.stages.verifiers import assemble, bundle_before_verifiers

pytestmark = pytest.mark.sandbox


def _bundles(runtime, scenario_name: str = "Amazon", seed: int = 2):
    """The tools-only bundle the verifiers stage starts its checks ahead on, and the bundle it assembles."""
    work, verifiers = procedural_work(runtime, scenario_name, seed)
    generator = ProceduralGenerator(seed=work.seed)
    done = work.model_copy(update={"verifiers": VerifierCode.model_validate(verifiers)})
    return bundle_before_verifiers(work, generator), assemble(done, generator)


def test_calls_made_ahead_are_reused_without_changing_the_deep_probes_findings(runtime):
    ahead, bundle = _bundles(runtime)
    assert tool_behaviour_key(ahead) == tool_behaviour_key(bundle) and ahead.world == bundle.world
    cold = deep_probes(runtime, bundle)
    assert prepare_tool_calls(runtime, ahead) > 0
    assert prepare_tool_calls(runtime, ahead) == 0  # every outcome kept: none is made twice
    assert deep_probes(runtime, bundle, reuse=True) == cold


def _some_tools(bundle, *names: str, count: int = 4):
    """`bundle` without tasks, with only the tools `names` and its first others up to `count` (fewer calls)."""
    kept = [t for t in bundle.tools if t.name in names] + [t for t in bundle.tools if t.name not in names]
    return dataclasses.replace(bundle, tasks=(), tools=tuple(kept[:count]))


def test_a_crashing_call_is_never_kept_so_the_deep_probes_find_it_again(runtime):
    """A crash may be a time limit hit under load or a lost worker: its call is made again, and the
    deep probes name the tool crashing on some valid inputs as without calls made ahead."""
    planted = plant(procedural_bundle("clinic", 3), "crash_on_some_inputs")
    bundle = _some_tools(planted.bundle, *planted.targets)
    cold = deep_probes(runtime, bundle)
    assert prepare_tool_calls(runtime, bundle) > 0
    assert prepare_tool_calls(runtime, bundle) > 0  # the crashing calls, made again
    crashed = [r for r in deep_probes(runtime, bundle, reuse=True) if r.probe == Probe.VALID_INPUTS and not r.passed]
    assert {r.target for r in crashed} == planted.targets and "no_such_column" in crashed[0].detail
    assert deep_probes(runtime, bundle, reuse=True) == cold


def test_checks_ahead_make_no_call_for_an_instant_answer(runtime, monkeypatch):
    monkeypatch.setattr(checks_ahead, "AHEAD_AFTER_S", PROCESS_S)  # an answer before the delay, however busy
    instant = ChecksAhead(runtime, _some_tools(procedural_bundle("retail", 7))).start()
    instant.stop()  # the answer came at once: no sandbox call was made for it
    assert instant.calls_made == 0


def test_checks_ahead_made_while_the_model_answers_are_kept(runtime, monkeypatch):
    monkeypatch.setattr(checks_ahead, "AHEAD_AFTER_S", 0.0)  # a slow answer: the delay is past at once
    world = procedural_bundle("retail", 7)  # a world no other test probes
    tools_only = _some_tools(world)
    slow = ChecksAhead(runtime, tools_only).start()
    wait_until(lambda: slow.done, "the checks ahead to finish", within_s=PROCESS_S)
    slow.stop()
    assert slow.done and slow.calls_made > 0
    assert prepare_tool_calls(runtime, tools_only) == 0  # made ahead: all kept
    assert validate_world(world.world, reuse=True).passed  # kept ahead for validation
