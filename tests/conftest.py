"""Shared fixtures: the golden bundle, sandbox runtimes, and hostile variants of the golden bundle."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Prefect attaches its console log handler to the stderr of the moment `prefect.main` is first
# imported; import it now, so that moment is not inside a CliRunner whose stream later flows find closed.
import prefect.main  # noqa: F401
import pytest
from support.limits import PATIENT_LIMITS
from support.paths import GOLDEN, REPO
from support.patience import PROCESS_S

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.loader import load_bundle
from worldsmith.runtime.episode import Runtime

pytest_plugins = ["support.tiers"]


@pytest.fixture(scope="session", autouse=True)
def _worldsmith_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("worldsmith-home")
    os.environ["WORLDSMITH_HOME"] = str(home)
    # the deep tool probes with a smaller budget (tests/quality/test_deep_probes.py runs the full one)
    os.environ["WORLDSMITH_DEEP_PROBE_BUDGET"] = "quick"
    # a developer's own ~/.config/worldsmith/worldsmith.toml or a profile in the shell changes nothing here
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("xdg-config"))
    for name in ("WORLDSMITH_CONFIG", "WORLDSMITH_PROFILE"):
        os.environ.pop(name, None)
    from worldsmith.settings import get_settings

    get_settings.cache_clear()
    return home


@pytest.fixture(scope="session")
def prefect_api():
    """One Prefect test server for the whole session (starting one costs about 10 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=PROCESS_S):
        yield os.environ.get("PREFECT_API_URL")


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh WORLDSMITH_HOME (local store and SQLite catalog) for one test."""
    from worldsmith.settings import get_settings

    monkeypatch.setenv("WORLDSMITH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WORLDSMITH_SANDBOX_WORKERS", "2")
    get_settings.cache_clear()
    yield tmp_path / "home"
    get_settings.cache_clear()


@pytest.fixture()
def tables_at_a_fixed_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI lays tables out at the terminal's width: the same width (120) for every run of a test."""
    from worldsmith.cli import console

    monkeypatch.setattr(console.console, "width", 120)


@pytest.fixture(scope="session")
def golden() -> Bundle:
    return load_bundle(GOLDEN)


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    rt = Runtime(limits=PATIENT_LIMITS, workers=2)
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, golden: Bundle) -> Path:
    """A tiny Qwen3-architecture model with random weights, built offline for the golden bundle
    and two procedural worlds."""
    from worldsmith.llm.procedural.backend import procedural_bundle
    from worldsmith.training.tiny import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-qwen3"), [golden, procedural_bundle("retail", 1), procedural_bundle("clinic", 1)]
    )


# -- storage backends ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_endpoint() -> str:
    """moto's S3 server on loopback, reached over HTTP by a real boto3 client."""
    from moto.server import ThreadedMotoServer

    from worldsmith.localserver import free_port

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture()
def s3_bucket(s3_endpoint: str) -> str:
    import uuid

    import boto3

    name = f"ws-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """A PostgreSQL server on loopback: WORLDSMITH_TEST_POSTGRES_URL (set by .ci/run), else one
    started here from the installed server binaries; skipped outside CI if there are none."""
    import subprocess

    url = os.environ.get("WORLDSMITH_TEST_POSTGRES_URL")
    started = None
    if not url:
        proc = subprocess.run([str(REPO / "scripts" / "test-postgres.sh"), "start"], capture_output=True, text=True)
        if proc.returncode != 0:
            if os.environ.get("CI"):
                pytest.fail(f"PostgreSQL is required in CI: {proc.stderr}")
            pytest.skip(f"no PostgreSQL server available: {proc.stderr.strip()}")
        url = started = proc.stdout.strip()
    yield url.split("?")[0]
    if started:
        subprocess.run([str(REPO / "scripts" / "test-postgres.sh"), "stop", started], check=False)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.sandbox)])
def catalog(request: pytest.FixtureRequest, tmp_path: Path):
    """An empty catalog on each database the catalog supports."""
    from sqlalchemy import text

    from worldsmith.storage.catalog import Catalog

    if request.param == "sqlite":
        cat = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    else:
        import uuid

        from sqlalchemy import create_engine

        base = request.getfixturevalue("postgres_url")
        name = f"ws_{uuid.uuid4().hex[:10]}"
        admin = create_engine(base.replace("postgresql://", "postgresql+psycopg://"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        cat = Catalog(base.rsplit("/", 1)[0] + f"/{name}")
    yield cat
    cat.close()


CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1800",
)


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium (Debian's chromium and chromium-driver, installed by .ci/run) driven by Selenium."""
    import shutil

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.skip(
            "browser tests need Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(PROCESS_S)
    yield driver
    driver.quit()
