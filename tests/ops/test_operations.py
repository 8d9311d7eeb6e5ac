"""Operations against a real local Prefect server started by the suite: `worldsmith up` / `down`,
the deployments of deployments/prefect.yaml, runs through `prefect worker start --run-once`, and
the Prefect UI in headless Chromium. First, what needs no server: the deployments' forms, the gpu
pool's job templates, and the deployment file inside a built wheel.

The tests of this module that use the stack share it and run in file order; the last one stops it.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from prefect.utilities.callables import parameter_schema
from prefect.utilities.templating import apply_values
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from sqlmodel import select
from support.paths import REPO as REPO
from support.patience import MOMENTS_S, PROCESS_S
from support.processes import killed_after

from worldsmith.localserver import free_port
from worldsmith.models.catalog import Checkpoint, EnvironmentVersion, TrainingRun, TrainingStep
from worldsmith.ops.orchestration import stalled_deployments
from worldsmith.ops.stack import DEPLOYMENTS_DIR, DEPLOYMENTS_FILE, WORKER_SETTINGS, Stack
from worldsmith.stages.attempts import pipeline_position
from worldsmith.storage.catalog import Catalog

pytestmark = pytest.mark.unit  # what needs no server; the tests of the stack are e2e (its tier's hang guard)
DEPLOYMENTS = {
    "nightly-generation": ("generate", "local"),
    "curate": ("curate", "local"),
    "evaluate": ("evaluate", "local"),
    "train": ("train", "gpu"),
    "train-node": ("train-node", "gpu"),
    "resume-training": ("resume-training", "gpu"),
    "cotrain": ("cotrain", "gpu"),
}
#: Flow parameters for callers (the CLI, other flows), never on a deployment's form.
INTERNAL_PARAMETERS = {"progress", "resume"}
GPU_JOB_TEMPLATES = ("gpu-docker-job-template.json", "gpu-kubernetes-job-template.json")


def _deployment_specs() -> dict[str, dict]:
    return {d["name"]: d for d in yaml.safe_load(DEPLOYMENTS_FILE.read_text())["deployments"]}


def _undescribed(schema: dict) -> list[str]:
    """The form fields of a parameter schema without a description: parameters and nested model fields."""
    missing = [name for name, field in schema["properties"].items() if not field.get("description")]
    for model, definition in schema.get("definitions", {}).items():
        missing += [
            f"{model}.{name}"
            for name, field in definition.get("properties", {}).items()
            if not field.get("description")
        ]
    return missing


def _form_schemas() -> dict[str, dict]:
    """The schemas `prefect deploy` sends for the deployments' run forms (what the Prefect UI renders)."""
    schemas = {}
    for name, spec in _deployment_specs().items():
        module, function = spec["entrypoint"].rsplit(".", 1)
        schemas[name] = parameter_schema(getattr(importlib.import_module(module), function).fn).model_dump()
    return schemas


def test_every_deployment_form_field_has_a_description():
    for name, schema in _form_schemas().items():
        assert _undescribed(schema) == [], name


def test_no_deployment_form_shows_an_internal_parameter():
    for name, schema in _form_schemas().items():
        assert not INTERNAL_PARAMETERS & set(schema["properties"]), name


def test_every_deployment_carries_the_worker_settings_but_no_secret():
    for name, spec in _deployment_specs().items():
        env = spec["work_pool"]["job_variables"]["env"]
        assert env == {key: f"{{{{ ${key} }}}}" for key in WORKER_SETTINGS}, name
    assert not any("KEY" in key or "SECRET" in key for key in WORKER_SETTINGS)


def test_the_gpu_forms_default_to_the_gpu_profile():
    specs = _deployment_specs()
    assert specs["train"]["parameters"]["config"]["profile"] == "gpu"
    cotrain = specs["cotrain"]["parameters"]["config"]
    assert cotrain["policy"]["profile"] == cotrain["world_model"]["profile"] == "gpu"


#: A deployment's job variables for `env`, as a worker merges them into the job template's.
DEPLOYMENT_ENV = {key: f"value of {key}" for key in WORKER_SETTINGS}


def _rendered(template: str) -> tuple[dict, dict]:
    """The job `template` renders as a worker renders it (variable defaults, the deployment's job
    variables merged into `env` (prefect.workers.base), placeholders filled), and its variables."""
    base = json.loads((DEPLOYMENTS_DIR / template).read_text())
    properties = base["variables"]["properties"]
    variables = {name: field["default"] for name, field in properties.items() if "default" in field}
    variables["env"] = {**variables["env"], **DEPLOYMENT_ENV}
    variables.setdefault("command", "python -m prefect.engine")
    return apply_values(base["job_configuration"], variables), variables


@pytest.mark.parametrize("template", GPU_JOB_TEMPLATES)
def test_a_gpu_job_template_describes_every_variable(template: str):
    properties = json.loads((DEPLOYMENTS_DIR / template).read_text())["variables"]["properties"]
    assert all(field.get("description") for field in properties.values())


@pytest.mark.parametrize("template", GPU_JOB_TEMPLATES)
def test_a_gpu_job_template_passes_the_deployments_env(template: str):
    job, _ = _rendered(template)
    assert job["env"]["HF_HUB_OFFLINE"] == "1" and DEPLOYMENT_ENV.items() <= job["env"].items()


@pytest.mark.parametrize("template", GPU_JOB_TEMPLATES)
def test_a_gpu_job_template_requests_one_gpu_in_its_image(template: str):
    job, variables = _rendered(template)
    if "job_manifest" in job:  # kubernetes
        (container,) = job["job_manifest"]["spec"]["template"]["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert container["resources"]["requests"]["nvidia.com/gpu"] == 1
        assert container["image"] == variables["image"] and container["env"] == job["env"]
    else:  # docker
        (request,) = job["container_create_kwargs"]["device_requests"]
        assert request["count"] == 1 and request["capabilities"] == [["gpu"]] and job["image"] == variables["image"]


@pytest.mark.e2e
def test_up_finds_the_deployments_inside_a_built_wheel(tmp_path: Path):
    """`pip wheel` of the project's files (a copy: the build writes into its tree), then the module
    `up` uses, imported from the unpacked wheel (no checkout around it), names the wheel's prefect.yaml."""
    source = tmp_path / "source"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        origin, target = REPO / name, source / name
        if origin.is_symlink() or origin.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target, follow_symlinks=False)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(source),
            "-w",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = tmp_path.glob("worldsmith-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"worldsmith/deployments/{n}" for n in ("prefect.yaml", *GPU_JOB_TEMPLATES)} <= names
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(wheel).extractall(unpacked)
    found = subprocess.run(
        [sys.executable, "-c", "from worldsmith.ops.stack import Stack; print(Stack.from_settings().deployments_file)"],
        env={**os.environ, "PYTHONPATH": str(unpacked)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
    )
    assert found.returncode == 0, found.stderr
    path = Path(found.stdout.strip())
    assert path.is_relative_to(unpacked) and path.read_text() == DEPLOYMENTS_FILE.read_text()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    """A local stack without workers (runs go through `--run-once` workers) and without the dashboard."""
    home = tmp_path_factory.mktemp("ops-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFECT_HOME", str(home / "prefect"))
        stack = Stack(
            home=home, prefect_port=free_port(), dashboard_host="127.0.0.1", dashboard_port=free_port(), workers=()
        )
        stack.up(dashboard=False)
        yield stack
        stack.down()


def _cli(stack: Stack, *args: str) -> subprocess.CompletedProcess:
    """Run the `prefect` CLI against the stack's server, in the stack's environment (as a worker host would)."""
    return subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", *args],
        cwd=REPO,
        env={**os.environ, **stack.env()},
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
    )


def _api(stack: Stack, method: str, path: str, **body) -> object:
    response = httpx.request(
        method, f"{stack.api_url}{path}", json=body if method == "POST" else None, timeout=MOMENTS_S
    )
    response.raise_for_status()
    return response.json()


def _deployments(stack: Stack) -> dict[str, dict]:
    return {d["name"]: d for d in _api(stack, "POST", "/deployments/filter")}


def _run_through_worker(stack: Stack, deployment: str, pool: str, parameters: dict) -> dict:
    """`prefect deployment run` then `prefect worker start --run-once` on `pool`; returns the flow run."""
    started = _cli(stack, "deployment", "run", deployment, "--params", json.dumps(parameters))
    assert started.returncode == 0, started.stdout + started.stderr
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", started.stdout).group(1)
    worked = _cli(stack, "worker", "start", "--pool", pool, "--type", "process", "--run-once")
    assert worked.returncode == 0, worked.stdout[-3000:] + worked.stderr[-3000:]
    flow_run = _api(stack, "GET", f"/flow_runs/{flow_run_id}")
    assert flow_run["state"]["type"] == "COMPLETED", (flow_run["state"], worked.stdout[-3000:] + worked.stderr[-3000:])
    return flow_run


def _catalog(stack: Stack) -> Catalog:
    return Catalog(f"sqlite:///{stack.home / 'catalog.db'}")


def _pools(stack: Stack) -> dict[str, dict]:
    return {p["name"]: p for p in _api(stack, "POST", "/work_pools/filter")}


@pytest.mark.e2e
def test_up_creates_both_work_pools(stack):
    pools = _pools(stack)
    assert {name: pools[name]["type"] for name in ("local", "gpu")} == {"local": "process", "gpu": "process"}


@pytest.mark.e2e
def test_up_deploys_every_deployment_to_its_pool_on_its_schedule(stack):
    deployments = _deployments(stack)
    assert set(deployments) == set(DEPLOYMENTS)
    flows = {f["id"]: f["name"] for f in _api(stack, "POST", "/flows/filter")}
    for name, (flow, pool) in DEPLOYMENTS.items():
        assert (flows[deployments[name]["flow_id"]], deployments[name]["work_pool_name"]) == (flow, pool)
    (schedule,) = deployments["nightly-generation"]["schedules"]
    assert (
        schedule["active"] and schedule["schedule"]["cron"] == "0 2 * * *" and schedule["schedule"]["timezone"] == "UTC"
    )
    assert all(
        not deployments[name]["schedules"] for name in ("curate", "evaluate", "train", "resume-training", "cotrain")
    )
    assert deployments["nightly-generation"]["parameters"] == {
        "params": {"count": 10, "backend": None, "model": None, "scenario_file": None, "seed": None, "record": None}
    }


@pytest.mark.e2e
def test_the_deployed_forms_are_the_typed_parameter_models(stack):
    deployments = _deployments(stack)
    # the training deployment's form is the typed TrainingConfig: nested fields, descriptions, enums
    schema = deployments["train"]["parameter_openapi_schema"]
    config = schema["definitions"]["TrainingConfig"]
    assert schema["properties"]["config"]["$ref"] == "#/definitions/TrainingConfig" and schema["required"] == ["config"]
    assert config["properties"]["history"]["enum"] == ["windowed", "full"]
    assert config["properties"]["profile"]["enum"] == ["cpu-test", "gpu"]
    assert (
        config["properties"]["group_size"]["default"] == 16
        and "advantages" in config["properties"]["group_size"]["description"]
    )
    assert config["properties"]["lora"]["$ref"] == "#/definitions/LoraConfig"
    assert config["properties"]["simulate"]["anyOf"][0]["$ref"] == "#/definitions/SimulationConfig"
    assert all(not INTERNAL_PARAMETERS & set(d["parameter_openapi_schema"]["properties"]) for d in deployments.values())
    # the gpu pool's forms default to the gpu profile
    assert deployments["train"]["parameters"] == {"config": {"profile": "gpu"}}
    assert deployments["cotrain"]["parameters"]["config"]["policy"] == {"profile": "gpu"}
    # resuming a stopped run from the UI takes the run's id alone
    resume = deployments["resume-training"]["parameter_openapi_schema"]
    assert resume["required"] == ["run_id"] and resume["properties"]["run_id"]["type"] == "integer"
    # the co-training form nests the policy's TrainingConfig and the world model's WorldModelConfig
    cotrain = deployments["cotrain"]["parameter_openapi_schema"]
    knobs = cotrain["definitions"]["CotrainConfig"]["properties"]
    assert (
        knobs["policy"]["$ref"] == "#/definitions/TrainingConfig"
        and knobs["world_model"]["$ref"] == "#/definitions/WorldModelConfig"
    )
    assert knobs["real_share"]["default"] == 0.2 and "uncertainty" in knobs["uncertainty_threshold"]["description"]


@pytest.mark.e2e
def test_the_worker_settings_travel_with_the_pools_to_every_deployment(stack):
    """What a worker's flow runs need, resolved at deploy time."""
    settings, pools = stack.worker_env(), _pools(stack)
    assert settings["WORLDSMITH_HOME"] == str(stack.home) and set(settings) == set(WORKER_SETTINGS)
    assert all(pools[p]["base_job_template"]["variables"]["properties"]["env"]["default"] == settings for p in pools)
    assert all(d["job_variables"] == {"env": settings} for d in _deployments(stack).values())


@pytest.mark.e2e
def test_without_a_live_worker_every_deployment_says_how_to_start_one(stack):
    stalled = {d.name: d.problem for d in stalled_deployments(stack.api_url)}
    assert set(stalled) == {f"{flow}/{name}" for name, (flow, _) in DEPLOYMENTS.items()}
    assert "no live worker" in stalled["train/train"] and "worldsmith up --worker gpu" in stalled["train/train"]
    assert stalled_deployments(f"http://127.0.0.1:{free_port()}/api") is None


@pytest.mark.e2e
def test_the_gpu_job_templates_are_valid_work_pool_templates_for_prefect(stack):
    for kind, template in zip(("docker", "kubernetes"), GPU_JOB_TEMPLATES):
        body = json.loads((DEPLOYMENTS_DIR / template).read_text())
        created = httpx.post(
            f"{stack.api_url}/work_pools/",
            json={"name": f"gpu-{kind}", "type": kind, "base_job_template": body},
            timeout=MOMENTS_S,
        )
        assert created.status_code == 201, created.text
        assert httpx.delete(f"{stack.api_url}/work_pools/gpu-{kind}", timeout=MOMENTS_S).status_code == 204


@pytest.mark.e2e
def test_prefect_deploy_again_updates_in_place(stack):
    before = _deployments(stack)
    deployed = _cli(stack, "deploy", "--prefect-file", str(DEPLOYMENTS_FILE), "--all")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    after = _deployments(stack)
    assert {n: d["id"] for n, d in after.items()} == {n: d["id"] for n, d in before.items()}
    assert len(after["nightly-generation"]["schedules"]) == 1


@pytest.mark.e2e
def test_generation_deployment_runs_through_a_worker(stack):
    flow_run = _run_through_worker(
        stack,
        "generate/nightly-generation",
        "local",
        {"params": {"count": 2, "seed": 11, "fault_rate": 0.5, "concurrency": 2}},
    )
    with _catalog(stack).session() as session:
        versions = session.exec(select(EnvironmentVersion)).all()
    assert len(versions) == 2 and {v.status for v in versions} == {"good"}
    # runs and task runs named after what they do; each repair logged with its world, stage and error class
    assert flow_run["name"] == "generate-2x-procedural"
    task_runs = {
        t["name"] for t in _api(stack, "POST", "/task_runs/filter", flow_runs={"id": {"any_": [flow_run["id"]]}})
    }
    assert {f"tools-{v.env_id}" for v in versions} | {"scenario-2x"} <= task_runs
    logs = [
        entry["message"]
        for entry in _api(stack, "POST", "/logs/filter", logs={"flow_run_id": {"any_": [flow_run["id"]]}})
    ]
    repairs = [m for m in logs if re.fullmatch(r"world \S+: \S+ attempt \d+ failure \(\w+\)", m)]
    assert repairs and {m.split()[1].rstrip(":") for m in repairs} <= {v.env_id for v in versions} | {"-"}
    artifacts = _api(stack, "POST", "/artifacts/filter", artifacts={"flow_run_id": {"any_": [flow_run["id"]]}})
    summary = next(a for a in artifacts if a["key"] == "generation-summary")
    assert (
        "2 of 2 environments good: 2 published as good" in summary["data"]
        and f"{stack.env()['WORLDSMITH_DASHBOARD_URL']}/#generation" in summary["data"]
    )
    assert {"generation-stages", "generation-environments"} <= {a["key"] for a in artifacts if a["type"] == "table"}
    stages_table = next(a for a in artifacts if a["key"] == "generation-stages")["data"]
    stages = [row["stage"] for row in (json.loads(stages_table) if isinstance(stages_table, str) else stages_table)]
    assert stages == sorted(stages, key=pipeline_position) and stages[0] == "scenario"


@pytest.mark.e2e
def test_a_training_run_killed_in_its_worker_resumes_through_the_deployments(stack):
    """The `curate` deployment makes set `ops` of the worlds generated above; a `train` flow run of it
    through a gpu worker, whose process is SIGKILLed once it has written step 2's metrics row (after
    its step-1 checkpoint), is marked crashed by the worker and its hook marks the catalog row crashed; the
    `resume-training` deployment then finishes the run from that checkpoint."""
    curated = _run_through_worker(
        stack, "curate/curate", "local", {"params": {"name": "ops", "query": {"validation_fraction": 0.5}}}
    )
    assert curated["name"] == "curate-ops"
    config = {
        "model": "tiny",
        "set_name": "ops",
        "steps": 3,
        "save_every": 1,
        "group_size": 2,
        "warmup_steps": 1,
        "max_turns": 2,
        "max_completion_length": 16,
        "learning_rate": 1e-4,
    }
    started = _cli(stack, "deployment", "run", "train/train", "--params", json.dumps({"config": config}))
    assert started.returncode == 0, started.stdout + started.stderr
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", started.stdout).group(1)
    # the flow run's process, started by the worker with the worker's environment, kills itself at that point
    env = {**os.environ, **stack.env(), **killed_after("worldsmith.storage.run_records:record_step", 2)}
    worked = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect",
            "--no-prompt",
            "worker",
            "start",
            "--pool",
            "gpu",
            "--type",
            "process",
            "--run-once",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=PROCESS_S,
    )
    output = worked.stdout.decode(errors="replace")
    killed_run = _api(stack, "GET", f"/flow_runs/{flow_run_id}")
    assert killed_run["state"]["type"] == "CRASHED", output[-3000:]
    with _catalog(stack).session() as session:
        (run,) = session.exec(select(TrainingRun)).all()
        steps = session.exec(select(TrainingStep).where(TrainingStep.training_run_id == run.id)).all()
        checkpoints = session.exec(select(Checkpoint).where(Checkpoint.training_run_id == run.id)).all()
    killed = run.id
    assert run.flow_run_id == flow_run_id and run.config["set_name"] == "ops"
    assert (
        killed_run["name"] == "train-ops" and run.config["profile"] == "cpu-test"
    )  # the run's config replaces the form's
    assert sorted(s.step for s in steps) == [1, 2] and [c.step for c in checkpoints] == [1], output[-3000:]
    assert run.status == "crashed" and run.metrics["error"].startswith("crashed:"), (
        run.status,
        run.metrics,
        output[-3000:],
    )

    resumed = _run_through_worker(stack, "resume-training/resume-training", "gpu", {"run_id": killed})
    with _catalog(stack).session() as session:
        run = session.get(TrainingRun, killed)
        steps = session.exec(
            select(TrainingStep).where(TrainingStep.training_run_id == killed).order_by(TrainingStep.step)
        ).all()
        checkpoints = session.exec(
            select(Checkpoint).where(Checkpoint.training_run_id == killed).order_by(Checkpoint.id)
        ).all()
    assert (
        run.status == "completed" and [s.step for s in steps] == [1, 2, 3] and run.metrics["resumed_from_steps"] == [1]
    )
    assert run.flow_run_id != flow_run_id and resumed["state"]["type"] == "COMPLETED"
    assert [c.step for c in checkpoints] == [1, 2, 3, 3]  # the trainer's, then the final model
    artifacts = _api(stack, "POST", "/artifacts/filter", artifacts={"flow_run_id": {"any_": [run.flow_run_id]}})
    assert {"training-summary", "training-steps"} <= {a["key"] for a in artifacts}


@pytest.mark.e2e
def test_prefect_ui_lists_every_deployment_with_its_schedule(stack, browser):
    browser.get(f"{stack.ui_url}/deployments")
    WebDriverWait(browser, PROCESS_S).until(
        lambda d: all(name in d.find_element(By.TAG_NAME, "body").text for name in DEPLOYMENTS)
    )
    assert "At 02:00 AM every day" in browser.find_element(By.TAG_NAME, "body").text


@pytest.mark.e2e
def test_prefect_ui_renders_the_training_form_from_its_model(stack, browser):
    train_id = _deployments(stack)["train"]["id"]
    browser.get(f"{stack.ui_url}/deployments/deployment/{train_id}/run")
    labels = (
        "Model",
        "Set Name",
        "Profile (Optional)",
        "Group Size (Optional)",
        "Learning Rate (Optional)",
        "History (Optional)",
        "Window (Optional)",
        "Lora (Optional)",
        "Rank (Optional)",
    )
    WebDriverWait(browser, PROCESS_S).until(
        lambda d: "Group Size (Optional)" in d.find_element(By.TAG_NAME, "body").text
    )
    text = browser.find_element(By.TAG_NAME, "body").text
    assert all(label in text for label in labels)
    assert "Rollouts per (env, task) row; advantages are normalised within the group." in text
    choices = [
        [o.text for o in s.find_elements(By.TAG_NAME, "option")] for s in browser.find_elements(By.TAG_NAME, "select")
    ]
    assert ["cpu-test", "gpu"] in choices and ["windowed", "full"] in choices


def _worker_processes(home: Path) -> int:
    count = 0
    for process in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline, environ = process.info["cmdline"] or [], process.info["environ"] or {}
        except psutil.Error:
            continue
        count += "worker" in cmdline and "start" in cmdline and environ.get("WORLDSMITH_HOME") == str(home)
    return count


@pytest.mark.e2e
def test_up_again_duplicates_nothing_then_down_stops_everything(stack, tmp_path: Path):
    """`worldsmith up --worker gpu` (the CLI, configured by environment variables) adds a gpu worker
    to the local one; `up` again with the same workers starts and deploys nothing twice."""
    full = Stack(stack.home, stack.prefect_port, stack.dashboard_host, stack.dashboard_port, workers=("local", "gpu"))
    env = {
        **os.environ,
        "PREFECT_HOME": stack.env()["PREFECT_HOME"],
        "WORLDSMITH_HOME": str(stack.home),
        "WORLDSMITH_PREFECT_PORT": str(stack.prefect_port),
        "WORLDSMITH_DASHBOARD_HOST": stack.dashboard_host,
        "WORLDSMITH_DASHBOARD_PORT": str(stack.dashboard_port),
    }
    first = subprocess.run(
        [sys.executable, "-m", "worldsmith.cli", "up", "--worker", "gpu", "--worker", "local"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    for line in ("prefect-server: running", "worker-local: started", "worker-gpu: started", "dashboard: started"):
        assert line in first.stdout, first.stdout
    assert f"export PREFECT_API_URL={full.api_url}" in first.stdout
    assert stalled_deployments(full.api_url) == []  # a live worker on each pool
    pids, deployments = full.running(), {n: d["id"] for n, d in _deployments(full).items()}
    second = full.up()
    assert {second[k] for k in ("prefect-server", "worker-local", "worker-gpu", "dashboard")} == {"running"}
    assert second["pool local"] == second["pool gpu"] == "exists"
    assert full.running() == pids and {n: d["id"] for n, d in _deployments(full).items()} == deployments
    assert len(_deployments(full)["nightly-generation"]["schedules"]) == 1
    assert len(_api(full, "POST", "/work_pools/filter")) == 2 and _worker_processes(full.home) == 2
    assert httpx.get(f"{full.dashboard_url}/healthz", timeout=MOMENTS_S).text == "ok"

    assert set(full.down()) == {"worker-local", "worker-gpu", "dashboard", "prefect-server"}
    assert full.running() == {} and _worker_processes(full.home) == 0
    with pytest.raises(httpx.ConnectError):  # refused: no server there (a slow one would answer within MOMENTS_S)
        httpx.get(f"{full.api_url}/health", timeout=MOMENTS_S)
    assert full.down() == []
