"""Work spread over machines (docs/operations.md, "Scaling out"): generation hosts that share nothing
but PostgreSQL and S3, the work pools' Docker and Kubernetes job templates, the train flow's
multi-node training step on the loopback rendezvous, and the worker image's Dockerfile."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from itertools import product
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.utilities.templating import apply_values, find_placeholders
from sqlalchemy import create_engine, text
from sqlmodel import select
from support.catalog import published_set
from support.paths import REPO as REPO
from support.patience import MOMENTS_S, PROCESS_S
from typer.testing import CliRunner

from worldsmith.bundle.loader import write_bundle
from worldsmith.cli import app
from worldsmith.flows.train import train_policy
from worldsmith.flows.train_node import DeploymentNodes, FlowRunNode
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.localserver import free_port
from worldsmith.models.catalog import EnvironmentVersion, StageAttempt, TrainingRun, TrainingStep
from worldsmith.ops.services import ServiceError
from worldsmith.ops.stack import (
    DEPLOYMENTS_DIR,
    WORKER_PACKAGES,
    PoolType,
    Stack,
    WorkPool,
    job_template_file,
    parse_pool_types,
)
from worldsmith.storage.catalog import Catalog, open_catalog
from worldsmith.storage.objectstore import open_store
from worldsmith.storage.publish import fetch
from worldsmith.storage.run_records import add_run
from worldsmith.training.config import TrainingConfig
from worldsmith.training.launch import (
    LaunchFailed,
    NodeOutcome,
    Rendezvous,
    TrainRequest,
    _after_node_0_failed,
    launch,
    torchrun_command,
)
from worldsmith.training.nodes import LocalNodes, ProcessNode

pytestmark = pytest.mark.e2e
#: The container worker types, and every (pool, type) that needs a job template in deployments/.
CONTAINER_TYPES = (PoolType.DOCKER, PoolType.KUBERNETES)
TEMPLATES = [(str(pool), str(kind)) for pool, kind in product(WorkPool, CONTAINER_TYPES)]
#: Fields a prefect-docker worker reads beyond those of the default template Prefect ships for it:
#: passed to docker's `containers.create` (the gpu pool's device request and /dev/shm).
DOCKER_CONFIGURATION_EXTRAS = {"container_create_kwargs"}

#: One generation host: the flow run in its own process, its results as JSON on the last line of stdout.
GENERATE = (
    "import json, sys; from worldsmith.flows.generate import run_generate; "
    "from worldsmith.tasks.parameters import GenerateParameters; "
    "results = run_generate(GenerateParameters(count=int(sys.argv[1]), seed=int(sys.argv[2]), concurrency=2, "
    "backend='procedural', min_good_share=0.0)); print(json.dumps([r.model_dump(mode='json') for r in results]))"
)


def fresh_database(server_url: str) -> str:
    """A new, empty database on the PostgreSQL server at `server_url`; returns its URL."""
    name = f"ws_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server_url.replace("postgresql://", "postgresql+psycopg://"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def test_two_generation_hosts_share_only_the_central_catalog_with_its_bucket(
    prefect_api, postgres_url, s3_endpoint, s3_bucket, tmp_path
):
    """Two generate runs at once, in separate processes with separate WORLDSMITH_HOMEs, one PostgreSQL
    catalog and one S3 bucket: their worlds overlap (the same seed) and differ (the longer run's
    extra ones). Every world is published once, none lost, every artefact fetchable from the bucket,
    and nothing lands in either home's own store or catalog."""
    from prefect.settings import PREFECT_API_URL

    catalog_url, store_url = fresh_database(postgres_url), f"s3://{s3_bucket}/fleet"
    hosts = {"a": (2, 5), "b": (1, 5)}  # home: (count, seed)
    started = {}
    for host, (count, seed) in hosts.items():
        env = {
            **os.environ,
            "WORLDSMITH_HOME": str(tmp_path / host),
            "WORLDSMITH_CATALOG_URL": catalog_url,
            "WORLDSMITH_STORE_URL": store_url,
            "WORLDSMITH_S3_ENDPOINT_URL": s3_endpoint,
            "WORLDSMITH_SANDBOX_WORKERS": "1",
            "PREFECT_API_URL": PREFECT_API_URL.value(),
        }
        started[host] = subprocess.Popen(  # output to files: a full pipe would hold one host back
            [sys.executable, "-c", GENERATE, str(count), str(seed)],
            env=env,
            cwd=tmp_path,
            stdout=(tmp_path / f"{host}.out").open("w"),
            stderr=(tmp_path / f"{host}.err").open("w"),
        )
    results = {}
    for host, process in started.items():
        assert process.wait(timeout=PROCESS_S) == 0, (tmp_path / f"{host}.err").read_text()[-3000:]
        results[host] = json.loads((tmp_path / f"{host}.out").read_text().strip().splitlines()[-1])
    reported = [r for host in results for r in results[host]]
    assert [r["status"] for r in reported] == ["good"] * len(reported), reported
    worlds = {r["env_id"] for r in reported}
    assert {r["env_id"] for r in results["b"]} < {r["env_id"] for r in results["a"]}  # overlap and difference

    catalog, store = Catalog(catalog_url), open_store(store_url, endpoint_url=s3_endpoint)
    try:
        with catalog.session() as session:
            versions = session.exec(select(EnvironmentVersion)).all()
            run_ids = set(session.exec(select(StageAttempt.run_id)).all())
        # one version per world: none duplicated by the race, none lost; each run names the one published
        assert sorted(v.env_id for v in versions) == sorted(worlds)
        assert {r["ref"] for r in reported} == {v.ref for v in versions}
        assert len(run_ids) == 2  # both runs' attempts recorded in the shared catalog
        for version in versions:
            bundle = fetch(version.ref, tmp_path / "fetched" / version.ref, store, catalog)
            assert bundle.manifest.env_id == version.env_id and bundle.key == version.content_key
    finally:
        catalog.close()
    for host in hosts:  # shared state only through PostgreSQL and S3
        assert not (tmp_path / host / "catalog.db").exists() and not (tmp_path / host / "store").exists()


# -- work pools on Docker and Kubernetes ------------------------------------------------------------


def prefect_default_template(kind: str) -> dict:
    """The base job template Prefect ships for workers of type `kind` (its collections registry)."""
    registry = files("prefect.server.api") / "collections_data" / "views" / "aggregate-worker-metadata.json"
    for workers in json.loads(registry.read_text()).values():
        if kind in workers:
            return workers[kind]["default_base_job_configuration"]
    raise LookupError(kind)


def placeholders(value: object) -> set[str]:
    return {p.name for p in find_placeholders(value)}


@pytest.mark.unit
def test_every_pool_has_a_job_template_per_container_type():
    found = {tuple(path.name.removesuffix("-job-template.json").split("-")) for path in DEPLOYMENTS_DIR.glob("*.json")}
    assert found == set(TEMPLATES)


@pytest.mark.unit
@pytest.mark.parametrize(("pool", "kind"), TEMPLATES)
def test_job_templates_fit_what_prefect_workers_of_their_type_read(pool: str, kind: str):
    """Each template against the default Prefect ships for its worker type: only fields that worker
    reads, variables of the same types, every placeholder a declared variable; rendered as a worker
    renders it (variable defaults, the deployment's `env` merged in), the flow run gets the
    installation's settings, the worker image, and a GPU on the gpu pool only."""
    template, default = json.loads(job_template_file(pool, kind).read_text()), prefect_default_template(kind)
    configuration, variables = template["job_configuration"], template["variables"]["properties"]
    extras = DOCKER_CONFIGURATION_EXTRAS if kind == PoolType.DOCKER else set()
    assert set(configuration) <= set(default["job_configuration"]) | extras
    assert placeholders(configuration) <= set(variables)
    for name, field in variables.items():
        assert field.get("description"), name
        expected = default["variables"]["properties"].get(name, {}).get("type")
        assert expected is None or field.get("type") == expected, name
    if kind == PoolType.KUBERNETES:
        manifest, shipped = configuration["job_manifest"], default["job_configuration"]["job_manifest"]
        assert (manifest["apiVersion"], manifest["kind"]) == (shipped["apiVersion"], shipped["kind"])
        (container,) = manifest["spec"]["template"]["spec"]["containers"]
        (reference,) = shipped["spec"]["template"]["spec"]["containers"]
        assert all(container[key] == reference[key] for key in ("name", "env", "image", "args"))

    settings = {key: f"value of {key}" for key in ("WORLDSMITH_HOME", "WORLDSMITH_CATALOG_URL")}
    values = {name: field["default"] for name, field in variables.items() if "default" in field}
    values["env"] = {**values["env"], **settings}  # a deployment's job variables (deployments/prefect.yaml)
    job = apply_values(configuration, values | {"command": "python -m prefect.engine"})
    assert "{{" not in json.dumps(job) and settings.items() <= job["env"].items()
    if kind == PoolType.KUBERNETES:
        (container,) = job["job_manifest"]["spec"]["template"]["spec"]["containers"]
        image, gpus = container["image"], container["resources"]["limits"].get("nvidia.com/gpu", 0)
    else:
        image = job["image"]
        gpus = sum(r["count"] for r in job.get("container_create_kwargs", {}).get("device_requests", []))
    assert (gpus > 0) == (pool == WorkPool.GPU)
    assert f"-t {image} " in (REPO / "Dockerfile").read_text()  # an image the Dockerfile's header builds


def test_up_creates_each_pool_as_the_type_asked(prefect_api, tmp_path):
    """`ensure_pools` (what `up` runs) against a Prefect server: pools created as docker and kubernetes
    pools from their job templates (the server validates them), the installation's settings in their
    `env` default; asked for another type later, a pool is refused with the fix; the CLI refuses a
    bad POOL=TYPE in one line, and a worker whose integration is not installed names the package."""
    from prefect.settings import PREFECT_API_URL

    asked = {"local": "docker", "gpu": "kubernetes"}
    stack = Stack(tmp_path, urlparse(PREFECT_API_URL.value()).port, "127.0.0.1", free_port(), pool_types=asked)
    try:
        assert sorted(stack.ensure_pools()) == sorted(asked) and stack.pool_kinds() == asked
        for pool, kind in asked.items():
            created = httpx.get(f"{stack.api_url}/work_pools/{pool}", timeout=MOMENTS_S).json()["base_job_template"]
            shipped = json.loads(job_template_file(pool, kind).read_text())
            env = created["variables"]["properties"].pop("env")["default"]
            assert env == {**shipped["variables"]["properties"].pop("env")["default"], **stack.worker_env()}
            assert created == shipped
        assert stack.ensure_pools() == []  # again: nothing created, nothing changed
        refused = Stack(
            stack.home, stack.prefect_port, "127.0.0.1", stack.dashboard_port, pool_types={"gpu": "process"}
        )
        with pytest.raises(ServiceError, match="exists as a kubernetes pool, not process: delete it"):
            refused.ensure_pools()
    finally:
        for pool in asked:
            httpx.delete(f"{stack.api_url}/work_pools/{pool}", timeout=MOMENTS_S)
    assert parse_pool_types(["gpu=kubernetes", "local=docker"]) == {"gpu": "kubernetes", "local": "docker"}
    for bad in ("gpu", "gpu=lambda", "cpu=docker"):
        answer = CliRunner().invoke(app, ["up", "--pool-type", bad])
        assert answer.exit_code == 2 and f"bad pool type {bad!r}" in answer.output and "Traceback" not in answer.output
    for kind, package in WORKER_PACKAGES.items():
        installed = importlib.util.find_spec(package.replace("-", "_")) is not None
        if not installed:
            with pytest.raises(ServiceError, match=f"pip install {package}"):
                Stack.worker_type(kind)


# -- the worker image -------------------------------------------------------------------------------


@pytest.mark.unit
def test_the_dockerfile_builds_a_worker_image_from_the_checkout():
    """Checked without docker: every path COPY takes exists in the checkout and .dockerignore keeps
    none of them out, torch is the lock's version, the build's own check (`worldsmith --version`)
    names a console script the project installs, and the command starts a Prefect worker (from the
    lock) on a pool `up` makes."""
    dockerfile = (REPO / "Dockerfile").read_text()
    lines = re.sub(r"\\\n", " ", dockerfile).splitlines()  # continuation lines joined
    copies = [source for line in lines if line.startswith("COPY ") for source in shlex.split(line)[1:-1]]
    ignored = [p for p in (REPO / ".dockerignore").read_text().splitlines() if p and not p.startswith("#")]
    assert copies and all((REPO / source).exists() for source in copies)
    assert not any(Path(source).match(pattern) or source == pattern for source in copies for pattern in ignored)
    lock = dict(line.split("==", 1) for line in (REPO / "requirements.lock").read_text().splitlines() if "==" in line)
    assert f"torch=={lock['torch'].split('+')[0]}" in dockerfile and "prefect" in lock
    assert (REPO / "worldsmith" / "deployments").resolve() == DEPLOYMENTS_DIR.resolve() == (REPO / "deployments")
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "worldsmith" in scripts and "worldsmith --version" in dockerfile
    (command,) = [json.loads(line.removeprefix("CMD ")) for line in lines if line.startswith("CMD ")]
    assert command[:3] == ["prefect", "worker", "start"] and command[command.index("--pool") + 1] in set(WorkPool)


# -- training over several machines -----------------------------------------------------------------


def test_the_train_flows_training_step_spans_two_nodes_on_the_loopback_rendezvous(home, tiny_model, tmp_path):
    """The train flow's training step with nodes=2 (docs/training.md, "Several machines"): node 0 here,
    node 1 started by the local node launcher as a process of the train-node flow's command, one
    process each, joining node 0's rendezvous on loopback (gloo on the CPU); one training step of the
    tiny model over both. The main process alone writes the step row and the result."""
    bundle = write_bundle(procedural_bundle("retail", 3), tmp_path / "retail_3")
    run_id = add_run(TrainingRun(config={}))
    config = TrainingConfig(
        model=str(tiny_model),
        set_name="none",
        group_size=2,
        steps=1,
        max_turns=1,
        max_completion_length=8,
        learning_rate=1e-4,
        nodes=2,
        rendezvous_host="127.0.0.1",
        rendezvous_timeout_s=int(PROCESS_S),  # patience: node 1 is a process started meanwhile
    )
    out = tmp_path / "out"
    result = train_policy.fn(config, str(tiny_model), [str(bundle)], run_id, str(out), False, launcher=LocalNodes())
    assert result.processes == 2 and result.steps == 1 and (out / "final" / "model.safetensors").is_file()
    assert json.loads((out / "result.json").read_text())["processes"] == 2
    assert TrainRequest.model_validate_json((out / "node-1-request.json").read_text()).config.nodes == 2
    assert "--nnodes 2 --node_rank 1" in " ".join(torchrun_command(out / "r.json", 1, 1, nodes=2, node_rank=1))
    with open_catalog().session() as session:
        steps = session.exec(select(TrainingStep).where(TrainingStep.training_run_id == run_id)).all()
    assert [s.step for s in steps] == [1]


@dataclass
class UnstartedNode:
    """A node no machine ever starts (a train-node flow run no gpu worker takes)."""

    name: str = "node 1 of 2 (flow run waiting-fox)"
    stopped: bool = False

    def outcome(self) -> NodeOutcome | None:
        return NodeOutcome(ok=False, detail="cancelled") if self.stopped else None

    def started(self) -> bool:
        return False

    def waiting_reason(self) -> str:
        return "its flow run is still Scheduled"

    def stop(self) -> None:
        self.stopped = True


@dataclass
class BrokenMachineNodes:
    """Nodes on a machine where training cannot start: a process that fails at once, as a node's
    agent does on a machine without the CUDA device its profile needs."""

    log: Path

    def start(self, request: TrainRequest, node_rank: int, rendezvous: Rendezvous) -> ProcessNode:
        failing = "raise RuntimeError('CUDA error: no CUDA-capable device is detected')"
        with self.log.open("w") as sink:
            process = subprocess.Popen([sys.executable, "-c", failing], stdout=sink, stderr=subprocess.STDOUT)
        return ProcessNode(f"node {node_rank} of {rendezvous.nodes}", process, self.log)


@dataclass
class UnstartedNodes:
    def start(self, request: TrainRequest, node_rank: int, rendezvous: Rendezvous) -> UnstartedNode:
        return UnstartedNode()


def test_a_node_that_fails_or_never_joins_fails_the_run_in_one_line_naming_it(prefect_api, home, tmp_path):
    """Node 0 waits at its rendezvous; node 1 fails at once, or never starts: the launch stops node 0
    and raises one line naming node 1 (its last error; or that it never joined within the rendezvous
    timeout), without waiting out that timeout for a failed node. Without the train-node deployment,
    `train --nodes 2` is refused in one line before any work."""
    published_set("two-nodes", [procedural_bundle("retail", 1)], 0.0)
    refused = CliRunner().invoke(app, ["train", "--set", "two-nodes", "--nodes", "2", "--steps", "1"])
    assert refused.exit_code == 2 and "train-node/train-node deployment" in refused.output, refused.output
    assert len(refused.output.strip().splitlines()) == 1 and "Traceback" not in refused.output
    request = TrainRequest(
        config=TrainingConfig(model="never-loaded", set_name="none", nodes=2, rendezvous_timeout_s=2),  # under test
        model="never-loaded",
        bundles=[],
        run_id=1,
        output=str(tmp_path / "out"),
    )
    with pytest.raises(LaunchFailed) as failed:
        launch(request, 1, BrokenMachineNodes(tmp_path / "node-1.log"))
    message = str(failed.value)
    assert "node 1 of 2" in message and "RuntimeError: CUDA error: no CUDA-capable device" in message
    assert "\n" not in message and failed.value.exit_code == 1
    with pytest.raises(LaunchFailed, match=r"node 1 of 2 \(flow run waiting-fox\) never joined .* within 2 s") as late:
        launch(request, 1, UnstartedNodes())
    assert "\n" not in str(late.value)


@dataclass
class ThirdNodeRefused:
    """Node 1 starts (a node that never runs), node 2's start is refused (its machine lacks the paths)."""

    started: list[UnstartedNode]

    def start(self, request: TrainRequest, node_rank: int, rendezvous: Rendezvous) -> UnstartedNode:
        if node_rank == 2:
            raise LaunchFailed(f"training node {node_rank}: /shared not on this machine")
        self.started.append(UnstartedNode())
        return self.started[-1]


def test_nodes_started_before_a_refused_start_are_stopped(tmp_path):
    request = TrainRequest(
        config=TrainingConfig(model="never-loaded", set_name="none", nodes=3, rendezvous_timeout_s=2),
        model="never-loaded",
        bundles=[],
        run_id=1,
        output=str(tmp_path / "out"),
    )
    launcher = ThirdNodeRefused([])
    with pytest.raises(LaunchFailed, match="training node 2: /shared not on this machine"):
        launch(request, 1, launcher)
    assert len(launcher.started) == 1 and launcher.started[0].stopped


@pytest.mark.unit
def test_a_node_not_started_is_blamed_only_when_node_0_waited_out_its_rendezvous():
    """Node 0 failed early (before its rendezvous timeout): its own failure alone, nobody named as never
    joined; node 0 failed after that timeout: the node that never started is named."""
    rendezvous = Rendezvous(host="127.0.0.1", port=1, nodes=2, timeout_s=600)
    assert _after_node_0_failed([UnstartedNode()], rendezvous, "ValueError: bad model", waited_out=False) == ""
    with pytest.raises(LaunchFailed, match=r"never joined .* within 600 s .*; node 0: ValueError: bad model"):
        _after_node_0_failed([UnstartedNode()], rendezvous, "ValueError: bad model", waited_out=True)


class FailingPrefectApi(BaseHTTPRequestHandler):
    """A Prefect API in trouble: every request answered 500."""

    def do_GET(self) -> None:
        self.send_error(500)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.unit
def test_a_flow_run_node_outlives_a_failing_prefect_api_for_a_while_then_fails_in_one_line():
    """While the Prefect API fails, a node of a flow run counts as running (and started, so never
    blamed for not joining); past its patience, one line naming the API."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), FailingPrefectApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = f"http://127.0.0.1:{server.server_address[1]}/api"
    node = FlowRunNode("node 1 of 2 (flow run quiet-owl)", uuid.uuid4(), patience_s=0.5)  # the limit under test
    try:
        with temporary_settings({PREFECT_API_URL: api}):
            assert node.outcome() is None and node.started()
            time.sleep(node.patience_s * 1.2)  # past its patience
            with pytest.raises(LaunchFailed) as failed:
                node.outcome()
    finally:
        server.shutdown()
    message = str(failed.value)
    assert api in message and "node 1 of 2 (flow run quiet-owl)" in message and "\n" not in message


def test_stopping_a_flow_run_node_not_yet_started_cancels_it(prefect_api):
    """A node's flow run still Scheduled has no process to end: stopping it makes it Cancelled, not
    Cancelling forever."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    @flow(name="never-run-node")
    def never_run() -> None: ...

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(never_run, state=Scheduled())
        FlowRunNode("node 1 of 2", run.id).stop()
        assert client.read_flow_run(run.id).state.is_cancelled()


def test_a_node_the_prefect_api_refuses_to_start_fails_in_one_line(prefect_api, tmp_path):
    """The train-node deployment gone since the check (or the API down): one line naming the node."""
    request = TrainRequest(
        config=TrainingConfig(model="tiny", set_name="s", nodes=2),
        model="tiny",
        bundles=[],
        run_id=7,
        output=str(tmp_path),
    )
    with pytest.raises(LaunchFailed, match="training node 1 of 2 could not be started as a run of no-such/deployment"):
        DeploymentNodes("no-such/deployment").start(request, 1, Rendezvous(host="127.0.0.1", port=1, nodes=2))


def test_a_node_whose_flow_run_was_deleted_fails_in_one_line(prefect_api):
    import uuid

    with pytest.raises(LaunchFailed, match="its flow run .* no longer exists"):
        FlowRunNode("node 1 of 2", uuid.uuid4()).outcome()
