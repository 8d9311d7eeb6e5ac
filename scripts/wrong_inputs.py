"""A sweep of wrong inputs over every command of `worldsmith --help`: each case runs the real CLI in a
fresh WORLDSMITH_HOME (a subprocess, as an operator would) and its answer is judged:

- clean: a non-zero exit and one line (two at most: a log file named after it) with no traceback;
- traceback, long (more than two lines), flood (more than 30), silent (exit 0: the wrong input taken),
  hang (still running after the time limit).

    PYTHONPATH=$PWD .venv/bin/python scripts/wrong_inputs.py [--only WORDS] [--timeout S]

prints one row per case and the totals; exits 1 when any answer is not clean. The same table is the unit
tier's `tests/cli/test_wrong_inputs_sweep.py` (in process, no sandbox). A case's arguments may name the
sweep's files: {missing} (no such path), {empty} (an empty file), {dir} (an empty directory), {file} (a
file with text), {bad_json} (a file that is no JSON), {bad_jsonl} (JSON lines with a broken second
line), {unreadable} (a file nobody may read), {bundle} (the golden example bundle), {out} (a fresh path)
and {dead_url} (an address where nothing listens).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "examples" / "bundles" / "retail_store"


@dataclass(frozen=True)
class Case:
    """One wrong input: the command line, and the environment variables it runs with."""

    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return " ".join(self.args)


def case(*args: str, **env: str) -> Case:
    return Case(args, tuple(env.items()))


#: Every command and subcommand, each with the wrong inputs that fit it.
CASES: list[Case] = [
    # generate
    case("generate", "--count", "0"),
    case("generate", "--count", "-3"),
    case("generate", "--backend", "nosuch"),
    case("generate", "--scenarios", "{missing}"),
    case("generate", "--scenarios", "{dir}"),
    case("generate", "--scenarios", "{empty}"),
    case("generate", "--scenarios", "{bad_jsonl}"),
    case("generate", "--scenarios", "{unreadable}"),
    case("generate", "--concurrency", "0"),
    case("generate", "--fault-rate", "2"),
    case("generate", "--min-good-share", "-1"),
    case("generate", "--max-attempts", "0"),
    case("generate", "--record", "{file}", "--backend", "procedural"),
    case("generate", "--backend", "openai", WORLDSMITH_LLM_BASE_URL="{dead_url}", WORLDSMITH_LLM_API_KEY="k"),
    # curate
    case("curate", "--name", "x", "--status", "nosuch"),
    case("curate", "--name", "x", "--validation-fraction", "2"),
    case("curate", "--name", "x", "--count", "-1"),
    case("curate", "--name", "x", "--require-passed", "nosuch"),
    case("curate", "--name", "x"),
    # eval
    case("eval", "--set", "nosuch"),
    case("eval", "--set", "x", "--policy", "nosuch"),
    case("eval", "--set", "x", "--samples", "0"),
    case("eval", "--set", "x", "--split", "nosuch"),
    case("eval", "--set", "x", "--temperature", "-1"),
    case("eval", "--set", "x", "--tool-format", "nosuch"),
    case("eval", "--set", "x", "--policy", "hf:{missing}"),
    case(
        "eval", "--set", "x", "--policy", "openai:m", WORLDSMITH_LLM_BASE_URL="{dead_url}", WORLDSMITH_LLM_API_KEY="k"
    ),
    # train, resume, cotrain
    case("train", "--set", "nosuch"),
    case("train", "--set", "x", "--model", "{missing}"),
    case("train", "--set", "x", "--model", "{file}"),
    case("train", "--set", "x", "--steps", "0"),
    case("train", "--set", "x", "--learning-rate", "-1"),
    case("train", "--set", "x", "--profile", "nosuch"),
    case("train", "--set", "x", "--history", "nosuch"),
    case("train", "--set", "x", "--split", "nosuch"),
    case("resume", "999"),
    case("resume", "nosuch"),
    case("cotrain", "--set", "nosuch"),
    case("cotrain", "--set", "x", "--rounds", "0"),
    case("cotrain", "--set", "x", "--model", "{missing}"),
    case("cotrain", "--set", "x", "--world-model", "{missing}"),
    case("cotrain", "--set", "x", "--real-share", "2"),
    # the stack
    case("up", "--prefect-port", "99999"),
    case("up", "--dashboard-port", "-1"),
    case("up", "--pool-type", "nosuch"),
    case("dashboard", "--port", "99999"),
    case("dashboard", "--port", "-1"),
    case("demo", "--envs", "0"),
    case("demo", "--fault-rate", "2"),
    case("demo", "--prefect-port", "99999"),
    case("status", "--flow-runs", "-1"),
    # env
    case("env", "build", "{missing}"),
    case("env", "build", "{file}"),
    case("env", "build", "{dir}"),
    case("env", "tools", "{missing}"),
    case("env", "tools", "{empty}"),
    case("env", "call", "{bundle}", "nosuch_tool"),
    case("env", "call", "{bundle}", "get_product", "--args", "{{sku"),
    case("env", "call", "{bundle}", "get_product", "--args", "[1]"),
    case("env", "call", "{missing}", "get_product"),
    case("env", "check", "{missing}"),
    case("env", "check", "{dir}"),
    case("env", "serve", "{missing}"),
    case("env", "serve", "{bundle}", "--port", "99999"),
    case("env", "serve", "{bundle}", "--port", "-1"),
    case("env", "serve", "{bundle}", "--processes", "0"),
    case("env", "serve", "{bundle}", "--token-file", "{missing}"),
    case("env", "serve", "{bundle}", "--token-file", "{empty}"),
    case("env", "serve", "--set", "nosuch"),
    # catalog
    case("catalog", "publish", "{missing}"),
    case("catalog", "publish", "{file}"),
    case("catalog", "publish", "{dir}"),
    case("catalog", "ls", "--status", "nosuch"),
    case("catalog", "ls", "--limit", "-1"),
    case("catalog", "show", "nosuch"),
    case("catalog", "show", "nosuch@v9"),
    case("catalog", "diff", "nosuch", "other"),
    case("catalog", "fetch", "nosuch", "{out}"),
    case("catalog", "export", "{file}"),
    case("catalog", "import", "{missing}"),
    case("catalog", "import", "{file}"),
    case("catalog", "import", "{dir}"),
    # sets, tasks, runs, config, models
    case("sets", "create", "x", "--validation-fraction", "2"),
    case("sets", "create", "x", "--status", "nosuch"),
    case("sets", "create", "x"),
    case("sets", "show", "nosuch"),
    case("sets", "export", "nosuch", "{out}"),
    case("tasks", "ls", "nosuch"),
    case("tasks", "ls", "{missing}"),
    case("tasks", "ls", "{file}"),
    case("runs", "ls", "--kind", "nosuch"),
    case("runs", "ls", "--limit", "-1"),
    case("config", "set-secret", "nosuch"),
    case("models", "fetch", "999", "{out}"),
    case("models", "fetch", "nosuch", "{out}"),
    case("models", "fetch", "1", "{out}", "--step", "-1"),
    # data
    case("data", "sft", "{missing}", "{out}"),
    case("data", "sft", "{dir}", "{out}"),
    case("data", "sft", "{empty}", "{out}"),
    case("data", "sft", "{bad_jsonl}", "{out}"),
    case("data", "sft", "{unreadable}", "{out}"),
    case("data", "sft", "{bad_jsonl}", "{file}"),
    case("data", "transitions", "{missing}", "{out}"),
    case("data", "transitions", "{empty}", "{out}"),
    case("data", "transitions", "{bad_jsonl}", "{out}"),
    # import, export
    case("import", "awm", "{missing}"),
    case("import", "awm", "{file}"),
    case("import", "awm", "{dir}"),
    case("import", "awm", "{dir}", "--verifier-mode", "nosuch"),
    case("export", "awm", "nosuch", "{out}"),
    # wm
    case("wm", "data", "{missing}", "{out}"),
    case("wm", "data", "{empty}", "{out}"),
    case("wm", "data", "{bad_jsonl}", "{out}"),
    case("wm", "data", "{bad_json}", "{out}", "--validation-fraction", "2"),
    case("wm", "train", "{missing}"),
    case("wm", "train", "{empty}"),
    case("wm", "train", "{bad_jsonl}"),
    case("wm", "train", "{dir}"),
    case("wm", "train", "{empty}", "--steps", "0"),
    case("wm", "eval", "{missing}"),
    case("wm", "eval", "{bad_jsonl}"),
    case("wm", "eval", "{empty}", "--model", "nosuch"),
    case("wm", "eval", "{empty}", "--split", "nosuch"),
    case("wm", "eval", "{empty}", "--k", "0"),
]


def sweep_files(folder: Path) -> dict[str, str]:
    """The files a case's arguments may name, made under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "empty.jsonl").write_text("")
    (folder / "dir").mkdir(exist_ok=True)
    (folder / "file.txt").write_text("some text\n")
    (folder / "bad.json").write_text("{not json")
    (folder / "bad.jsonl").write_text('{"a": 1}\n{broken\n')
    unreadable = folder / "unreadable.jsonl"
    unreadable.write_text('{"a": 1}\n')
    unreadable.chmod(0)
    with socket.socket() as probe:  # a port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return {
        "missing": str(folder / "no-such-path"),
        "empty": str(folder / "empty.jsonl"),
        "dir": str(folder / "dir"),
        "file": str(folder / "file.txt"),
        "bad_json": str(folder / "bad.json"),
        "bad_jsonl": str(folder / "bad.jsonl"),
        "unreadable": str(unreadable),
        "bundle": str(GOLDEN),
        "out": str(folder / "out"),
        "dead_url": f"http://127.0.0.1:{port}/v1",
    }


def filled(item: Case, files: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The case's arguments and environment with the sweep's files named."""
    return [a.format(**files) for a in item.args], {k: v.format(**files) for k, v in item.env}


def verdict(code: int | None, output: str) -> str:
    """clean, traceback, flood, long, silent or hang (see the module docstring)."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    if code is None:
        return "hang"
    if "Traceback (most recent call last)" in output:
        return "traceback"
    if len(lines) > 30:
        return "flood"
    if code == 0:
        return "silent"
    if len(lines) > 2 or (len(lines) == 2 and not lines[1].startswith("log: ")):
        return "long"
    return "clean"


def run_case(item: Case, files: dict[str, str], env: dict[str, str], timeout: float) -> tuple[str, int | None, str]:
    """Run one case as a subprocess: its verdict, exit code (None: timed out) and output."""
    args, extra = filled(item, files)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "worldsmith.cli", *args],
            cwd=REPO,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return "hang", None, output
    output = done.stdout + done.stderr
    return verdict(done.returncode, output), done.returncode, output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="Run the cases whose command line holds these words.")
    parser.add_argument("--timeout", type=float, default=120, help="Seconds a case may run.")
    options = parser.parse_args()
    if not any(options.only in item.name for item in CASES):
        parser.error(f"no case's command line holds {options.only!r}: name words of a command, e.g. 'sets export'")
    folder = Path(tempfile.mkdtemp(prefix="worldsmith-wrong-inputs-"))
    try:
        files = sweep_files(folder / "files")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WORLDSMITH_", "PREFECT_API_URL"))}
        env |= {"WORLDSMITH_HOME": str(folder / "home"), "PREFECT_HOME": str(folder / "prefect"), "COLUMNS": "200"}
        env |= {"WORLDSMITH_PREFECT_PORT": files["dead_url"].split(":")[2].split("/")[0]}  # no stack of the host's
        totals: dict[str, int] = {}
        for item in (case for case in CASES if options.only in case.name):
            started = time.monotonic()
            judged, code, output = run_case(item, files, env, options.timeout)
            totals[judged] = totals.get(judged, 0) + 1
            first = output.strip().splitlines()[0] if output.strip() else ""
            lines = len(output.strip().splitlines())
            print(f"{judged:9} exit {code} {lines:3} lines {time.monotonic() - started:5.1f}s  {item.name}")
            shown = output.strip().splitlines() if judged != "clean" else [first]
            for line in shown[:40]:
                print(f"          {line[:300]}")
        print("totals: " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())) + f" of {sum(totals.values())}")
        return 0 if set(totals) <= {"clean"} else 1
    finally:
        if (folder / "files" / "unreadable.jsonl").exists():
            (folder / "files" / "unreadable.jsonl").chmod(0o600)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
