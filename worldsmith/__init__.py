"""worldsmith: manufacture executable tool-use worlds for LLM agents and train agents in them.

The package root is the front door: a small curated API (`__all__`), each name imported from the
module that defines it on first use, so `import worldsmith` costs what it did and loads no third-party
package (the CLI's start-up, tests/cli/test_cli_startup.py). README.md ("Python API") shows it at work.

This module stays stdlib only: the sandbox worker imports parts of this package in an interpreter
without site-packages. Modules of the package import a name from the module that defines it, never
from here. `__init__.pyi` gives type checkers the same names; tests/test_public_api.py holds `__all__`,
`_EXPORTS` and the stub together.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "__version__",
    # worlds: a bundle from a directory or the catalog, its tasks
    "Bundle",
    "TaskSpec",
    "load_bundle",
    "open_bundle",
    # episodes: open one, call tools, verify
    "Runtime",
    "Episode",
    "ToolResult",
    "VerifierResult",
    "Verdict",
    "ToolError",
    # a policy over a task: one episode, played and judged
    "Policy",
    "policy_factory",
    "EpisodeConfig",
    "run_episode",
    "Trajectory",
    # worlds as an RL environment: reset a task, step tool calls, verify (docs/integrations.md)
    "WorldEnv",
    # the flows, run in this process
    "generate",
    "GenerateParameters",
    "evaluate",
    "EvaluateParameters",
    "train",
    "TrainingConfig",
    # errors
    "WorldsmithError",
    "UserFixable",
    "BundleError",
    "CatalogError",
]

#: Each name of `__all__` (but `__version__`) -> "module" or "module:name there" where it differs.
_EXPORTS: dict[str, str] = {
    "Bundle": "worldsmith.bundle.contract",
    "TaskSpec": "worldsmith.models.bundle",
    "load_bundle": "worldsmith.bundle.loader",
    "open_bundle": "worldsmith.storage.bundle_cache",
    "Runtime": "worldsmith.runtime.episode",
    "Episode": "worldsmith.runtime.episode",
    "ToolResult": "worldsmith.models.results",
    "VerifierResult": "worldsmith.models.results",
    "Verdict": "worldsmith.models.verdict",
    "ToolError": "worldsmith.runtime.errors",
    "Policy": "worldsmith.agent.policies",
    "policy_factory": "worldsmith.agent.policy_specs",
    "EpisodeConfig": "worldsmith.agent.loop",
    "run_episode": "worldsmith.agent.loop",
    "Trajectory": "worldsmith.agent.loop",
    "WorldEnv": "worldsmith.integrations.environment",
    "generate": "worldsmith.flows.generate:run_generate",
    "GenerateParameters": "worldsmith.tasks.parameters",
    "evaluate": "worldsmith.flows.evaluate:run_evaluate",
    "EvaluateParameters": "worldsmith.tasks.parameters",
    "train": "worldsmith.flows.train",
    "TrainingConfig": "worldsmith.training.config",
    "WorldsmithError": "worldsmith.errors",
    "UserFixable": "worldsmith.failures",
    "BundleError": "worldsmith.bundle.errors",
    "CatalogError": "worldsmith.storage.publish",
}


def __getattr__(name: str) -> object:
    """A name of the API, imported from its module on first use and kept here."""
    target = _EXPORTS.get(name)
    if target is None:  # also how `from worldsmith import <submodule>` finds a submodule not yet imported
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    module, _, attribute = target.partition(":")
    value = getattr(import_module(module), attribute or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
