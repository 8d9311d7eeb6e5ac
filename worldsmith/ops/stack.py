"""`worldsmith up` / `worldsmith down`: the local operations stack of one installation.

up: a Prefect server on 127.0.0.1 (analytics off; scheduler on, so the nightly schedule fires)
-> the work pools `local` and `gpu` -> the deployments of `deployments/prefect.yaml` -> a worker
per requested pool -> the dashboard. Every step is idempotent: what runs keeps running, pools are
created once, deploying again updates the deployments in place. down stops the services in the
reverse order. State (the server's database, pid and log files) lives under WORLDSMITH_HOME.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from worldsmith.ops.services import Service, ServiceError, log_tail
from worldsmith.settings import get_settings

#: The repository's deployment file (deployments/prefect.yaml next to the package).
DEPLOYMENTS_FILE = Path(__file__).resolve().parents[2] / "deployments" / "prefect.yaml"

#: Work pools of a worldsmith installation, with what runs on each.
POOLS = {"local": "Generation, curation and evaluation on this machine.", "gpu": "Training on GPU hosts."}


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Stack:
    """The local services of the installation rooted at `home`."""

    home: Path
    prefect_port: int
    dashboard_host: str
    dashboard_port: int
    workers: tuple[str, ...] = ("local",)
    deployments_file: Path = DEPLOYMENTS_FILE
    log: list[str] = field(default_factory=list)

    @classmethod
    def from_settings(cls, workers: tuple[str, ...] = ("local",)) -> Stack:
        settings = get_settings()
        return cls(
            settings.home.resolve(), settings.prefect_port, settings.dashboard_host, settings.dashboard_port, workers
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

    def env(self) -> dict[str, str]:
        """Environment of every service and of the flow runs workers start (absolute paths only)."""
        return {
            "WORLDSMITH_HOME": str(self.home),
            "PREFECT_HOME": os.environ.get("PREFECT_HOME", str(self.home / "prefect")),
            "PREFECT_API_URL": self.api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "GX_ANALYTICS_ENABLED": "false",
            "HF_HUB_OFFLINE": "1",
            "WORLDSMITH_DASHBOARD_URL": get_settings().resolved_dashboard_url(),
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

    def worker(self, pool: str) -> Service:
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
            "process",
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

    def ensure_pools(self) -> list[str]:
        """Create the missing work pools (process type, Prefect's default job template); returns the created ones."""
        from prefect.workers.process import ProcessWorker

        created = []
        for pool, description in POOLS.items():
            if httpx.get(f"{self.api_url}/work_pools/{pool}", timeout=10.0).status_code == 404:
                body = {
                    "name": pool,
                    "type": "process",
                    "description": description,
                    "base_job_template": ProcessWorker.get_default_base_job_template(),
                }
                response = httpx.post(f"{self.api_url}/work_pools/", json=body, timeout=10.0)
                if response.status_code not in (201, 409):  # 409: created meanwhile by another `up`
                    raise ServiceError(
                        f"creating work pool {pool!r} failed: HTTP {response.status_code} {response.text[:300]}"
                    )
                created.append(pool)
        return created

    def deploy(self) -> None:
        """`prefect deploy --all` of the deployment file against this server (updates existing deployments)."""
        if not self.deployments_file.is_file():
            raise ServiceError(
                f"deployment file {self.deployments_file} not found (run `worldsmith up` from a worldsmith checkout)"
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
                env={**os.environ, **self.env()},
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
        state = {"prefect-server": "started" if self.server().start() else "running"}
        created = self.ensure_pools()
        for pool in POOLS:
            state[f"pool {pool}"] = "created" if pool in created else "exists"
        if deploy:
            self.deploy()
            state["deployments"] = f"deployed from {self.deployments_file}"
        for pool in self.workers:
            state[f"worker-{pool}"] = "started" if self.worker(pool).start() else "running"
        if dashboard:
            state["dashboard"] = "started" if self.dashboard().start() else "running"
        return state

    def down(self) -> list[str]:
        """Stop every running service of the stack (workers and dashboard first); returns the stopped ones."""
        return [service.name for service in reversed(self.services()) if service.stop()]

    def running(self) -> dict[str, int]:
        """Pid of each running service."""
        return {service.name: pid for service in self.services() if (pid := service.pid()) is not None}
