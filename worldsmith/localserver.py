"""Local servers: a free loopback port, and an ASGI app served by uvicorn in a thread (the tests, the
benchmarks, the demo and training's rollout server use them)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Self

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class BackgroundServer:
    """Run an ASGI app under uvicorn in a thread (tests, benchmarks, the demo); `url` once started."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0):
        self.host = host
        self.port = port or free_port(host)
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self.server.run, daemon=True, name="worldsmith-gateway")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start on {self.url}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)
