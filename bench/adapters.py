"""Episodes per second through each in-process adapter against direct runtime calls, in one run.

    .venv/bin/python bench/adapters.py [--rounds 3] [--threads 1] [--workers 2]

Every way plays the same episodes on one runtime: each task of the example world (examples/bundles/
retail_store), its reference solution then its answer, verified. `direct`: `Runtime.open_episode`,
`call_tool` per call, `verify` (the runtime alone); `loop`: `run_episode` with the reference policy
(worldsmith's own evaluator: a snapshot and a diff per call, the side-effect guard); then the
environment object (`WorldEnv`: reset, step, verify, which does what the loop does) and each adapter on it:
Gymnasium (`WorldGymEnv`, calls as `<tool_call>` text), SkyRL-gym (`skyrl_gym.make`, init, step) and TRL
(the `environment_factory` instance's tool methods, then `world_reward`). One warm-up round first (workers
started, the world loaded, the reference footprints cached). Prints episodes/s of each and its ratio to
`direct` and to `loop`; the last line is JSON.
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
    args = parser.parse_args()
    with Runtime(workers=args.workers) as runtime:
        env = WorldEnv(BUNDLE, runtime=runtime)
        played = ways(runtime, env)
        for play in played.values():  # warm-up: workers, the loaded world, the reference footprints
            measure(play, 1, args.threads)
        results = {name: measure(play, args.rounds, args.threads) for name, play in played.items()}
    direct, loop = results["direct"][0], results["loop"][0]
    print(f"{len(TASKS)} tasks x {args.rounds} rounds, {args.threads} thread(s), {args.workers} workers")
    print(f"{'way':12} {'episodes/s':>11} {'x direct':>9} {'x loop':>7} {'reward':>7}")
    for name, (rate, reward) in results.items():
        print(f"{name:12} {rate:11.1f} {rate / direct:9.2f} {rate / loop:7.2f} {reward:7.2f}")
    summary = {
        name: {"episodes_per_s": round(rate, 2), "vs_direct": round(rate / direct, 3), "vs_loop": round(rate / loop, 3)}
        for name, (rate, _) in results.items()
    }
    print(json.dumps({"tasks": len(TASKS), "rounds": args.rounds, "threads": args.threads, "ways": summary}))


if __name__ == "__main__":
    main()
