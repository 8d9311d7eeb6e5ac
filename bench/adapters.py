"""Episodes per second through each adapter and thin client against direct runtime calls, in one run.

    .venv/bin/python bench/adapters.py [--rounds 3] [--threads 1] [--workers 2] [--clients]

Every way plays the same episodes on one runtime: each task of the example world (examples/bundles/
retail_store), its reference solution then its answer, verified. `direct`: `Runtime.open_episode`,
`call_tool` per call, `verify` (the runtime alone); `loop`: `run_episode` with the reference policy
(worldsmith's own evaluator: a snapshot and a diff per call, the side-effect guard); then the
environment object (`WorldEnv`: reset, step, verify, which does what the loop does) and each adapter on it:
Gymnasium (`WorldGymEnv`, calls as `<tool_call>` text), SkyRL-gym (`skyrl_gym.make`, init, step) and TRL
(the `environment_factory` instance's tool methods, then `world_reward`). One warm-up round first (workers
started, the world loaded, the reference footprints cached). Prints episodes/s of each and its ratio to
`direct` and to `loop`; the last line is JSON.

`--clients` adds the thin clients (clients/<name>, each in its cached environment: tests/support/
client_venvs.py) against the same world served by `worldsmith env serve --protocol openenv --verdicts`,
one episode at a time: `openenv` (OpenEnv's client `WorldEnv`: reset, call_tool, submit on one
connection), `verl` (`WorldSession` per episode: its WebSocket, reset, call, submit) and `verifiers`
(verifiers' own rollout, `Env.run_slot`, its harness's chat program per turn, the model a scripted one
replying the reference solution over HTTP: tests/support/scripted_model.py; the rollouts those of
tests/support/client_scripts/verifiers_rollouts.py, as tests/integrations/test_verifiers.py runs them). Each
client process warms up with one round, then times its rounds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # support.client_venvs, support.scripted_model: the clients' environments

from worldsmith.agent.loop import run_episode
from worldsmith.agent.policies import ReferencePolicy
from worldsmith.bundle.loader import load_bundle
from worldsmith.integrations.environment import TaskRef, WorldEnv, world_name
from worldsmith.models.bundle import TaskSpec
from worldsmith.runtime.episode import Runtime

BUNDLE = load_bundle(REPO / "examples" / "bundles" / "retail_store")
TASKS = list(BUNDLE.tasks)


def text_call(tool: str, arguments: dict) -> str:
    return f"<tool_call>{json.dumps({'name': tool, 'arguments': arguments})}</tool_call>"


def ways(runtime: Runtime, env: WorldEnv) -> dict[str, Callable[[TaskSpec], float | None]]:
    """Each way of playing one task's reference solution: returns the reward (direct: 1.0 when complete)."""
    import skyrl_gym

    from worldsmith.integrations.gymnasium_env import WorldGymEnv
    from worldsmith.integrations.skyrl_env import use_env
    from worldsmith.integrations.trl_env import environment_factory, world_reward

    name = world_name(BUNDLE)
    factory = environment_factory(env)[name]
    use_env(env)

    def direct(task: TaskSpec) -> float | None:
        with runtime.open_episode(BUNDLE, task) as episode:
            for step in task.solution:
                episode.call_tool(step.tool, step.arguments)
            return 1.0 if episode.verify(task.answer or "Done.").status == "complete" else 0.0

    def loop(task: TaskSpec) -> float | None:
        return run_episode(runtime, BUNDLE, task, ReferencePolicy()).reward

    def environment(task: TaskSpec) -> float | None:
        with env.reset(TaskRef(name, task.id)) as episode:
            for step in task.solution:
                episode.step({"name": step.tool, "arguments": step.arguments})
            episode.step(task.answer or "Done.")
            return episode.verify().reward

    def gymnasium(task: TaskSpec) -> float | None:
        gym = WorldGymEnv(env=env)
        gym.reset(options={"task": TaskRef(name, task.id)})
        for step in task.solution:
            gym.step(text_call(step.tool, step.arguments))
        reward = gym.step(task.answer or "Done.")[1]
        gym.close()
        return reward

    def skyrl(task: TaskSpec) -> float | None:
        sky = skyrl_gym.make("worldsmith", env_config={}, extras={"world": name, "task_id": task.id})
        sky.init([])
        for step in task.solution:
            sky.step(text_call(step.tool, step.arguments))
        reward = sky.step(task.answer or "Done.")["reward"]
        sky.close()
        return float(reward)

    def trl(task: TaskSpec) -> float | None:
        instance = factory()
        instance.reset(task_id=task.id)
        for step in task.solution:
            getattr(instance, step.tool)(**step.arguments)
        completion = [{"role": "assistant", "content": task.answer or "Done."}]
        return world_reward(completions=[completion], environments=[instance])[0]

    return {
        "direct": direct,
        "loop": loop,
        "environment": environment,
        "gymnasium": gymnasium,
        "skyrl": skyrl,
        "trl": trl,
    }


#: Each thin client's timing script: argv[1] the world's base URL, argv[2] the plays (task, calls, answer),
#: argv[3] the rounds, argv[4] the model's base URL (verifiers). Prints {"episodes_per_s", "reward"}.
CLIENT_PREAMBLE = """
import asyncio, json, sys, time
base_url, plays, rounds, model_url = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

async def timed(play_one):
    for play in plays:  # warm-up
        await play_one(play)
    started, rewards = time.perf_counter(), []
    for _ in range(rounds):
        for play in plays:
            rewards.append(await play_one(play))
    seconds = time.perf_counter() - started
    print(json.dumps({"episodes_per_s": len(rewards) / seconds, "reward": sum(rewards) / len(rewards)}))
"""
CLIENTS = {
    "openenv": """
from worldsmith_openenv import WorldEnv

async def main():
    async with WorldEnv(base_url) as env:
        async def play_one(play):
            await env.reset(task=play["task"])
            for name, arguments in play["calls"]:
                await env.call_tool(name, **arguments)
            return (await env.submit(play["answer"])).reward
        await timed(play_one)
""",
    "verl": """
from worldsmith_verl import WorldSession

async def main():
    async def play_one(play):
        async with WorldSession(base_url) as world:
            await world.reset(play["task"])
            for name, arguments in play["calls"]:
                await world.call(name, arguments)
            return await world.submit(play["answer"])
    await timed(play_one)
""",
    "verifiers": f"""
sys.path.insert(0, {str(REPO / "tests" / "support" / "client_scripts")!r})
from verifiers_rollouts import rollouts

async def main():
    async with rollouts(base_url, model_url) as world:
        async def play_one(play):
            return await world.reward(play["task"])
        await timed(play_one)
""",
}


def measure_clients(rounds: int) -> dict[str, tuple[float, float]]:
    """(episodes per second, mean reward) through each thin client against the example world, served."""
    import os
    import subprocess
    import tempfile

    from support.client_venvs import client_python
    from support.integrations import Play, served
    from support.scripted_model import ScriptedModel, scripted_model

    plays = [Play(t.id, [(s.tool, s.arguments) for s in t.solution], t.answer or "Done.") for t in TASKS]
    model = ScriptedModel([(t.instruction, p.actions()) for t, p in zip(TASKS, plays, strict=True)])
    results: dict[str, tuple[float, float]] = {}
    home = tempfile.TemporaryDirectory()
    os.environ.setdefault("WORLDSMITH_HOME", home.name)  # the server's (it only reads the bundle)
    with home, served(REPO / "examples" / "bundles" / "retail_store") as url, scripted_model(model) as model_url:
        for name, script in CLIENTS.items():
            python = client_python(f"worldsmith-{name}")
            code = CLIENT_PREAMBLE + script + "\nasyncio.run(main())\n"
            arguments = [
                f"{url}/envs/{BUNDLE.env_id}",
                json.dumps([p.as_json() for p in plays]),
                str(rounds),
                model_url,
            ]
            environment = {**os.environ, "SCRIPTED_API_KEY": "scripted"}
            done = subprocess.run(
                [str(python), "-c", code, *arguments], capture_output=True, text=True, env=environment, check=False
            )
            if done.returncode != 0:
                raise SystemExit(f"{name}: {done.stderr.strip().splitlines()[-1]}")
            measured = json.loads(done.stdout.strip().splitlines()[-1])
            results[name] = (measured["episodes_per_s"], measured["reward"])
    return results


def measure(play: Callable[[TaskSpec], float | None], rounds: int, threads: int) -> tuple[float, float]:
    """(episodes per second, mean reward) over `rounds` x every task, on `threads` threads."""
    episodes = TASKS * rounds
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        rewards = list(pool.map(play, episodes))
    seconds = time.perf_counter() - started
    return len(episodes) / seconds, sum(r or 0.0 for r in rewards) / len(rewards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="Rounds over the world's tasks per way.")
    parser.add_argument("--threads", type=int, default=1, help="Episodes played at once.")
    parser.add_argument("--workers", type=int, default=2, help="Sandbox workers of the runtime.")
    parser.add_argument("--clients", action="store_true", help="Also the thin clients against a served world.")
    args = parser.parse_args()
    for name in ("rounds", "threads", "workers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    with Runtime(workers=args.workers) as runtime:
        env = WorldEnv(BUNDLE, runtime=runtime)
        played = ways(runtime, env)
        for play in played.values():  # warm-up: workers, the loaded world, the reference footprints
            measure(play, 1, args.threads)
        results = {name: measure(play, args.rounds, args.threads) for name, play in played.items()}
    if args.clients:
        results |= measure_clients(args.rounds)
    direct, loop = results["direct"][0], results["loop"][0]
    print(f"{len(TASKS)} tasks x {args.rounds} rounds, {args.threads} thread(s), {args.workers} workers")
    print(f"{'way':12} {'episodes/s':>11} {'x direct':>9} {'x loop':>7} {'reward':>7}")
    for name, (rate, reward) in results.items():
        print(f"{name:12} {rate:11.2f} {rate / direct:9.3f} {rate / loop:7.3f} {reward:7.2f}")
    summary = {
        name: {"episodes_per_s": round(rate, 2), "vs_direct": round(rate / direct, 3), "vs_loop": round(rate / loop, 3)}
        for name, (rate, _) in results.items()
    }
    print(json.dumps({"tasks": len(TASKS), "rounds": args.rounds, "threads": args.threads, "ways": summary}))


if __name__ == "__main__":
    main()
