"""Shared fixtures: the golden bundle, sandbox runtimes, and hostile variants of the golden bundle."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from worldsmith.bundle.loader import Bundle, artifact_digest, load_bundle  # noqa: E402
from worldsmith.models.bundle import ToolSchema  # noqa: E402
from worldsmith.runtime.episode import Runtime  # noqa: E402
from worldsmith.runtime.pool import SandboxLimits  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "examples" / "bundles" / "retail_store"
SHARED = REPO.parent / "shared"

#: Tight limits so hostile tests finish quickly.
FAST_LIMITS = SandboxLimits(call_timeout_s=2.0, cpu_s=1.0, memory_mb=512, file_size_mb=1, grace_s=2.0)


@pytest.fixture(scope="session", autouse=True)
def _worldsmith_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("worldsmith-home")
    os.environ["WORLDSMITH_HOME"] = str(home)
    from worldsmith.settings import get_settings

    get_settings.cache_clear()
    return home


@pytest.fixture(scope="session")
def golden() -> Bundle:
    return load_bundle(GOLDEN)


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    rt = Runtime(limits=FAST_LIMITS, workers=2)
    yield rt
    rt.close()


def with_tools(bundle: Bundle, source: str, names: list[str]) -> Bundle:
    """`bundle` with `source` appended to tools.py and `names` exposed as argument-less tools.

    Built directly, without the loader's static checks, so the run-time layers are what is tested.
    """
    files = dict(bundle.files)
    files["tools.py"] = bundle.files["tools.py"] + b"\n\n" + source.encode()
    artifacts = dict(bundle.manifest.artifacts, **{"tools.py": artifact_digest(files["tools.py"])})
    extra = [ToolSchema(name=n, description=f"test tool {n}", parameters={"type": "object", "properties": {}}) for n in names]
    return Bundle(
        manifest=bundle.manifest.model_copy(update={"artifacts": artifacts}),
        files=files,
        tasks=bundle.tasks,
        tools=bundle.tools + tuple(extra),
    )
