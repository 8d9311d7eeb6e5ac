"""The configs of the training runs, one typed, documented model each: TrainingConfig (GRPO of a
policy in the worlds, the `train` flow), WorldModelConfig (supervised fine-tuning of a world model,
worldsmith/training/world_model_sft.py) and CotrainConfig (the two trained together, the `cotrain`
flow).

They are the parameter forms of the flows and their deployments (Prefect renders the nested fields,
descriptions and enums as a form) and the options of the commands: a field is an option with its
default and description as help (worldsmith/cli/training.py, worldsmith/cli/wm.py). The module
imports nothing beyond pydantic and the configs it nests, so the command line builds its options
without loading the training stack or the world models. TrainingConfig's defaults follow the
reference paper's recipe: group size 16, learning rate 7e-7, a windowed history of the last 3 turns.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from worldsmith.agent.rewards import RewardMap, teaches_giving_up
from worldsmith.models.sets import SplitName
from worldsmith.worldmodel.config import SimulationConfig

TINY = "tiny"
#: Groups per optimizer step on the gpu profile when `rows_per_step` is not given: several tasks, so that a
#: step rarely lacks signal (at group 8 a task with success 0.1 gives a group of equal rewards 43% of the
#: time). Bounded by generation's memory: the rollouts of a step are generated together (without vLLM a
#: KV cache per sequence: 32 x 16 sequences of 4,000 tokens need about 306 GiB at 4B, 4 x 16 about 38).
GPU_ROWS_PER_STEP = 4
#: The linear layers of a Qwen/Llama-style decoder block: LoRA's default targets (attention alone learns far less).
LORA_ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(BaseModel):
    """Low-rank adapters instead of full fine-tuning (PEFT)."""

    enabled: bool = Field(False, description="Train LoRA adapters only.")
    rank: int = Field(16, ge=1, le=512, description="Rank of the adapter matrices.")
    alpha: int = Field(32, ge=1, description="Scale of the adapters' update (alpha / rank).")
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description="Dropout on the adapters' input.")
    learning_rate: float = Field(
        1e-5,
        gt=0,
        description="AdamW learning rate of the adapters, in place of the run's learning_rate (of order 10 x full "
        "fine-tuning's: at 7e-7 an adapter step moves a q_proj-shaped matrix 0.7% as far as a full step).",
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_ALL_LINEAR),
        description="Modules that get adapters (default: every linear layer of a decoder block, attention and MLP).",
    )


class Curriculum(BaseModel):
    """What the policy is shown and trained on, so that a small model learns from its first steps: a few
    tasks chosen by a rule, only the tools their reference solutions call, and (tiny model) a warm-up with
    a wrong habit beside the right one for GRPO to unlearn. The defaults leave every task and tool as is."""

    tasks: int | None = Field(
        None,
        ge=1,
        description="Train on this many (env, task) rows only: the tasks with the shortest reference solutions "
        "(fewest calls, then fewest characters of calls and answer; ties by environment and task id), one per "
        "kind (the same tools) before a second of any kind, so that the others are held out; tasks without a "
        "reference solution are not chosen. Unset: every task.",
    )
    tools: Literal["all", "solution"] = Field(
        "all",
        description="Tools an episode shows the policy: all of its environment's, or only those its task's "
        "reference solution calls (shorter prompts, fewer choices; a task without a solution shows all).",
    )
    lazy_habit: bool = Field(
        False,
        description="model=tiny: also warm up on a lazy habit of each task (its reference solution without the "
        "last call, then the answer 'Done.'; rated incomplete), one row for each of the reference's.",
    )


RewardSource = Literal["verifier", "judge", "verifier+judge"]
"""Where a rollout's reward comes from: the task's code verifier; an LLM judge reading the task and the
trajectory; or the code-augmented judge of the reference paper, which also reads the verifier's verdict
and evidence (worldsmith/training/judged_reward.py)."""


class JudgeConfig(BaseModel):
    """The LLM judge of `reward` judge or verifier+judge: its own model and endpoint. The configuration
    names where the key is (a Prefect Secret block, or a variable of the training process's environment),
    never the key: it is stored in the catalog with the run."""

    model: str | None = Field(None, description="Judge model; unset: the configured llm_model.")
    base_url: str | None = Field(
        None,
        description="The judge's OpenAI-compatible endpoint; unset: the configured endpoint (llm_base_url) and its key.",
    )
    api_key_block: str | None = Field(
        None, description="Name of a Prefect Secret block holding the judge endpoint's key."
    )
    api_key_variable: str | None = Field(
        None, description="Name of an environment variable of the training process holding the judge endpoint's key."
    )
    votes: int = Field(1, ge=1, le=15, description="Judge samples per rollout; the majority rules.")
    retries: int = Field(
        2, ge=0, le=10, description="Re-asks of a vote whose answer is not a ruling, before the vote counts as failed."
    )
    timeout_s: float = Field(60.0, gt=0, description="Timeout of one judge call.")
    concurrency: int = Field(8, ge=1, le=256, description="Judge calls in flight at once.")


class TrainingConfig(BaseModel):
    """A multi-turn GRPO run over an environment set."""

    model: str = Field(
        description="Model directory (or an id already in the local Hugging Face cache; nothing is downloaded), or "
        "`tiny`: a tiny Qwen3 model built offline from the set and warmed up on its reference solutions."
    )
    set_name: str = Field(description="Environment set whose train split gives the (env, task) rows.")
    split: SplitName = Field("train", description="Split the training rows come from.")
    profile: Literal["cpu-test", "gpu"] = Field(
        "cpu-test",
        description="cpu-test: fp32 on the CPU; gpu: bf16 compute over fp32 master weights (a frozen LoRA base in "
        "bf16), gradient checkpointing, vLLM when installed.",
    )
    group_size: int = Field(
        16, ge=2, le=256, description="Rollouts per (env, task) row; advantages are normalised within the group."
    )
    learning_rate: float = Field(7e-7, gt=0, description="AdamW learning rate, constant after its warm-up.")
    lr_warmup_steps: int | None = Field(
        None,
        ge=0,
        description="Optimizer steps over which the learning rate rises linearly from 0 to learning_rate, then stays "
        "constant; unset: a tenth of `steps` (none under 10 steps).",
    )
    beta: float = Field(
        0.0, ge=0, description="KL penalty against the reference model (0: no reference model is kept)."
    )
    epsilon: float = Field(0.2, gt=0, lt=1, description="PPO-style clip range of the importance ratio.")
    max_turns: int = Field(10, ge=1, le=100, description="Turns per rollout.")
    history: Literal["windowed", "full"] = Field(
        "windowed",
        description="windowed: each turn is a row holding exactly the window the policy saw; full: the whole "
        "conversation, rendered by the model's own chat template as when serving, turns joined into one row where "
        "the template lets each prompt extend the last (one row per rollout with Qwen2.5's, per turn with Qwen3's).",
    )
    window: int = Field(
        3, ge=1, le=100, description="Turns kept in the windowed history (the task and tools are always kept)."
    )
    max_completion_length: int = Field(256, ge=8, le=32768, description="Tokens generated per turn at most.")
    temperature: float = Field(1.0, gt=0, le=2, description="Sampling temperature of rollouts.")
    steps: int = Field(100, ge=1, description="Optimizer steps.")
    max_tokens_per_micro_batch: int = Field(
        16384,
        ge=64,
        description="Memory bound of one forward/backward pass, in padded tokens (rows x (longest prompt + longest "
        "completion)): a step's rows are length-sorted and packed into micro-batches under it, their gradients "
        "accumulated to the same update; the log-probability passes are chunked the same way. A longer row runs alone.",
    )
    rows_per_step: int = Field(
        1,
        ge=1,
        description="(env, task) rows per step; each gets `group_size` rollouts (unset on the gpu profile: "
        f"{GPU_ROWS_PER_STEP}).",
    )
    refill_rounds: int = Field(
        1,
        ge=0,
        le=16,
        description="Dynamic sampling: a group whose rewards are all equal (it teaches nothing) is replaced by the "
        "group of another task drawn from the set, for up to this many rounds per step (0: off). A step in which no "
        "rollout has an advantage skips the optimizer.",
    )
    seed: int = Field(0, description="Seed of sampling, row order and initialisation.")
    warmup_steps: int = Field(
        120, ge=0, description="model=tiny only: supervised steps on the reference solutions before GRPO."
    )
    curriculum: Curriculum = Field(
        default_factory=Curriculum, description="Tasks, tools and warm-up habits the policy trains on."
    )
    success_samples: int = Field(
        0,
        ge=0,
        le=1024,
        description="Rollouts per training task, sampled as in training, before and after GRPO: the run's success "
        "rate on its own tasks, before -> after (0: not measured).",
    )
    processes: int = Field(
        1,
        ge=1,
        le=64,
        description="Training processes (one per GPU); more than 1 launches them with "
        "torch.distributed.run. rows_per_step is per process.",
    )
    sharding: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="How the processes share the model: ddp, a whole replica each (gradients all-reduced in place, "
        "gradient_as_bucket_view); fsdp, FSDP2 full sharding of weights, gradients and AdamW states over all "
        "processes, one decoder layer gathered at a time (docs/training.md, 'Sharded training').",
    )
    cpu_offload: bool = Field(
        False,
        description="With sharding fsdp: keep the sharded weights, gradients and AdamW states in CPU memory (the "
        "optimizer steps on the CPU); the GPU holds the gathered layers and activations only.",
    )
    nodes: int = Field(
        1,
        ge=1,
        le=64,
        description="Machines the training step spans, `processes` each: the flow's own machine is node 0, the "
        "others run the `train-node` deployment on the gpu pool (docs/training.md, 'Several machines'); the model, "
        "bundles and output must be on a file system every node shares.",
    )
    rendezvous_host: str | None = Field(
        None,
        description="With nodes > 1: the address of node 0 (the flow's machine) that the other nodes reach; unset: "
        "this machine's address on its default route.",
    )
    rendezvous_port: int | None = Field(
        None, ge=1, le=65535, description="With nodes > 1: node 0's rendezvous port; unset: a free port."
    )
    rendezvous_timeout_s: int = Field(
        600,
        ge=1,
        le=86400,
        description="With nodes > 1: seconds node 0 waits for every node to join (a node whose flow run is not "
        "started by then fails the run, named).",
    )
    simulate: SimulationConfig | None = Field(
        None,
        description="Roll out in a world model's imagination (simulated mode) instead of "
        "the environments' code; unset: the real worlds.",
    )
    real_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="With simulate: the share of rollout groups still run in the real worlds "
        "(the first group of a run is real whenever this is above 0).",
    )
    real_starts: float = Field(
        0.0,
        ge=0,
        le=1,
        description="With simulate: the share of imagined rollouts that start from a real mid-episode state (a real "
        "rollout of the task so far, else its reference solution, replayed in the real world up to a random turn); "
        "the policy continues in imagination.",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="Low-rank adapters instead of full fine-tuning.")
    rewards: RewardMap = Field(
        default_factory=RewardMap,
        description="Reward of each verdict; no verdict of a failed attempt may be worth less than incomplete (an "
        "answer without any tool call), or the policy learns to give up.",
    )
    reward: RewardSource = Field(
        "verifier",
        description="verifier: the task's code verifier rules; judge: an LLM judge reads the task and the "
        "trajectory; verifier+judge: the judge also reads the verifier's verdict and evidence (the paper's "
        "code-augmented judge). A judge that fails (endpoint down, no ruling after its retries) leaves the rollout "
        "out of the loss, like an env_error.",
    )
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="The LLM judge of reward judge/verifier+judge.")
    side_effects: bool = Field(
        True,
        description="Side-effect guard: a rollout whose end state reaches outside the task's reference "
        "solution's footprint is rewarded as partial (tasks without a solution are not checked).",
    )
    output: str | None = Field(None, description="Where checkpoints go (default: the object store, under the run).")
    save_every: int = Field(
        0,
        ge=0,
        description="Store a trainer checkpoint every n steps, which a stopped run resumes from "
        "(0: only the final model).",
    )
    tensorboard: bool = Field(False, description="Also write metrics for TensorBoard under the run directory.")
    rollout_engine: Literal["in_process", "local", "vllm"] = Field(
        "in_process",
        description="Where rollouts generate: in the trainer (in_process), or through an inference engine, "
        "episodes asynchronous and weights pushed after each step (training/engine.py): the project's "
        "policy server (local) or a vLLM server (vllm: LoRA adapters, or full weights reloaded in place).",
    )
    engine_url: str | None = Field(
        None,
        description="The engine's URL: required for vllm; for local, a running policy server instead of a new one.",
    )
    max_staleness: int = Field(
        1, ge=0, description="Policy versions a rollout may be behind the trainer; older ones are dropped."
    )
    rollouts_in_flight: int = Field(64, ge=1, le=4096, description="Episodes running at once against the engine.")

    @model_validator(mode="before")
    @classmethod
    def _gpu_rows_per_step(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("profile") == "gpu" and "rows_per_step" not in data:
            return {**data, "rows_per_step": GPU_ROWS_PER_STEP}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> TrainingConfig:
        # by value, not by fields set: a stored or form-sent configuration carries every field
        if self.history == "full" and self.window != type(self).model_fields["window"].default:
            raise ValueError("window applies to history='windowed' only; remove it or choose windowed")
        if self.simulate is None and self.real_share > 0:
            raise ValueError("real_share applies to simulated training only; set simulate or remove real_share")
        if self.simulate is None and self.real_starts > 0:
            raise ValueError("real_starts applies to simulated training only; set simulate or remove real_starts")
        if (giving_up := teaches_giving_up(self.rewards)) is not None:
            raise ValueError(giving_up)
        if self.rollout_engine == "vllm" and self.engine_url is None:
            raise ValueError("rollout_engine vllm needs engine_url (the vLLM server the weights are pushed to)")
        if self.rollout_engine == "vllm" and self.processes * self.nodes > 1:
            raise ValueError("rollout_engine vllm takes one training process (the one that pushes its weights)")
        if self.cpu_offload and self.sharding != "fsdp":
            raise ValueError("cpu_offload applies to sharding='fsdp' only; set sharding fsdp or remove cpu_offload")
        if self.sharding == "fsdp" and self.lora.enabled:
            raise ValueError("LoRA's frozen bf16 base fits one GPU: train LoRA with sharding ddp, or fsdp without LoRA")
        if self.sharding == "fsdp" and self.rollout_engine != "in_process":
            raise ValueError("a rollout engine serves one process's weights: use sharding ddp with rollout_engine")
        if self.simulate is not None and self.success_samples:
            raise ValueError("success_samples measures training in the real worlds; remove it or simulate")
        return self


class WorldModelConfig(BaseModel):
    """A world-model SFT run."""

    model: str = Field(TINY, description="Model directory to fine-tune, or `tiny` (built offline, cpu-test).")
    profile: Literal["cpu-test", "gpu"] = Field(
        "cpu-test",
        description="cpu-test: fp32 on the CPU; gpu: bf16 compute over fp32 master weights, gradient checkpointing.",
    )
    steps: int = Field(60, ge=1, description="Optimizer steps.")
    learning_rate: float = Field(3e-3, gt=0, description="AdamW learning rate.")
    batch_size: int = Field(8, ge=1, description="Transitions per optimizer step.")
    seed: int = Field(0, description="Seed of initialisation and data order.")
    output: str | None = Field(
        None, description="Where the model goes (default WORLDSMITH_HOME/world-models/<run id>)."
    )


class CotrainConfig(BaseModel):
    """A co-training run: the policy's GRPO settings (its `steps` per round), the world model's SFT
    settings (its `steps` per round), and how the two meet."""

    policy: TrainingConfig = Field(
        description="The policy and its GRPO settings; `steps` are optimizer steps per round."
    )
    world_model: WorldModelConfig = Field(
        default_factory=WorldModelConfig,
        description="The world model and its SFT settings; `steps` are optimizer steps per round.",
    )
    rounds: int = Field(3, ge=1, le=100, description="Co-training rounds.")
    real_samples: int = Field(
        2, ge=1, le=64, description="Real rollouts per train-split task each round (the world model's new data)."
    )
    real_share: float = Field(
        0.2, ge=0, le=1, description="Share of the policy update's rollout groups run in the real worlds."
    )
    samples: int = Field(
        3, ge=1, le=16, description="World-model predictions per imagined call; their disagreement is its uncertainty."
    )
    uncertainty_threshold: float = Field(
        0.5, ge=0, le=1, description="An imagined rollout stops at a call whose uncertainty is above this."
    )
    max_new_tokens: int = Field(384, ge=16, description="Tokens the world model generates per prediction at most.")
    reference_transitions: bool = Field(
        True,
        description="Also learn, from round 1 on, the transitions of the train "
        "tasks' reference solutions (real episodes too), so a policy "
        "that hardly calls tools yet still gets a world model.",
    )
