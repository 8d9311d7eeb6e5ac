"""`worldsmith up` / `worldsmith down`: the local operations stack of one installation.

up: a Prefect server on 127.0.0.1 (analytics off; scheduler on, so the nightly schedule fires)
-> the work pools `local` and `gpu`, each of the type asked (process by default; docker or kubernetes
with the job templates of `deployments/`), their job templates carrying the WORLDSMITH_* settings
workers need -> the deployments of `deployments/prefect.yaml` (package data, so an installed wheel has it)
-> a worker on `local` and on each other requested pool -> the dashboard. Every step is idempotent:
what runs keeps running, pools are created once (their settings updated), deploying again updates
the deployments in place. down stops the services in the reverse order. State (the server's
database, pid and log files) lives under WORLDSMITH_HOME; the ports the running stack uses are recorded
there (`run/stack.json`), so that `status`, `down` and the commands reporting to its Prefect server find
it whatever the settings say now (`Stack.current`).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from importlib.resources import files
from pathlib import Path

import httpx

from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.ops.services import Service, ServiceError, log_tail
from worldsmith.settings import ConfigFile, get_settings

#: The deployment file and the pools' Docker and Kubernetes job templates: the repository's `deployments/`, package
#: data `worldsmith/deployments/` (a link to it in a checkout, its copy in a wheel).
DEPLOYMENTS_DIR = Path(str(files("worldsmith") / "deployments"))
DEPLOYMENTS_FILE = DEPLOYMENTS_DIR / "prefect.yaml"


class WorkPool(StrEnum):
    """The work pools of a worldsmith installation."""

    LOCAL = "local"
    GPU = "gpu"


#: What runs on each work pool.
POOLS = {
    WorkPool.LOCAL: "Generation, curation and evaluation on this machine.",
    WorkPool.GPU: "Training on GPU hosts.",
}


class PoolType(StrEnum):
    """The Prefect worker types a pool may have: a process on the worker's host, or a container per
    flow run (Docker, Kubernetes) from the job template `deployments/<pool>-<type>-job-template.json`."""

    PROCESS = "process"
    DOCKER = "docker"
    KUBERNETES = "kubernetes"


#: The package a worker of each container type needs where it runs (Prefect's integrations).
WORKER_PACKAGES: dict[str, str] = {PoolType.DOCKER: "prefect-docker", PoolType.KUBERNETES: "prefect-kubernetes"}
#: The pool every `up` starts a worker on; `--worker POOL` adds others.
DEFAULT_WORKER = WorkPool.LOCAL
#: The settings a flow run needs wherever its worker runs, carried by the pools' job templates and the
#: deployments' job variables (`env`). Never the model's API key: that is a Prefect Secret block.
WORKER_SETTINGS = ("WORLDSMITH_HOME", "WORLDSMITH_STORE_URL", "WORLDSMITH_CATALOG_URL", "WORLDSMITH_DASHBOARD_URL")


def requested_workers(extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The pools to start workers on: the default `local` one, then each of `extra` once, in order."""
    return tuple(dict.fromkeys(str(pool) for pool in (DEFAULT_WORKER, *extra)))


def job_template_file(pool: str, kind: str) -> Path:
    """The job template of `pool` on workers of type `kind` (docker, kubernetes)."""
    return DEPLOYMENTS_DIR / f"{pool}-{kind}-job-template.json"


def parse_pool_types(specs: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """`POOL=TYPE` pairs (e.g. `gpu=kubernetes`) -> {pool: type}; ServiceError naming the fix for an
    unknown pool or type, or a malformed pair."""
    types: dict[str, str] = {}
    for spec in specs:
        pool, sep, kind = spec.partition("=")
        if not sep or pool not in set(WorkPool) or kind not in set(PoolType):
            raise ServiceError(
                f"bad pool type {spec!r}: expected POOL=TYPE, POOL one of {', '.join(WorkPool)} and TYPE one of "
                f"{', '.join(PoolType)} (e.g. gpu=kubernetes)"
            )
        types[pool] = kind
    return types


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _object_at(holder: JsonObject, key: str, default: JsonObject | None = None) -> JsonObject:
    """The JSON object at `key` of a job template (`default` when absent and given; KeyError when absent)."""
    value = holder[key] if default is None else holder.get(key, default)
    if not isinstance(value, dict):
        raise ServiceError(f"a work pool's job template has {key!r} as {type(value).__name__}, not an object")
    return value


@dataclass
class Stack:
    """The local services of the installation rooted at `home`."""

    home: Path
    prefect_port: int
    dashboard_host: str
    dashboard_port: int
    workers: tuple[str, ...] = (DEFAULT_WORKER,)
    deployments_file: Path = DEPLOYMENTS_FILE
    #: {pool: type} for pools `up` creates as docker or kubernetes pools (the others: process).
    pool_types: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    @classmethod
    def current(cls, workers: tuple[str, ...] = (DEFAULT_WORKER,), pool_types: dict[str, str] | None = None) -> Stack:
        """The stack `worldsmith up` started, at the ports it recorded, while any of its services runs;
        else the one of the settings."""
        stack = cls.from_settings(workers, pool_types)
        return stack.recorded() or stack

    def recorded(self) -> Stack | None:
        """This stack at the ports `up` recorded under its home, while any of its services runs (else None)."""
        try:
            ports = json.loads(self.record_file.read_text())
            found = dataclasses.replace(
                self,
                prefect_port=int(ports["prefect_port"]),
                dashboard_host=str(ports["dashboard_host"]),
                dashboard_port=int(ports["dashboard_port"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return found if found.running() else None

    @property
    def record_file(self) -> Path:
        """Where `up` records the ports of the running stack."""
        return self.home / "run" / "stack.json"

    def with_ports(self, prefect_port: int | None = None, dashboard_port: int | None = None) -> Stack:
        """This stack on other ports (None: as it is; 0: a free port of this machine, chosen now)."""
        from worldsmith.localserver import free_port

        def chosen(port: int | None, current: int, host: str) -> int:
            return current if port is None else port or free_port(host)

        return dataclasses.replace(
            self,
            prefect_port=chosen(prefect_port, self.prefect_port, "127.0.0.1"),
            dashboard_port=chosen(dashboard_port, self.dashboard_port, self.dashboard_host),
        )

    @classmethod
    def from_settings(
        cls, workers: tuple[str, ...] = (DEFAULT_WORKER,), pool_types: dict[str, str] | None = None
    ) -> Stack:
        settings = get_settings()
        return cls(
            settings.home.resolve(),
            settings.prefect_port,
            settings.dashboard_host,
            settings.dashboard_port,
            workers,
            pool_types=dict(pool_types or {}),
        )

    # -- addresses and environment ------------------------------------------------------------

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.prefect_port}"

    @property
    def api_url(self) -> str:
        return f"{self.ui_url}/api"

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.dashboard_host}:{self.dashboard_port}"

    def worker_env(self) -> dict[str, str]:
        """The WORKER_SETTINGS of this installation, resolved (absolute home, store and catalog URLs):
        what a flow run needs on any worker host, so the job templates and job variables carry it."""
        settings = get_settings().model_copy(
            update={"home": self.home, "dashboard_host": self.dashboard_host, "dashboard_port": self.dashboard_port}
        )
        return {
            "WORLDSMITH_HOME": str(self.home),
            "WORLDSMITH_STORE_URL": settings.resolved_store_url(),
            "WORLDSMITH_CATALOG_URL": settings.resolved_catalog_url(),
            "WORLDSMITH_DASHBOARD_URL": settings.resolved_dashboard_url(),
        }

    def env(self) -> dict[str, str]:
        """Environment of every service and of the flow runs workers start (absolute paths only; the
        worldsmith.toml and profile `up` read, which the services' other working directories would miss)."""
        return {
            **ConfigFile.find().environment(),
            **self.worker_env(),
            "PREFECT_HOME": os.environ.get("PREFECT_HOME", str(self.home / "prefect")),
            "PREFECT_API_URL": self.api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "GX_ANALYTICS_ENABLED": "false",
            "HF_HUB_OFFLINE": "1",
        }

    # -- services -----------------------------------------------------------------------------

    def server(self) -> Service:
        command = [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.prefect_port),
            "--analytics-off",
        ]
        return Service(
            "prefect-server",
            command,
            self.home / "run",
            self.env(),
            lambda: _healthy(f"{self.api_url}/health"),
            signature=command[1:5],
        )

    def worker(self, pool: str, kind: str = PoolType.PROCESS) -> Service:
        """The worker of `pool`, of the pool's type `kind` (a docker or kubernetes worker starts a
        container per flow run; it needs the Prefect integration of WORKER_PACKAGES)."""
        name = f"worldsmith-{pool}"
        command = [
            sys.executable,
            "-m",
            "prefect",
            "worker",
            "start",
            "--pool",
            pool,
            "--type",
            str(kind),
            "--name",
            name,
        ]
        return Service(
            f"worker-{pool}",
            command,
            self.home / "run",
            self.env(),
            lambda: self._worker_registered(pool, name),
            signature=command[1:7],
        )

    def dashboard(self) -> Service:
        command = [
            sys.executable,
            "-m",
            "worldsmith.cli",
            "dashboard",
            "--host",
            self.dashboard_host,
            "--port",
            str(self.dashboard_port),
        ]
        return Service(
            "dashboard",
            command,
            self.home / "run",
            self.env(),
            lambda: _healthy(f"{self.dashboard_url}/healthz"),
            signature=command[1:4],
        )

    def services(self) -> list[Service]:
        """All services this stack may run, in start order (workers of both pools, so `down` finds any)."""
        return [self.server(), *(self.worker(pool) for pool in POOLS), self.dashboard()]

    def _worker_registered(self, pool: str, name: str) -> bool:
        response = httpx.post(f"{self.api_url}/work_pools/{pool}/workers/filter", json={}, timeout=5.0)
        return response.status_code == 200 and any(w["name"] == name for w in response.json())

    # -- pools and deployments ------------------------------------------------------------------

    def job_template(
        self, template: Mapping[str, JsonValue] | None = None, pool: str = WorkPool.LOCAL, kind: str = PoolType.PROCESS
    ) -> JsonObject:
        """A base job template whose `env` default carries `worker_env()` (over the template's own
        defaults): `template` when given, else the one of `pool` on `kind` workers (Prefect's process
        template; `job_template_file` for docker and kubernetes)."""
        if template is None and kind == PoolType.PROCESS:
            from prefect.workers.process import ProcessWorker

            template = ProcessWorker.get_default_base_job_template()
        elif template is None:
            template = json.loads(job_template_file(pool, kind).read_text())
        copied = copy.deepcopy(dict(template))
        env = _object_at(_object_at(_object_at(copied, "variables"), "properties"), "env")
        env["default"] = {**_object_at(env, "default", {}), **self.worker_env()}
        return copied

    def pool_type(self, pool: str) -> str:
        """The type `pool` is created with: the one asked in `pool_types`, else process."""
        return self.pool_types.get(pool, PoolType.PROCESS)

    def ensure_pools(self) -> list[str]:
        """Create the missing work pools, each of its `pool_type` with its `job_template`; in an existing
        pool's job template, bring the `env` default up to date. A pool asked for as another type than
        it has is refused (ServiceError naming the fix); one not asked for keeps its type (a docker gpu
        pool made by hand stays one). Returns the created pools."""
        created: list[str] = []
        for pool, description in POOLS.items():
            kind = self.pool_type(pool)
            found = httpx.get(f"{self.api_url}/work_pools/{pool}", timeout=10.0)
            if found.status_code == 404:
                body = {
                    "name": pool,
                    "type": str(kind),
                    "description": description,
                    "base_job_template": self.job_template(pool=pool, kind=kind),
                }
                response = httpx.post(f"{self.api_url}/work_pools/", json=body, timeout=10.0)
                if response.status_code not in (201, 409):  # 409: created meanwhile by another `up`
                    raise ServiceError(
                        f"creating work pool {pool!r} failed: HTTP {response.status_code} {response.text[:300]}"
                    )
                created.append(pool)
                continue
            found.raise_for_status()
            existing = found.json()
            if pool in self.pool_types and existing["type"] != kind:
                raise ServiceError(
                    f"work pool {pool!r} exists as a {existing['type']} pool, not {kind}: delete it "
                    f"(`prefect work-pool delete {pool}`) and run `worldsmith up` again to create it as {kind}"
                )
            if existing["type"] not in set(PoolType) or "env" not in existing["base_job_template"]["variables"].get(
                "properties", {}
            ):
                continue  # a type or template of the operator's own making: left as it is
            template = self.job_template(existing["base_job_template"])
            if template != existing["base_job_template"]:
                response = httpx.patch(
                    f"{self.api_url}/work_pools/{pool}", json={"base_job_template": template}, timeout=10.0
                )
                if response.status_code != 204:
                    raise ServiceError(
                        f"updating work pool {pool!r} failed: HTTP {response.status_code} {response.text[:300]}"
                    )
        return created

    def deploy(self) -> None:
        """`prefect deploy --all` of the deployment file against this server (updates existing deployments)."""
        if not self.deployments_file.is_file():
            raise ServiceError(
                f"deployment file {self.deployments_file} not found; reinstall worldsmith (it is package data)"
            )
        log = self.home / "run" / "deploy.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "prefect",
                    "--no-prompt",
                    "deploy",
                    "--prefect-file",
                    str(self.deployments_file),
                    "--all",
                ],
                cwd=self.deployments_file.parent,
                env={**os.environ, **self.env()},  # fills the deployments' `{{ $WORLDSMITH_* }}` job variables
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=300,
            )
        if done.returncode != 0:
            raise ServiceError(f"prefect deploy failed (exit {done.returncode}); end of {log}:\n{log_tail(log)}")

    # -- the whole stack ------------------------------------------------------------------------

    def up(self, deploy: bool = True, dashboard: bool = True) -> dict[str, str]:
        """Bring the stack up; returns what happened to each part ('started', 'running', 'created', ...)."""
        unknown = set(self.workers) - set(POOLS)
        if unknown:
            raise ServiceError(f"unknown work pool(s) {sorted(unknown)}; known: {sorted(POOLS)}")
        from worldsmith.serving.supervisor import check_port_free

        running = self.recorded()
        if running is not None and (running.prefect_port, running.dashboard_port) != (
            self.prefect_port,
            self.dashboard_port,
        ):
            raise ServiceError(
                f"the local stack runs with the Prefect server on port {running.prefect_port} and the dashboard on "
                f"port {running.dashboard_port}: stop it with `worldsmith down` before starting it on other ports"
            )
        server = self.server()
        if server.pid() is None:  # another program on the port would answer our requests, or make ours exit
            check_port_free("127.0.0.1", self.prefect_port, "--prefect-port (WORLDSMITH_PREFECT_PORT)")
        if dashboard and self.dashboard().pid() is None:
            check_port_free(
                self.dashboard_host,
                self.dashboard_port,
                "--dashboard-port (WORLDSMITH_DASHBOARD_PORT)",
                "WORLDSMITH_DASHBOARD_HOST",
            )
        self.record_file.parent.mkdir(parents=True, exist_ok=True)
        self.record_file.write_text(
            json.dumps(
                {
                    "prefect_port": self.prefect_port,
                    "dashboard_host": self.dashboard_host,
                    "dashboard_port": self.dashboard_port,
                }
            )
            + "\n"
        )
        state = {"prefect-server": "started" if server.start() else "running"}
        created = self.ensure_pools()
        kinds = self.pool_kinds()
        pool: str
        for pool in POOLS:
            kind = "" if kinds[pool] == PoolType.PROCESS else f" ({kinds[pool]})"  # the default type goes unsaid
            state[f"pool {pool}"] = ("created" if pool in created else "exists") + kind
        if deploy:
            self.deploy()
            state["deployments"] = f"deployed from {self.deployments_file}"
        for pool in self.workers:
            worker = self.worker(pool, self.worker_type(kinds[pool]))
            state[f"worker-{pool}"] = "started" if worker.start() else "running"
        if dashboard:
            state["dashboard"] = "started" if self.dashboard().start() else "running"
        return state

    def pool_kinds(self) -> dict[str, str]:
        """The type of each pool on the server."""
        return {
            pool: httpx.get(f"{self.api_url}/work_pools/{pool}", timeout=10.0).raise_for_status().json()["type"]
            for pool in POOLS
        }

    @staticmethod
    def worker_type(kind: str) -> str:
        """`kind`, once its worker can start here: ServiceError naming the package a docker or kubernetes
        worker needs when it is not installed."""
        package = WORKER_PACKAGES.get(kind)
        if package and importlib.util.find_spec(package.replace("-", "_")) is None:
            raise ServiceError(
                f"a {kind} worker needs {package}: `pip install {package}` here, or start the worker where it is "
                f"installed (`prefect worker start --pool POOL --type {kind}`)"
            )
        return kind

    def down(self) -> list[str]:
        """Stop every running service of the stack (workers and dashboard first); returns the stopped ones."""
        stopped = [service.name for service in reversed(self.services()) if service.stop()]
        self.record_file.unlink(missing_ok=True)
        return stopped

    def running(self) -> dict[str, int]:
        """Pid of each running service."""
        return {service.name: pid for service in self.services() if (pid := service.pid()) is not None}
