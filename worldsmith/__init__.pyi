# The front door's names for type checkers: worldsmith/__init__.py imports each on first use.
from worldsmith.agent.loop import EpisodeConfig as EpisodeConfig
from worldsmith.agent.loop import Trajectory as Trajectory
from worldsmith.agent.loop import run_episode as run_episode
from worldsmith.agent.policies import Policy as Policy
from worldsmith.agent.policy_specs import policy_factory as policy_factory
from worldsmith.bundle.contract import Bundle as Bundle
from worldsmith.bundle.errors import BundleError as BundleError
from worldsmith.bundle.loader import load_bundle as load_bundle
from worldsmith.errors import WorldsmithError as WorldsmithError
from worldsmith.failures import UserFixable as UserFixable
from worldsmith.flows.evaluate import run_evaluate as _run_evaluate
from worldsmith.flows.generate import run_generate as _run_generate
from worldsmith.flows.train import train as train
from worldsmith.integrations.environment import WorldEnv as WorldEnv
from worldsmith.models.bundle import TaskSpec as TaskSpec
from worldsmith.models.results import ToolResult as ToolResult
from worldsmith.models.results import VerifierResult as VerifierResult
from worldsmith.models.verdict import Verdict as Verdict
from worldsmith.runtime.episode import Episode as Episode
from worldsmith.runtime.episode import Runtime as Runtime
from worldsmith.runtime.errors import ToolError as ToolError
from worldsmith.storage.bundle_cache import open_bundle as open_bundle
from worldsmith.storage.publish import CatalogError as CatalogError
from worldsmith.tasks.parameters import EvaluateParameters as EvaluateParameters
from worldsmith.tasks.parameters import GenerateParameters as GenerateParameters
from worldsmith.training.config import TrainingConfig as TrainingConfig

__version__: str
__all__: list[str]

generate = _run_generate
evaluate = _run_evaluate
