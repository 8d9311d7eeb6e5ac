"""The `worldsmith` command line (typer)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from worldsmith.bundle.errors import BundleError
from worldsmith.bundle.loader import Bundle, load_bundle, rebuild_bundle_dir
from worldsmith.settings import get_settings

app = typer.Typer(help="Manufacture executable tool-use worlds for LLM agents and train agents in them.", no_args_is_help=True)


def _command_group(name: str, help: str) -> typer.Typer:
    """A sub-command group `worldsmith NAME ...` (without arguments: its help)."""
    group = typer.Typer(help=help, no_args_is_help=True)
    app.add_typer(group, name=name)
    return group


env_app = _command_group("env", "Inspect, check, call and serve environment bundles.")
catalog_app = _command_group("catalog", "Publish, list, compare, fetch and move environment versions.")
sets_app = _command_group("sets", "Create and export environment sets (immutable, split by environment).")
data_app = _command_group("data", "Datasets from evaluation trajectories: SFT conversations and world-model transitions.")
import_app = _command_group("import", "Bring environments from other formats into the catalog.")
export_app = _command_group("export", "Write environment sets in other formats.")
wm_app = _command_group("wm", "World models: transition data from real episodes, their training, and their evaluation against the real worlds.")
console = Console()
errors = Console(stderr=True)

BundleArg = Annotated[Path, typer.Argument(help="Bundle directory.", exists=False)]


@app.callback()
def _defaults() -> None:
    """Keep Prefect's local state under WORLDSMITH_HOME and its analytics off unless configured; use the
    local stack's Prefect server when `worldsmith up` started one and no PREFECT_API_URL is set."""
    import os

    home = get_settings().home
    if "PREFECT_HOME" not in os.environ:
        (home / "prefect").mkdir(parents=True, exist_ok=True)
        os.environ["PREFECT_HOME"] = str((home / "prefect").resolve())
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if "PREFECT_API_URL" not in os.environ:  # flows report to the server of `worldsmith up` when it runs
        from worldsmith.ops.stack import Stack

        stack = Stack.from_settings()
        if stack.server().pid() is not None:
            os.environ["PREFECT_API_URL"] = stack.api_url


def _bundle_failure(title: str, exc: BundleError) -> typer.Exit:
    errors.print(f"[bold red]{title}[/]")
    for issue in exc.issues:
        errors.print(f"  {issue}", markup=False, highlight=False)
    return typer.Exit(2)


def _load(path: Path) -> Bundle:
    try:
        return load_bundle(path)
    except BundleError as exc:
        raise _bundle_failure(f"invalid bundle {path}", exc) from None


def _runtime():
    from worldsmith.runtime.episode import Runtime

    return Runtime()


@env_app.command("build")
def env_build(path: BundleArg) -> None:
    """Re-derive tools.json, world.db and manifest hashes of a hand-written bundle from its sources."""
    try:
        bundle = rebuild_bundle_dir(path)
    except BundleError as exc:
        raise _bundle_failure(f"cannot build {path}", exc) from None
    console.print(f"built {bundle.env_id}: {bundle.manifest.stats}")


@env_app.command("tools")
def env_tools(path: BundleArg, as_json: Annotated[bool, typer.Option("--json", help="Print tools.json.")] = False) -> None:
    """List a bundle's tools and their arguments."""
    bundle = _load(path)
    if as_json:
        print(json.dumps([t.model_dump() for t in bundle.tools], indent=2))
        return
    table = Table(title=f"{bundle.env_id}: {len(bundle.tools)} tools")
    table.add_column("tool")
    table.add_column("arguments")
    table.add_column("description")
    for tool in bundle.tools:
        props = tool.parameters["properties"]
        required = set(tool.parameters.get("required", []))
        args = ", ".join(f"{n}{'' if n in required else '?'}: {p.get('type', 'any')}" for n, p in props.items())
        table.add_row(tool.name, args, tool.description)
    console.print(table)


@env_app.command("call")
def env_call(
    path: BundleArg,
    tool: Annotated[str, typer.Argument(help="Tool name.")],
    args: Annotated[str, typer.Option("--args", help="Arguments as a JSON object.")] = "{}",
) -> None:
    """Call one tool on a fresh episode and print the result as JSON (exit 1 unless it succeeded)."""
    bundle = _load(path)
    try:
        arguments = json.loads(args)
    except json.JSONDecodeError as exc:
        errors.print(f"--args is not valid JSON: {exc}")
        raise typer.Exit(2) from None
    if not isinstance(arguments, dict):
        errors.print("--args must be a JSON object")
        raise typer.Exit(2)
    with _runtime() as runtime, runtime.open_episode(bundle) as episode:
        result = episode.call_tool(tool, arguments)
    print(result.model_dump_json(indent=2))
    raise typer.Exit(0 if result.ok else 1)


@env_app.command("check")
def env_check(path: BundleArg) -> None:
    """Load a bundle, call every tool, replay every reference solution (must be complete) and
    verify the untouched state (must not be complete). Exit 0 only if everything passes."""
    from worldsmith.quality.probes import check_environment

    bundle = _load(path)
    with _runtime() as runtime:
        results = check_environment(runtime, bundle)
        layers = runtime.layers()
    table = Table(title=f"{bundle.env_id}: environment check")
    for column in ("probe", "target", "result", "detail"):
        table.add_column(column)
    for r in results:
        table.add_row(r.probe, r.target, "[green]pass[/]" if r.passed else "[red]FAIL[/]", r.detail[:120])
    console.print(table)
    console.print("sandbox layers: " + ", ".join(f"{k} {v}" for k, v in layers.items()), highlight=False)
    failed = [r for r in results if not r.passed]
    console.print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    raise typer.Exit(1 if failed else 0)


@env_app.command("serve")
def env_serve(
    paths: Annotated[list[Path], typer.Argument(help="Bundle directories to host.")],
    host: Annotated[Optional[str], typer.Option(help="Interface to bind (default WORLDSMITH_GATEWAY_HOST).")] = None,
    port: Annotated[Optional[int], typer.Option(help="Port (default WORLDSMITH_GATEWAY_PORT).")] = None,
) -> None:
    """Serve bundles over MCP (streamable HTTP) at http://HOST:PORT/envs/<env_id>/mcp?task=<id>."""
    from worldsmith.runtime.gateway import serve

    settings = get_settings()
    bundles = [_load(p) for p in paths]
    host = host or settings.gateway_host
    port = port or settings.gateway_port
    for bundle in bundles:
        console.print(f"serving {bundle.env_id} at http://{host}:{port}/envs/{bundle.env_id}/mcp")
    with _runtime() as runtime:
        serve(runtime, bundles, host, port, session_idle_s=settings.gateway_session_idle_s, max_sessions=settings.gateway_max_sessions)


def _storage():
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.objectstore import configured_store

    return configured_store(), open_catalog()


@contextmanager
def _reported() -> Iterator[None]:
    """Turn a catalog refusal into its message on stderr and exit status 2."""
    from worldsmith.storage.publish import CatalogError

    try:
        yield
    except CatalogError as exc:
        errors.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None


@catalog_app.command("publish")
def catalog_publish(
    path: BundleArg,
    probes: Annotated[bool, typer.Option(help="Also run the execution probes in the sandbox.")] = True,
) -> None:
    """Check a bundle (seed-data expectations, execution probes) and publish it; exit 1 if it was
    published as failed."""
    from worldsmith.quality.checks import quality_checks
    from worldsmith.runtime.episode import Runtime
    from worldsmith.storage.publish import publish

    bundle = _load(path)
    store, catalog = _storage()
    if probes:
        with Runtime() as runtime:
            checks = quality_checks(bundle, runtime)
    else:
        checks = quality_checks(bundle)
    result = publish(bundle, store, catalog, checks)
    version = result.version
    verb = "published" if result.created else "already published as"
    console.print(f"{verb} {version.ref}: {version.status}" + (f" ({version.failure_reason})" if version.failure_reason else ""), highlight=False)
    raise typer.Exit(0 if version.status == "good" else 1)


@catalog_app.command("ls")
def catalog_ls(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List every environment version."""
    from sqlmodel import select

    from worldsmith.models.catalog import EnvironmentVersion

    _, catalog = _storage()
    with catalog.session() as session:
        versions = session.exec(select(EnvironmentVersion).order_by(EnvironmentVersion.env_id, EnvironmentVersion.version)).all()
    rows = [{"ref": v.ref, "status": v.status, "tables": v.stats.get("tables"), "tools": v.stats.get("tools"),
             "tasks": v.stats.get("tasks"), "checks": {k: q.get("passed") for k, q in v.quality.items()},
             "created_at": v.created_at.isoformat(timespec="seconds")} for v in versions]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{len(rows)} environment versions")
    for column in ("ref", "status", "tables", "tools", "tasks", "checks", "created"):
        table.add_column(column)
    for r in rows:
        checks = ", ".join(f"{k} {'ok' if ok else 'FAILED'}" for k, ok in r["checks"].items())
        table.add_row(r["ref"], r["status"], str(r["tables"]), str(r["tools"]), str(r["tasks"]), checks, r["created_at"])
    console.print(table)


@catalog_app.command("show")
def catalog_show(ref: Annotated[str, typer.Argument(help="ENV or ENV@VERSION.")]) -> None:
    """Print a version's record: status, provenance, stats, artifacts and quality reports (JSON)."""
    from worldsmith.storage.publish import resolve, version_record

    _, catalog = _storage()
    with _reported():
        with catalog.session() as session:
            record = version_record(session, resolve(session, ref))
    print(json.dumps(record, indent=2))


@catalog_app.command("diff")
def catalog_diff(a: Annotated[str, typer.Argument(help="ENV@V1")], b: Annotated[str, typer.Argument(help="ENV@V2")]) -> None:
    """Show what changed between two versions: stats, artifacts, and a unified diff of each text artifact."""
    import difflib

    from worldsmith.storage.publish import artifacts_of, resolve

    store, catalog = _storage()
    with _reported():
        with catalog.session() as session:
            va, vb = resolve(session, a), resolve(session, b)
            fa, fb = artifacts_of(session, va), artifacts_of(session, vb)
    changes = {k: (va.stats.get(k), vb.stats.get(k)) for k in sorted(set(va.stats) | set(vb.stats)) if va.stats.get(k) != vb.stats.get(k)}
    console.print(f"{va.ref} -> {vb.ref}; stats changed: {changes or 'none'}", highlight=False)
    for name in sorted(set(fa) | set(fb)):
        if fa.get(name) == fb.get(name):
            continue
        if name == "world.db" or name not in fa or name not in fb:
            console.print(f"{name}: {'differs' if name in fa and name in fb else 'only in ' + (va.ref if name in fa else vb.ref)}")
            continue
        old = store.get_bytes(fa[name]).decode().splitlines(keepends=True)
        new = store.get_bytes(fb[name]).decode().splitlines(keepends=True)
        sys.stdout.writelines(difflib.unified_diff(old, new, f"{va.ref}/{name}", f"{vb.ref}/{name}"))


@catalog_app.command("fetch")
def catalog_fetch(ref: Annotated[str, typer.Argument(help="ENV or ENV@VERSION.")], target: Annotated[Path, typer.Argument(help="Directory to write.")]) -> None:
    """Write a version's bundle into a directory, byte for byte as published."""
    from worldsmith.storage.publish import fetch

    store, catalog = _storage()
    with _reported():
        bundle = fetch(ref, target, store, catalog)
    console.print(f"fetched {bundle.env_id}@{bundle.manifest.version} into {target}")


@catalog_app.command("export")
def catalog_export(target: Annotated[Path, typer.Argument(help="Directory to write.")]) -> None:
    """Export every environment, version, object and set into a directory (for `catalog import`)."""
    from worldsmith.storage.transfer import export_catalog

    store, catalog = _storage()
    console.print(f"exported {export_catalog(target, store, catalog)} into {target}")


@catalog_app.command("import")
def catalog_import(source: Annotated[Path, typer.Argument(help="A directory written by `catalog export`.")]) -> None:
    """Import an export; what is already here (same content, same set name) is skipped."""
    from worldsmith.storage.transfer import import_catalog

    store, catalog = _storage()
    with _reported():
        counts = import_catalog(source, store, catalog)
    console.print(f"imported from {source}: {counts}")


@sets_app.command("create")
def sets_create(
    name: Annotated[str, typer.Argument(help="Name of the new set (sets are immutable).")],
    category: Annotated[Optional[list[str]], typer.Option(help="Keep envs with this category (repeatable).")] = None,
    env: Annotated[Optional[list[str]], typer.Option(help="Keep only this env (repeatable).")] = None,
    count: Annotated[Optional[int], typer.Option(help="Sample this many envs.")] = None,
    seed: Annotated[int, typer.Option(help="Sampling and split seed.")] = 0,
    validation_fraction: Annotated[float, typer.Option(help="Share of envs in the validation split.")] = 0.1,
    min_tasks: Annotated[int, typer.Option(help="Minimum tasks per env.")] = 0,
    min_tools: Annotated[int, typer.Option(help="Minimum tools per env.")] = 0,
    require_passed: Annotated[Optional[list[str]], typer.Option(help="Quality check that must have passed (repeatable).")] = None,
    status: Annotated[str, typer.Option(help="Version status to select.")] = "good",
) -> None:
    """Create an environment set from a query over the catalog."""
    from worldsmith.storage.sets import SetQuery, create_set, get_set, members_of

    _, catalog = _storage()
    query = SetQuery(categories=category or [], env_ids=env or [], count=count, seed=seed, validation_fraction=validation_fraction,
                     min_tasks=min_tasks, min_tools=min_tools, require_passed=require_passed or [], status=status)
    with _reported():
        create_set(catalog, name, query)
    with catalog.session() as session:
        members = members_of(session, get_set(session, name))
    splits = {s: sum(1 for _, x in members if x == s) for s in ("train", "validation")}
    console.print(f"created set {name}: {len(members)} environment versions ({splits['train']} train, {splits['validation']} validation)")


@sets_app.command("ls")
def sets_ls() -> None:
    """List environment sets."""
    from sqlmodel import select

    from worldsmith.models.catalog import EnvironmentSet
    from worldsmith.storage.sets import members_of

    _, catalog = _storage()
    table = Table(title="environment sets")
    for column in ("name", "members", "train", "validation", "created"):
        table.add_column(column)
    with catalog.session() as session:
        for env_set in session.exec(select(EnvironmentSet).order_by(EnvironmentSet.name)).all():
            members = members_of(session, env_set)
            train = sum(1 for _, split in members if split == "train")
            table.add_row(env_set.name, str(len(members)), str(train), str(len(members) - train), env_set.created_at.isoformat(timespec="seconds"))
    console.print(table)


@sets_app.command("show")
def sets_show(name: Annotated[str, typer.Argument(help="Set name.")]) -> None:
    """Print a set's manifest (query, members with hashes and splits) as JSON."""
    from worldsmith.storage.sets import get_set, set_manifest

    _, catalog = _storage()
    with _reported():
        with catalog.session() as session:
            manifest = set_manifest(session, get_set(session, name))
    print(json.dumps(manifest, indent=2))


@sets_app.command("export")
def sets_export(name: Annotated[str, typer.Argument(help="Set name.")], target: Annotated[Path, typer.Argument(help="Directory to write.")]) -> None:
    """Export a set: set.json, its bundles, and (env, task) rows as tasks.jsonl and tasks.parquet."""
    from worldsmith.storage.sets import export_set

    store, catalog = _storage()
    with _reported():
        manifest = export_set(name, target, store, catalog)
    console.print(f"exported set {name} ({len(manifest['members'])} environment versions) into {target}")


@app.command("generate")
def generate_command(
    count: Annotated[int, typer.Option(help="Environments to generate.")] = 10,
    backend: Annotated[str, typer.Option(help="procedural (offline) or openai (WORLDSMITH_LLM_* settings).")] = "procedural",
    model: Annotated[Optional[str], typer.Option(help="Model of the openai backend.")] = None,
    seed: Annotated[int, typer.Option(help="Generation seed.")] = 0,
    concurrency: Annotated[int, typer.Option(help="Environments built at once.")] = 4,
    scenarios: Annotated[Optional[Path], typer.Option(help="Seed scenarios (JSON lines).")] = None,
    max_attempts: Annotated[int, typer.Option(help="Attempts of each stage's repair loop.")] = 5,
    fault_rate: Annotated[float, typer.Option(help="Procedural backend: share of first attempts that fail like LLM output.")] = 0.0,
) -> None:
    """Generate environments with the `generate` flow (configured Prefect API, or an ephemeral local one)."""
    from rich.progress import Progress

    from worldsmith.flows.generate import GenerateParameters, run_generate

    params = GenerateParameters(count=count, backend=backend, model=model, seed=seed, concurrency=concurrency,
                                scenario_file=str(scenarios) if scenarios else None, max_attempts=max_attempts, fault_rate=fault_rate)
    # stdout stays the real one: Prefect serialises the run context for Dask workers
    with Progress(console=console, redirect_stdout=False, redirect_stderr=False) as progress:
        bar = progress.add_task("generating environments", total=count)
        results = run_generate(params, on_progress=lambda summary: progress.advance(bar))
    table = Table(title=f"{len(results)} environments")
    for column in ("env", "status", "reason"):
        table.add_column(column)
    for r in results:
        table.add_row(r["ref"] or r["env_id"], r["status"], (r["reason"] or "")[:100])
    console.print(table)
    raise typer.Exit(0 if all(r["status"] == "good" for r in results) else 1)


@app.command("eval")
def eval_command(
    set_name: Annotated[str, typer.Option("--set", help="Environment set to evaluate on.")],
    policy: Annotated[str, typer.Option(help="reference | random | openai:MODEL | hf:PATH")] = "reference",
    samples: Annotated[int, typer.Option(help="Episodes per task (k of pass@k).")] = 1,
    split: Annotated[str, typer.Option(help="all | train | validation")] = "all",
    max_turns: Annotated[int, typer.Option(help="Turns per episode.")] = 20,
    window: Annotated[Optional[int], typer.Option(help="History window in turns (default: full history).")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="Sampling temperature (default 0 for one sample, 0.7 for more).")] = None,
    tool_format: Annotated[str, typer.Option(help="openai policy: native tool calls or the <tool_call> text format.")] = "native",
    meta_tools: Annotated[bool, typer.Option(help="openai policy: call tools through list_tools / call_tool.")] = False,
    judge: Annotated[Optional[str], typer.Option(help="LLM judge model on the configured endpoint.")] = None,
    judge_votes: Annotated[int, typer.Option(help="Judges voting per episode.")] = 1,
    concurrency: Annotated[int, typer.Option(help="Tasks evaluated at once.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the first sample.")] = 0,
    simulate: Annotated[Optional[str], typer.Option(help=SIMULATE_HELP)] = None,
    wm_samples: Annotated[int, typer.Option(help="--simulate: predictions per call (their disagreement is the uncertainty).")] = 1,
    uncertainty_threshold: Annotated[float, typer.Option(help="--simulate: stop an episode at a call more uncertain than this.")] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Evaluate a policy on an environment set with the `evaluate` flow; stores an evaluation run."""
    from worldsmith.flows.evaluate import EvaluateParameters, run_evaluate

    try:
        params = EvaluateParameters(set_name=set_name, policy=policy, samples=samples, split=split, max_turns=max_turns, window=window,
                                    temperature=temperature, tool_format=tool_format, meta_tools=meta_tools, judge_model=judge,
                                    judge_votes=judge_votes, concurrency=concurrency, seed=seed,
                                    simulate=_simulation(simulate, wm_samples, uncertainty_threshold))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    with _reported(), console.status(f"evaluating {policy} on {set_name}", spinner="dots"):
        result = run_evaluate(params)
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return
    k = params.samples
    table = Table(title=f"evaluation {result['run_id']}: {policy} on {set_name} ({split}, {result['world']} worlds, {k} sample(s) per task)")
    for column in ("env", "tasks", "episodes", "pass@1", f"pass@{k}", "mean reward", "mean turns", "env_error", "format_error"):
        table.add_column(column)
    for env, s in [*result["per_env"].items(), ("all", result["overall"])]:
        table.add_row(env, str(s["tasks"]), str(s["episodes"]), f"{s['pass@1']:.3f}", f"{s[f'pass@{k}']:.3f}", f"{s['mean_reward']:.3f}",
                      f"{s['mean_turns']:.2f}", f"{s['env_error_rate']:.3f}", f"{s['format_error_rate']:.3f}")
    console.print(table)
    console.print(f"trajectories: {result['trajectories']['jsonl']}")


def _flow_result(run: Callable[[], dict[str, Any]], as_json: bool) -> dict[str, Any] | None:
    """Run a training flow for a command: a ValueError (a model that is not on this machine, a set
    without tasks) exits 2 with its message; with --json the record is printed and None returned."""
    try:
        with _reported():
            result = run()
    except ValueError as exc:
        errors.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return None
    return result


SIMULATE_HELP = ("Simulated mode: a world model answers the tool calls instead of the environments' code: "
                 "code | static | openai:MODEL | hf:PATH (see docs/world-models.md).")


def _simulation(world_model: str | None, samples: int, threshold: float) -> dict | None:
    """The `simulate` settings of the --simulate options (None: the real worlds)."""
    return None if world_model is None else {"world_model": world_model, "samples": samples, "uncertainty_threshold": threshold}


@app.command("train")
def train_command(
    set_name: Annotated[str, typer.Option("--set", help="Environment set whose train split gives the (env, task) rows.")],
    model: Annotated[str, typer.Option(help="Model directory, a cached Hugging Face id, or `tiny` (built offline, cpu-test).")] = "tiny",
    profile: Annotated[str, typer.Option(help="cpu-test (fp32 on the CPU) | gpu (bf16, gradient checkpointing, vLLM when installed).")] = "cpu-test",
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 20,
    group_size: Annotated[int, typer.Option(help="Rollouts per (env, task) row.")] = 16,
    learning_rate: Annotated[float, typer.Option(help="AdamW learning rate.")] = 7e-7,
    beta: Annotated[float, typer.Option(help="KL penalty against the reference model.")] = 0.0,
    history: Annotated[str, typer.Option(help="windowed | full")] = "windowed",
    window: Annotated[Optional[int], typer.Option(help="Turns kept in the windowed history (default 3).")] = None,
    max_turns: Annotated[int, typer.Option(help="Turns per rollout.")] = 10,
    max_completion_length: Annotated[int, typer.Option(help="Tokens generated per turn at most.")] = 256,
    rows_per_step: Annotated[int, typer.Option(help="(env, task) rows per step, per process.")] = 1,
    processes: Annotated[int, typer.Option(help="Training processes, one per GPU (launched with torch.distributed.run).")] = 1,
    lora: Annotated[bool, typer.Option(help="Train LoRA adapters instead of every weight.")] = False,
    tensorboard: Annotated[bool, typer.Option(help="Also write TensorBoard event files under the run's output.")] = False,
    output: Annotated[Optional[Path], typer.Option(help="Output directory (default WORLDSMITH_HOME/training/<run id>).")] = None,
    save_every: Annotated[int, typer.Option(help="Store a trainer checkpoint every n steps, for `worldsmith resume` (0: none).")] = 0,
    warmup_steps: Annotated[int, typer.Option(help="--model tiny: supervised steps on the reference solutions first.")] = 120,
    seed: Annotated[int, typer.Option(help="Seed of sampling, row order and initialisation.")] = 0,
    simulate: Annotated[Optional[str], typer.Option(help=SIMULATE_HELP)] = None,
    wm_samples: Annotated[int, typer.Option(help="--simulate: predictions per call (their disagreement is the uncertainty).")] = 1,
    uncertainty_threshold: Annotated[float, typer.Option(help="--simulate: stop a rollout at a call more uncertain than this.")] = 1.0,
    real_share: Annotated[Optional[float], typer.Option(help="--simulate: share of rollout groups run in the real worlds (default 0).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run's record as JSON.")] = False,
) -> None:
    """Train a policy with multi-turn GRPO on an environment set (the `train` flow); stores a training run."""
    from worldsmith.flows.train import train
    from worldsmith.training.config import TrainingConfig

    fields = {"model": model, "set_name": set_name, "profile": profile, "steps": steps, "group_size": group_size, "learning_rate": learning_rate,
              "beta": beta, "history": history, "max_turns": max_turns, "max_completion_length": max_completion_length,
              "rows_per_step": rows_per_step, "processes": processes, "lora": {"enabled": lora}, "tensorboard": tensorboard, "seed": seed, "warmup_steps": warmup_steps,
              "save_every": save_every,
              "output": str(output) if output else None, "simulate": _simulation(simulate, wm_samples, uncertainty_threshold),
              **({"real_share": real_share} if real_share is not None else {})}
    try:
        config = TrainingConfig(**fields, **({"window": window} if window is not None else {}))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    _report_training(config, _flow_result(lambda: train(config, progress=not as_json), as_json))


@app.command("resume")
def resume_command(
    run_id: Annotated[int, typer.Argument(help="A training run that stopped before finishing.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the run's record as JSON.")] = False,
) -> None:
    """Continue a GRPO training run that stopped (a killed worker, a preempted machine) from its
    latest trainer checkpoint in the object store, with the run's own configuration."""
    from worldsmith.flows.train import resume_training, stored_config

    try:
        config = stored_config(run_id)
    except ValueError as exc:
        errors.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None
    _report_training(config, _flow_result(lambda: resume_training(run_id, progress=not as_json), as_json))


def _report_training(config: Any, result: dict[str, Any] | None) -> None:
    """The validation table and final model of a finished training run (nothing when None: --json)."""
    if result is None:
        return
    resumed = f", resumed after step {result['resumed_from']}" if result.get("resumed_from") is not None else ""
    table = Table(title=f"training run {result['run_id']}: {config.model} on {config.set_name}, {result['steps']} steps{resumed}")
    for column in ("validation", "pass@1", "mean reward", "format_error", "evaluation"):
        table.add_column(column)
    for name in ("before", "after"):
        report = result[name]
        if report is not None:
            table.add_row(name, f"{report['pass@1']:.3f}", f"{report['mean_reward']:.3f}", f"{report['format_error_rate']:.3f}", str(report["run_id"]))
    console.print(table)
    console.print(f"final model: {result['final']} (object {result['checkpoint']})")


def _write_dataset(rows: list[dict], out: Path, name: str, empty: str, what: str) -> None:
    """Write `rows` as OUT/NAME.jsonl and .parquet and report them; exit 2 with `empty` when there are none."""
    from worldsmith.agent.datasets import write_rows

    if not rows:
        errors.print(f"{empty}: nothing to write")
        raise typer.Exit(2)
    paths = write_rows(rows, out, name)
    console.print(f"{len(rows)} {what}: {paths['jsonl']}, {paths['parquet']}")


@data_app.command("sft")
def data_sft(
    trajectories: Annotated[Path, typer.Argument(help="trajectories.jsonl of an evaluation run.")],
    out: Annotated[Path, typer.Argument(help="Directory to write sft.jsonl and sft.parquet into.")],
    per_turn: Annotated[bool, typer.Option(help="One prompt/completion row per assistant turn instead of one conversation per episode.")] = False,
    window: Annotated[Optional[int], typer.Option(help="Per-turn rows: history window of the prompt (default: full history).")] = None,
) -> None:
    """Successful trajectories as chat-format SFT data (TRL SFTTrainer format)."""
    from worldsmith.agent.datasets import sft_rows, turn_rows
    from worldsmith.agent.trajectories import read_jsonl

    loaded = read_jsonl(trajectories)
    rows = turn_rows(loaded, window) if per_turn else sft_rows(loaded)
    _write_dataset(rows, out, "sft", f"no complete trajectory in {trajectories}", f"rows from {len(loaded)} trajectories")


@data_app.command("transitions")
def data_transitions(
    trajectories: Annotated[Path, typer.Argument(help="trajectories.jsonl of an evaluation run.")],
    out: Annotated[Path, typer.Argument(help="Directory to write transitions.jsonl and transitions.parquet into.")],
) -> None:
    """Every tool call as a world-model transition: state, action, observation, database diff."""
    from worldsmith.agent.datasets import transition_rows
    from worldsmith.agent.trajectories import read_jsonl

    loaded = read_jsonl(trajectories)
    _write_dataset(transition_rows(loaded), out, "transitions", f"no tool call in {trajectories}", f"transitions from {len(loaded)} trajectories")


@import_app.command("awm")
def import_awm(
    directory: Annotated[Path, typer.Argument(help="Directory with the release's JSON-lines files (gen_scenario.jsonl, gen_envs.jsonl, ...).")],
    scenarios: Annotated[Optional[str], typer.Option(help="Comma-separated scenario keys to import (default: all).")] = None,
    verifier_mode: Annotated[str, typer.Option(help="code: gen_verifier.pure_code.jsonl (complete/others); sql: gen_verifier.jsonl (evidence for a judge).")] = "code",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Import AgentWorldModel-1K environments: one version per scenario, published good or failed
    with the defects found (failing seed inserts, crashing routes, raising verifiers, tasks the
    untouched database already satisfies, attempts to reach secrets or the network)."""
    from worldsmith.interop.awm import AwmFormatError
    from worldsmith.interop.catalog_import import import_release

    if verifier_mode not in ("code", "sql"):
        raise typer.BadParameter("--verifier-mode must be code or sql")
    store, catalog = _storage()
    try:
        with _runtime() as runtime:
            rows = import_release(directory, runtime, store, catalog, mode=verifier_mode,  # type: ignore[arg-type]
                                  scenarios=[s.strip() for s in scenarios.split(",") if s.strip()] if scenarios else None)
    except AwmFormatError as exc:
        errors.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        table = Table(title=f"import of {directory} ({verifier_mode} verifiers)")
        for column in ("scenario", "version", "status", "tools", "tasks", "defects"):
            table.add_column(column)
        for row in rows:
            kinds: dict[str, int] = {}
            for defect in row["defects"]:
                kinds[defect["kind"]] = kinds.get(defect["kind"], 0) + 1
            table.add_row(row["scenario"], row["ref"] or "-", row["status"], str(row["tools"]), str(row["tasks"]),
                          ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "none")
        console.print(table)
    raise typer.Exit(0 if all(row["ref"] for row in rows) else 1)


@export_app.command("awm")
def export_awm(
    set_name: Annotated[str, typer.Argument(help="Environment set to export.")],
    directory: Annotated[Path, typer.Argument(help="Directory to write the release's JSON-lines files (and solutions.json) into.")],
) -> None:
    """Write a set's environments in the AgentWorldModel-1K format: each tool module wrapped as a
    FastAPI app with one route per tool, each verifier in both modes; `import awm` takes it back."""
    from worldsmith.interop.awm_export import export_set

    store, catalog = _storage()
    with _reported():
        refs = export_set(set_name, directory, store, catalog)
    console.print(f"exported {len(refs)} environments of set {set_name} to {directory}: {', '.join(refs)}", highlight=False)


@wm_app.command("data")
def wm_data(
    trajectories: Annotated[Path, typer.Argument(help="trajectories.jsonl of an evaluation run (any policy).")],
    out: Annotated[Path, typer.Argument(help="Directory to write transitions.jsonl into.")],
    seed: Annotated[int, typer.Option(help="Seed of the environment split.")] = 0,
    validation_fraction: Annotated[float, typer.Option(help="Share of environments in the validation split.")] = 0.15,
    test_fraction: Annotated[float, typer.Option(help="Share of environments in the test split.")] = 0.15,
) -> None:
    """Replay every tool call of the trajectories in fresh episodes: (state, action) -> (observation,
    diff) transitions, split by environment (no world is in two splits)."""
    from sqlmodel import select

    from worldsmith.agent.trajectories import read_jsonl
    from worldsmith.bundle.loader import load_bundle
    from worldsmith.flows.evaluate import cached_bundle
    from worldsmith.models.catalog import EnvironmentVersion
    from worldsmith.worldmodel.transitions import build_transitions, write_transitions

    loaded = read_jsonl(trajectories)
    _, catalog = _storage()
    bundles = {}
    with catalog.session() as session:
        for key in sorted({t.env_key for t in loaded}):
            version = session.exec(select(EnvironmentVersion).where(EnvironmentVersion.content_key == key)).first()
            if version is None:
                errors.print(f"environment version {key[:12]}... of the trajectories is not in the catalog", markup=False)
                raise typer.Exit(2)
            bundles[key] = load_bundle(cached_bundle(version.ref, key))
    with _runtime() as runtime:
        transitions = build_transitions(runtime, bundles, loaded, seed=seed, validation=validation_fraction, test=test_fraction)
    if not transitions:
        errors.print(f"no tool call in {trajectories}: nothing to write")
        raise typer.Exit(2)
    path = write_transitions(transitions, out / "transitions.jsonl")
    splits = {s: len({t.env_id for t in transitions if t.split == s}) for s in ("train", "validation", "test")}
    console.print(f"{len(transitions)} transitions of {len(loaded)} trajectories: {path} (environments per split: {splits})", highlight=False)


@wm_app.command("train")
def wm_train(
    transitions: Annotated[Path, typer.Argument(help="transitions.jsonl made by `wm data` (its train split is used).")],
    model: Annotated[str, typer.Option(help="Model directory to fine-tune, or `tiny` (built offline; cpu-test).")] = "tiny",
    profile: Annotated[str, typer.Option(help="cpu-test (fp32 on the CPU) | gpu (bf16, gradient checkpointing).")] = "cpu-test",
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 60,
    learning_rate: Annotated[float, typer.Option(help="Learning rate.")] = 3e-3,
    batch_size: Annotated[int, typer.Option(help="Transitions per step.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed of initialisation and data order.")] = 0,
    output: Annotated[Optional[Path], typer.Option(help="Output directory (default WORLDSMITH_HOME/world-models/<run id>).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run's record as JSON.")] = False,
) -> None:
    """Fine-tune a causal LM (SFT with TRL) to answer a call's observation and diff as JSON; the run,
    its losses and the final model go to the catalog and the object store. Evaluate it with
    `wm eval --model hf:DIR`."""
    from worldsmith.worldmodel.training import WorldModelConfig, train_world_model
    from worldsmith.worldmodel.transitions import read_transitions

    try:
        config = WorldModelConfig(model=model, profile=profile, steps=steps, learning_rate=learning_rate, batch_size=batch_size, seed=seed,  # type: ignore[arg-type]
                                  output=str(output) if output else None)
        result = train_world_model(read_transitions(transitions), config)
    except (ValueError, FileNotFoundError, OSError) as exc:
        errors.print(str(exc).splitlines()[0], markup=False, highlight=False)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return
    losses = [entry["loss"] for entry in result["log"]]
    console.print(f"world-model run {result['run_id']}: {result['steps']} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; "
                  f"model {result['model']} (object {result['checkpoint']})", highlight=False)


@wm_app.command("eval")
def wm_eval(
    transitions: Annotated[Path, typer.Argument(help="transitions.jsonl made by `wm data`.")],
    model: Annotated[str, typer.Option(help="oracle | static | openai:MODEL (the WORLDSMITH_LLM_* endpoint) | hf:PATH (e.g. from `wm train`).")] = "oracle",
    split: Annotated[str, typer.Option(help="train | validation | test | all")] = "test",
    k: Annotated[int, typer.Option(help="Steps of the compound-error evaluation.")] = 3,
    samples: Annotated[int, typer.Option(help="Samples per call for self-consistency (1: none).")] = 1,
    max_new_tokens: Annotated[int, typer.Option(help="hf: models: tokens generated per answer at most.")] = 512,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Score a world model against the real worlds: one-step accuracy (observation, outcome, diff
    P/R/F1 at row and field level) per environment, k-step compound error, self-consistency."""
    from worldsmith.worldmodel.evaluation import evaluate_world_model
    from worldsmith.worldmodel.models import world_model
    from worldsmith.worldmodel.transitions import read_transitions

    try:
        chosen = [t for t in read_transitions(transitions) if split == "all" or t.split == split]
        wm = world_model(model, max_new_tokens=max_new_tokens)
    except (ValueError, FileNotFoundError) as exc:
        errors.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None
    if not chosen:
        errors.print(f"no transitions in split {split!r} of {transitions}")
        raise typer.Exit(2)
    report = evaluate_world_model(wm, chosen, k=k, samples=samples)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    one = report["one_step"]
    table = Table(title=f"world model {wm.name} on {one['transitions']} transitions ({split})")
    for column in ("environment", "transitions", "observation exact", "outcome agreement", "rows F1", "fields F1"):
        table.add_column(column)
    for env, scores in [*one["per_env"].items(), ("all", one)]:
        table.add_row(env, str(scores["transitions"]), f"{scores['observation_exact']:.3f}", f"{scores['outcome_agreement']:.3f}",
                      f"{scores['rows']['f1']:.3f}", f"{scores['fields']['f1']:.3f}")
    console.print(table)
    console.print("compound error by step: " + ", ".join(f"{s['step']}: {s['compound_error']:.3f}" for s in report["k_step"]["steps"]), highlight=False)


@app.command("cotrain")
def cotrain_command(
    set_name: Annotated[str, typer.Option("--set", help="Environment set: its train split is rolled out and trained on.")],
    model: Annotated[str, typer.Option(help="Policy: a model directory or `tiny` (built offline and warmed up; cpu-test).")] = "tiny",
    world_model: Annotated[str, typer.Option(help="World model to start from: a model directory or `tiny` (built offline).")] = "tiny",
    profile: Annotated[str, typer.Option(help="cpu-test | gpu, for both models.")] = "cpu-test",
    rounds: Annotated[int, typer.Option(help="Co-training rounds.")] = 3,
    policy_steps: Annotated[int, typer.Option(help="GRPO steps per round.")] = 8,
    wm_steps: Annotated[int, typer.Option(help="World-model SFT steps per round.")] = 40,
    group_size: Annotated[int, typer.Option(help="Rollouts per (env, task) row.")] = 4,
    learning_rate: Annotated[float, typer.Option(help="Policy learning rate.")] = 1e-4,
    wm_learning_rate: Annotated[float, typer.Option(help="World-model learning rate.")] = 3e-3,
    real_samples: Annotated[int, typer.Option(help="Real rollouts per train task each round.")] = 2,
    real_share: Annotated[float, typer.Option(help="Share of the policy update's rollout groups run in the real worlds.")] = 0.2,
    wm_samples: Annotated[int, typer.Option(help="World-model predictions per imagined call.")] = 3,
    uncertainty_threshold: Annotated[float, typer.Option(help="Stop an imagined rollout at a call more uncertain than this.")] = 0.5,
    max_turns: Annotated[int, typer.Option(help="Turns per rollout.")] = 6,
    max_completion_length: Annotated[int, typer.Option(help="Policy tokens per turn at most.")] = 128,
    max_new_tokens: Annotated[int, typer.Option(help="World-model tokens per prediction at most.")] = 384,
    warmup_steps: Annotated[int, typer.Option(help="--model tiny: supervised steps on the reference solutions first.")] = 60,
    seed: Annotated[int, typer.Option(help="Seed of everything.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run's record as JSON.")] = False,
) -> None:
    """Co-train a policy and a world model (the `cotrain` flow): per round, real rollouts -> world-model
    update -> GRPO on imagined rollouts mixed with real ones -> evaluation in the real worlds."""
    from worldsmith.flows.cotrain import CotrainConfig, cotrain

    try:
        config = CotrainConfig(
            policy={"model": model, "set_name": set_name, "profile": profile, "steps": policy_steps, "group_size": group_size,
                    "learning_rate": learning_rate, "max_turns": max_turns, "max_completion_length": max_completion_length,
                    "warmup_steps": warmup_steps, "seed": seed},
            world_model={"model": world_model, "profile": profile, "steps": wm_steps, "learning_rate": wm_learning_rate, "seed": seed},
            rounds=rounds, real_samples=real_samples, real_share=real_share, samples=wm_samples, uncertainty_threshold=uncertainty_threshold,
            max_new_tokens=max_new_tokens)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    result = _flow_result(lambda: cotrain(config, progress=not as_json), as_json)
    if result is None:
        return
    table = Table(title=f"co-training run {result['run_id']} on {set_name}")
    columns = {"round": "round", "real_success_rate": "real success", "wm_accuracy_fresh": "wm accuracy (fresh)", "wm_loss": "wm loss",
               "imagined_rate": "imagined", "stopped_rate": "stopped", "eval_pass@1": "eval pass@1"}
    for label in columns.values():
        table.add_column(label)
    for r in result["rounds"]:
        table.add_row(*[f"{r[k]:.3f}" if isinstance(r.get(k), float) else str(r.get(k) if r.get(k) is not None else "") for k in columns])
    console.print(table)
    console.print(f"policy: {result['policy']}\nworld model: {result['world_model']}", highlight=False)


@app.command("up")
def up(
    worker: Annotated[Optional[list[str]], typer.Option(help="Start a worker on this work pool (repeatable): local, gpu.")] = None,
    dashboard: Annotated[bool, typer.Option(help="Also serve the dashboard.")] = True,
) -> None:
    """Start the local Prefect server, create the work pools, deploy deployments/prefect.yaml, start a
    worker and the dashboard. Idempotent: what runs keeps running, nothing is duplicated."""
    from worldsmith.ops.services import ServiceError
    from worldsmith.ops.stack import Stack

    stack = Stack.from_settings(tuple(worker or ["local"]))
    try:
        with console.status("bringing the local stack up (Prefect server, pools, deployments, worker, dashboard)"):
            state = stack.up(dashboard=dashboard)
    except ServiceError as exc:
        errors.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(1) from None
    for part, what in state.items():
        console.print(f"{part}: {what}", highlight=False)
    console.print(f"Prefect UI: {stack.ui_url}", highlight=False)
    if dashboard:
        console.print(f"dashboard:  {stack.dashboard_url}", highlight=False)
    console.print(f"flows and workers use PREFECT_API_URL={stack.api_url}; stop everything with `worldsmith down`", highlight=False)


@app.command("down")
def down() -> None:
    """Stop what `worldsmith up` started (workers, dashboard, Prefect server)."""
    from worldsmith.ops.stack import Stack

    stopped = Stack.from_settings().down()
    console.print("stopped: " + ", ".join(stopped) if stopped else "nothing was running")


@app.command("dashboard")
def dashboard_command(
    host: Annotated[Optional[str], typer.Option(help="Address to listen on (default WORLDSMITH_DASHBOARD_HOST).")] = None,
    port: Annotated[Optional[int], typer.Option(help="Port (default WORLDSMITH_DASHBOARD_PORT).")] = None,
) -> None:
    """Serve the dashboard: generation outcomes per night, cost, quality, sets, evaluations, training."""
    import uvicorn

    from worldsmith.dashboard.app import dashboard_app

    settings = get_settings()
    app_ = dashboard_app(prefect_ui_url=f"http://127.0.0.1:{settings.prefect_port}")
    uvicorn.run(app_, host=host or settings.dashboard_host, port=port or settings.dashboard_port, log_level="warning")


@app.command("demo")
def demo(
    envs: Annotated[int, typer.Option(help="Environments to generate.")] = 10,
    fault_rate: Annotated[float, typer.Option(help="Share of first attempts that fail like LLM output (repairs happen).")] = 0.3,
    train_steps: Annotated[int, typer.Option(help="GRPO steps of the tiny model.")] = 8,
    warmup_steps: Annotated[int, typer.Option(help="Supervised warm-up steps of the tiny model.")] = 60,
    seed: Annotated[int, typer.Option(help="Seed of generation, curation, evaluation and training.")] = 0,
) -> None:
    """The main job on the embedded defaults: start the local stack, generate environments (faults on),
    curate them into a set, solve one over MCP, evaluate the reference and random policies, train the
    tiny model with GRPO on the CPU, and print a summary with the dashboard and Prefect UI addresses."""
    from worldsmith.demo import DemoOptions, run_demo
    from worldsmith.ops.services import ServiceError

    try:
        options = DemoOptions(envs=envs, fault_rate=fault_rate, train_steps=train_steps, warmup_steps=warmup_steps, seed=seed)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        code = run_demo(options, console)
    except ServiceError as exc:
        errors.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def main() -> None:  # pragma: no cover - console entry point
    app(prog_name="worldsmith")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
