"""GRPO in the worlds: TRL's GRPOTrainer with worldsmith episodes as its rollouts.

The extension is one override, `_generate_and_score_completions`, the method in which TRL turns
a batch of prompts into scored token sequences. Here it

1. runs one episode per batch entry (TRL's RepeatSampler gives each (env, task) row `group_size`
   consecutive entries) in the sandboxed runtime, generation batched across episodes through
   TRL's own generation backend (`_generate_single_turn`: transformers, or vLLM when enabled); or,
   with `rollout_engine`, asynchronously against an inference engine (training/engine.py);
2. scores each rollout with the verdict's reward through TRL's reward machinery (a reward
   function reading the verdict; env_error is None, which TRL gathers across processes as NaN);
   with `reward` judge or verifier+judge an LLM judge rules first (training/judged_reward.py), a
   judge that fails making the rollout an env_error;
3. computes group-relative advantages (rows.group_advantages; env_error rollouts leave the
   baseline and get no row at all, so they contribute nothing to the loss);
4. builds rows by history mode: `windowed`, one row per turn holding exactly the window the
   policy saw (TRL's loop cannot do this: it always feeds the whole history); `full`, the
   rollout's turns joined into as few rows as the model's own chat template allows, tool-result
   tokens masked (`tool_mask`): every prompt is the model's own template's rendering, what serving
   gives it, never TRL's training variant of the template (rows.full_rows);
5. with vLLM or an engine generating, applies the importance-sampling correction from the sampler
   log-probabilities the rollouts recorded, folded into the advantages (training/importance.py),
   without TRL's `use_vllm` flag.

Memory is bounded by `max_tokens_per_micro_batch`: the loss (`compute_loss`) and the old/reference
log-probability passes run over length-sorted micro-batches under that many padded tokens
(rows.micro_batches), the loss's gradients accumulated to the update of the whole batch.

Everything else (the clipped loss, KL against the reference, optimizer, checkpoints, logging,
accelerate, FSDP: training/sharding.py) is TRL's, unchanged.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from worldsmith.agent.hf_policy import stop_token_ids, whole_distribution
from worldsmith.agent.loop import EpisodeConfig, EpisodeSource, Trajectory
from worldsmith.agent.rewards import RewardMap
from worldsmith.bundle.contract import Bundle
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.verdict import Verdict
from worldsmith.runtime.episode import Runtime
from worldsmith.training.config import TrainingConfig
from worldsmith.training.engine import RolloutEngine, drop_stale, judge_each
from worldsmith.training.importance import weigh_advantages
from worldsmith.training.memory import VLLM_SHARE, check_cuda, vllm_installed
from worldsmith.training.rollout_metrics import rollout_metrics
from worldsmith.training.rollouts import Batcher, Sampled, TrainingPolicy, run_rollouts
from worldsmith.training.rows import (
    TrainingRow,
    collate,
    even_out,
    full_rows,
    group_advantages,
    micro_batches,
    row_lengths,
    take_rows,
    windowed_rows,
)
from worldsmith.training.sharding import ShardedTrainer
from worldsmith.training.signal import SkippableStep, flat_groups, has_signal, refill

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from worldsmith.worldmodel.simulated import SimulatedRuntime

try:
    from trl import GRPOConfig, GRPOTrainer
except ImportError as exc:  # pragma: no cover - trl is a pinned dependency
    raise ImportError("training needs trl==1.16.0 (pip install -r requirements.lock)") from exc


class TaskRef(TypedDict):
    """Which task a rollout plays: a key of the trainer's bundles and a task id of that bundle."""

    bundle: str
    task_id: str


class TaskRow(TaskRef):
    """One row of the task dataset (`task_dataset`), with the task as chat messages for TRL's bookkeeping."""

    env_id: str
    prompt: list[dict[str, str]]


class GRPOSettings(TypedDict):
    """The keyword arguments of TRL's GRPOConfig that a run sets (`grpo_settings`)."""

    output_dir: str
    per_device_train_batch_size: int
    num_generations: int
    gradient_accumulation_steps: int
    steps_per_generation: int
    num_iterations: int
    learning_rate: float
    lr_scheduler_type: str
    warmup_steps: int
    beta: float
    epsilon: float
    temperature: float
    max_completion_length: int
    max_steps: int
    seed: int
    data_seed: int
    logging_steps: int
    save_strategy: str
    save_steps: int
    report_to: str | list[str]
    chat_template_kwargs: dict[str, bool]
    remove_unused_columns: bool
    disable_tqdm: bool
    use_cpu: bool
    bf16: bool
    use_vllm: bool
    vllm_importance_sampling_correction: bool
    vllm_importance_sampling_mode: str
    vllm_mode: str
    vllm_gpu_memory_utilization: float
    shuffle_dataset: bool
    activation_checkpointing: bool


def verdict_reward(rewards: RewardMap) -> Callable[..., list[float | None]]:
    """A TRL reward function: the reward of each rollout's verdict (None for env_error and for a
    rollout `dropped` as too stale)."""

    def episode_verdict(
        prompts: list[Any], completions: list[Any], verdict: list[Verdict], dropped: list[bool], **kwargs: Any
    ) -> list[float | None]:
        return [None if d else rewards.reward(v) for v, d in zip(verdict, dropped, strict=True)]

    return episode_verdict


def task_dataset(bundles: dict[str, Bundle]) -> Any:
    """One training row per (bundle, task): a `datasets.Dataset` of {bundle, env_id, task_id, prompt}."""
    from datasets import Dataset

    rows: list[TaskRow] = [
        {
            "bundle": key,
            "env_id": bundle.env_id,
            "task_id": task.id,
            "prompt": [{"role": "user", "content": task.instruction}],
        }
        for key, bundle in sorted(bundles.items())
        for task in bundle.tasks
    ]
    if not rows:
        raise ValueError("no tasks to train on: the bundles have none")
    return Dataset.from_list(rows)


def grpo_settings(config: TrainingConfig, output_dir: Path) -> GRPOSettings:
    """GRPOConfig's keyword arguments for `config`: one optimizer step per generation batch of
    `rows_per_step` (env, task) rows x `group_size` rollouts (per device), a constant learning rate
    after a linear warm-up, importance masking per token; the gpu profile adds bf16
    autocast (over the fp32 weights `model_dtype` loads) and activation checkpointing (TRL turns
    checkpointing on by default: cpu-test turns it off)."""
    gpu = config.profile == "gpu"
    return {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": config.group_size * config.rows_per_step,
        "num_generations": config.group_size,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,
        "num_iterations": 1,
        "learning_rate": config.lora.learning_rate if config.lora.enabled else config.learning_rate,
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": config.steps // 10 if config.lr_warmup_steps is None else config.lr_warmup_steps,
        "beta": config.beta,
        "epsilon": config.epsilon,
        "temperature": config.temperature,
        "max_completion_length": config.max_completion_length,
        "max_steps": config.steps,
        "seed": config.seed,
        "data_seed": config.seed,
        "logging_steps": 1,
        "save_strategy": "steps" if config.save_every else "no",
        "save_steps": config.save_every or 500,
        "report_to": ["tensorboard"] if config.tensorboard else "none",
        "chat_template_kwargs": {"enable_thinking": False},
        "remove_unused_columns": False,
        "disable_tqdm": True,
        "use_cpu": not gpu,
        "bf16": gpu,
        "use_vllm": gpu and vllm_installed() and config.rollout_engine == "in_process",
        "vllm_importance_sampling_correction": False,  # applied by the trainer itself (importance.weigh_advantages)
        "vllm_importance_sampling_mode": "token_mask",  # per sequence would zero long rows whole (importance.py)
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": VLLM_SHARE,
        "shuffle_dataset": True,
        "activation_checkpointing": gpu,
    }


def grpo_args(config: TrainingConfig, output_dir: Path) -> GRPOConfig:
    """TRL's GRPOConfig for `config` (see `grpo_settings`), once the profile suits this machine."""
    check_cuda(config.profile)
    return GRPOConfig(**grpo_settings(config, output_dir))


def refuse_unsupported(args: Any) -> None:
    """Before TRL's setup: GRPOConfig settings this trainer cannot honour, refused in one line.
    `num_iterations` > 1 (later passes would take the sampling model's log-probabilities as their
    own: the trainer takes one step per batch); the `vespo` loss (it weighs by the sampler's ratio
    itself, which the trainer folds into the advantages instead: importance.py)."""
    if args is None:
        return
    if args.num_iterations != 1:
        raise ValueError(
            f"num_iterations {args.num_iterations} is not supported: the trainer takes one step per batch; set 1"
        )
    if args.loss_type == "vespo":
        raise ValueError("loss_type vespo is not supported: its sampler ratio is applied by the trainer; use dapo")


def model_dtype(config: TrainingConfig) -> str:
    """The dtype the policy's weights load in. Trained weights are fp32 on every profile: the gpu
    profile computes in bf16 under autocast (`bf16` in `grpo_settings`) while the optimizer updates
    fp32 master weights (a bf16 weight would drop any update below its resolution, as most of an
    AdamW step at lr 7e-7 is). A LoRA run's base is frozen, so the gpu profile loads it in bf16;
    its adapters are fp32 (PEFT's default)."""
    return "bfloat16" if config.profile == "gpu" and config.lora.enabled else "float32"


def peft_config(config: TrainingConfig) -> Any:
    """PEFT LoRA settings when `config.lora.enabled`, else None (full fine-tuning)."""
    if not config.lora.enabled:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora.rank,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=config.lora.target_modules,
        task_type="CAUSAL_LM",
    )


def real_group(index: int, share: float) -> bool:
    """Whether rollout group `index` (counted over the run) runs in the real worlds when a share
    `share` of groups should: exactly ceil(n * share) of the first n groups are, group 0 first."""
    return math.ceil((index + 1) * share - 1e-9) > math.ceil(index * share - 1e-9)


class WorldGRPOTrainer(ShardedTrainer, GRPOTrainer):
    """GRPOTrainer whose rollouts are episodes in worldsmith worlds (see the module docstring).

    Dataset rows (see `task_dataset`) carry `bundle` (a key of `bundles`), `task_id` and `prompt`
    (the task as chat messages, for TRL's bookkeeping)."""

    # TRL's attributes as this trainer has them (GRPOTrainer.__init__ sets them; TRL types them wider)
    processing_class: PreTrainedTokenizerBase
    num_generations: int
    scale_rewards: Literal["group", "batch", "none"]

    def __init__(
        self,
        *args: Any,
        config: TrainingConfig,
        runtime: Runtime,
        bundles: dict[str, Bundle],
        simulation: SimulatedRuntime | None = None,
        **kwargs: Any,
    ):
        refuse_unsupported(kwargs.get("args"))  # before any setup: GRPOConfig comes by keyword (reward_funcs follows)
        self.config, self.runtime, self.bundles, self.simulation = config, runtime, bundles, simulation
        self.last_rollouts: list[Trajectory] = []
        self.last_rows: list[TrainingRow] = []
        self.judge: Any = None
        self.step_guard: SkippableStep | None = None
        if config.reward != "verifier":
            from worldsmith.training.judged_reward import RewardJudge

            self.judge = RewardJudge.for_training(config)
        self.real_starts: Any = None
        if simulation is not None and config.real_starts > 0:
            from worldsmith.worldmodel.real_starts import RealStarts

            self.real_starts = RealStarts(runtime)
        # `args`: GRPOTrainer's positional ones, the model first (mypy counts reward_funcs among them)
        super().__init__(*args, reward_funcs=[verdict_reward(config.rewards)], **kwargs)  # type: ignore[misc]
        self.stop_ids = stop_token_ids(self.processing_class)  # what ends a turn: fixed for the run
        self.engine = None if config.rollout_engine == "in_process" else RolloutEngine.for_trainer(self)

    def rollouts(self, inputs: Sequence[TaskRef]) -> list[Trajectory]:
        """One episode per input; sampling is seeded once per batch by (config seed, step, process)."""
        import torch
        from trl.models.utils import disable_gradient_checkpointing

        step = self.state.global_step
        jobs = [(self.bundles[x["bundle"]], self._task(x)) for x in inputs]
        episode = EpisodeConfig(
            max_turns=self.config.max_turns,
            window=self.config.window if self.config.history == "windowed" else None,
            rewards=self.config.rewards,
            side_effects=self.config.side_effects,
        )
        worlds = self.worlds(step, len(inputs))
        starts = self.starts(step, jobs, worlds)

        def policy(batcher: Batcher, index: int) -> TrainingPolicy:
            start = starts[index]
            return TrainingPolicy(
                self.model,
                self.processing_class,
                batcher,
                index,
                max_new_tokens=self.config.max_completion_length,
                temperature=self.config.temperature,
                prefix=start.messages if start else None,
                window=episode.window,
            )

        torch.manual_seed(self.config.seed * 100_003 + step + self.accelerator.process_index)
        if self.engine is not None:  # asynchronous episodes against the engine, each judged as it ends
            prefixes = [start.messages if start else None for start in starts]
            judge = judge_each(self.judge, jobs, self._metrics["train" if self.model.training else "eval"])  # type: ignore[union-attr]
            trajectories = self.engine.rollouts(self.runtime, jobs, episode, self.config, worlds, prefixes, judge)
        else:  # the model and its checkpointing settings as TRL's own generation passes them
            with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):  # type: ignore[arg-type]
                trajectories = run_rollouts(self.runtime, jobs, policy, self.lockstep_generate, episode, worlds)
        for trajectory, start in zip(trajectories, starts, strict=True):
            if start is not None:  # the whole episode: the real turns it started after, then its own
                trajectory.messages = [*trajectory.messages[:2], *start.messages, *trajectory.messages[2:]]
                trajectory.steps = [*start.steps, *trajectory.steps]
        if self.real_starts is not None:
            self.real_starts.add(trajectories)
            self._metrics["train"]["real_start_rate"].append(sum(s is not None for s in starts) / len(starts))
        failed = [t for t in trajectories if t.verdict == Verdict.agent_error]
        if failed:  # the model itself failed (out of memory, say): not the agent's fault, not a reward
            raise RuntimeError(f"generation failed during rollouts: {failed[0].error}")
        return trajectories

    def starts(self, step: int, jobs: list[tuple[Bundle, Any]], worlds: list[Any] | None) -> list[Any]:
        """The real mid-episode state each rollout starts from (worldmodel/real_starts.py), or None for
        the task's start: with `real_starts`, an imagined group starts from one drawn state (all its
        rollouts from the same, so that their advantages compare like with like) with that probability,
        seeded by (config seed, step, process, group). `worlds` change to match."""
        if self.real_starts is None or worlds is None or self.simulation is None:  # (real_starts need one)
            return [None] * len(jobs)
        from worldsmith.worldmodel.real_starts import StartedSimulation

        starts: list[Any] = []
        for first in range(0, len(jobs), self.num_generations):
            rng = random.Random(f"{self.config.seed}:{step}:{self.accelerator.process_index}:{first}")
            bundle, task = jobs[first]
            imagined = worlds[first] is self.simulation and rng.random() < self.config.real_starts
            start = self.real_starts.draw(bundle, task, rng) if imagined else None
            starts += [start] * self.num_generations
        for index, start in enumerate(starts):
            if start is not None:
                worlds[index] = StartedSimulation(self.simulation, start)
        return starts

    def worlds(self, step: int, entries: int) -> list[EpisodeSource] | None:
        """Where each of this process's `entries` rollouts runs: None (all real) without simulation;
        else one world per group, real for the groups `real_group` picks, imagined for the rest."""
        if self.simulation is None:
            return None
        groups = entries // self.num_generations
        first = (step * self.accelerator.num_processes + self.accelerator.process_index) * groups
        return [
            self.runtime if real_group(first + g, self.config.real_share) else self.simulation
            for g in range(groups)
            for _ in range(self.num_generations)
        ]

    def generate_batch(self, prompts: list[list[int]]) -> list[Sampled]:
        """Completions for a batch of prompt token ids, by TRL's generation backend (transformers,
        or vLLM when enabled, which also reports each token's log-probability), with the trainer's
        sampling settings."""
        # bf16 compute over fp32 weights on the gpu profile, as in the loss; TRL's sampling settings only
        with self.accelerator.autocast(), whole_distribution(self.accelerator.unwrap_model(self.model)):
            completions, logprobs = self._generate_single_turn(  # type: ignore[no-untyped-call]  # TRL's, unannotated
                prompts, None, {}, num_generations=1
            )
        if logprobs is None:  # transformers generation reports none
            return [Sampled(list(ids)) for ids in completions]
        return [Sampled(list(ids), list(lp)) for ids, lp in zip(completions, logprobs, strict=True)]

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """`inputs`: rows of the task dataset (`TaskRow`), as TRL hands them over."""
        mode = "train" if self.model.training else "eval"  # type: ignore[union-attr]  # set by TRL's __init__
        device = self.accelerator.device
        with self.generation_lockstep():  # sharded: every process generates until all are done (sharding.py)
            inputs, trajectories = self._teaching_rollouts(mode, inputs)
        stale = drop_stale(trajectories, self.state.global_step, self.config.max_staleness)  # engine rollouts only
        self._metrics[mode]["stale_dropped"].append(float(sum(stale)))
        scored = [
            {**x, "verdict": t.verdict, "dropped": s} for x, t, s in zip(inputs, trajectories, stale, strict=True)
        ]
        rewards_all = self._calculate_rewards(
            scored, [x["prompt"] for x in inputs], [t.answer for t in trajectories], [[] for _ in inputs]
        )[:, 0]
        rewards = [None if math.isnan(r) else r for r in rewards_all.tolist()]
        advantages_all = group_advantages(rewards, self.num_generations, self.scale_rewards)
        start = self.accelerator.process_index * len(inputs)
        advantages = advantages_all[start : start + len(inputs)]
        if mode == "train" and self.step_guard is not None:  # the same on every process: advantages are global
            self.step_guard.skip = not has_signal(advantages_all)
            self._metrics[mode]["skipped_step"].append(float(self.step_guard.skip))

        build = windowed_rows if self.config.history == "windowed" else full_rows
        rows = [row for i, (t, a) in enumerate(zip(trajectories, advantages, strict=True)) for row in build(t, a, i)]
        self.last_rollouts, self.last_rows = trajectories, rows
        pad_id = self.processing_class.pad_token_id
        batch = collate(rows or [TrainingRow([pad_id], [pad_id], 0.0, -1)], pad_id, device)
        if not rows:  # every rollout hit an env_error: a step that moves nothing
            batch["completion_mask"].zero_()
        loss_mask = batch["completion_mask"] * batch.get("tool_mask", 1)
        batch["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = self._reference_logps(batch)
        if self.use_vllm or self.engine is not None:  # sampled by another model than the trained one
            self._correct_for_sampler(mode, batch, loss_mask)
        self._log_rollouts(mode, trajectories, rewards_all, rows)
        return batch

    def _judged_rollouts(self, mode: str, inputs: Sequence[TaskRef]) -> list[Trajectory]:
        """One rollout per entry, judged when the reward has a judge (its metrics logged per round)."""
        tasks = [TaskRef(bundle=x["bundle"], task_id=x["task_id"]) for x in inputs]
        trajectories = self.rollouts(tasks)
        if self.judge is not None and self.engine is None:  # the engine's rollouts are judged as they end
            for key, value in self.judge.judge_rollouts([self._task(x) for x in tasks], trajectories).items():
                self._metrics[mode][key].append(value)
        return trajectories

    def _teaching_rollouts(self, mode: str, inputs: list[Any]) -> tuple[list[Any], list[Trajectory]]:
        """The step's rows and rollouts, dynamic sampling applied: a group whose rewards are all equal
        (signal.flat_groups) is replaced by a group of a row drawn from the dataset, for up to
        `refill_rounds` rounds (seeded by config seed, step and process); the count replaced is logged."""
        inputs, trajectories = list(inputs), self._judged_rollouts(mode, inputs)
        n, refilled = self.num_generations, 0
        rng = random.Random(f"refill:{self.config.seed}:{self.state.global_step}:{self.accelerator.process_index}")
        for _ in range(self.config.refill_rounds if mode == "train" else 0):
            flat = flat_groups([t.reward for t in trajectories], n)  # as the loop and the judge left them
            if not flat:
                break
            dataset: Any = self.train_dataset  # the task dataset (`task_dataset`): rows by index
            fresh = [dataset[i] for i in refill(len(dataset), len(flat), rng) for _ in range(n)]
            more = self._judged_rollouts(mode, fresh)
            for k, group in enumerate(flat):
                inputs[group * n : (group + 1) * n] = fresh[k * n : (k + 1) * n]
                trajectories[group * n : (group + 1) * n] = more[k * n : (k + 1) * n]
            refilled += len(flat)
        if mode == "train":
            self._metrics[mode]["groups_refilled"].append(float(refilled))
        return inputs, trajectories

    def create_optimizer(self, model: Any = None) -> Any:
        """The Trainer's optimizer, its `step` skippable (signal.SkippableStep) for steps without signal."""
        optimizer = super().create_optimizer(model)
        if not isinstance(optimizer.step, SkippableStep):
            self.step_guard = SkippableStep(optimizer.step)
            optimizer.step = self.step_guard  # type: ignore[method-assign]  # wrapped in place: accelerate calls it
        return optimizer

    def _task(self, entry: TaskRef) -> TaskSpec:
        """The task of a dataset entry."""
        return self.bundles[entry["bundle"]].task(entry["task_id"])

    def micro_batches(self, batch: dict[str, torch.Tensor]) -> list[list[int]]:
        """The batch's rows grouped into passes of at most `max_tokens_per_micro_batch` padded tokens."""
        return micro_batches(row_lengths(batch), self.config.max_tokens_per_micro_batch)

    def compute_loss(
        self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        """TRL's loss of the whole batch, computed over its micro-batches: each micro-batch's loss,
        weighted by its share of the batch's normalisation (`_share`), is backpropagated as it is
        computed (without gradient synchronisation across processes) except the last one's, which
        the Trainer backpropagates; the value returned is the whole batch's loss. The gradients add
        up to those of one pass over the batch. Metrics that TRL logs per pass (entropy, clip
        ratios, kl) become the mean over the micro-batches. With several processes each runs as many
        passes as the busiest (`rows.even_out`: a pass holds collectives), an empty one over a row
        whose tokens are all masked."""
        import torch

        groups = self.micro_batches(inputs)
        if self.accelerator.num_processes > 1:
            most = self.accelerator.gather(torch.tensor([len(groups)], device=self.accelerator.device)).max()
            groups = even_out(groups, int(most))
        if self.model.training:  # type: ignore[union-attr]  # set by TRL's __init__
            self._metrics["train"]["micro_batches"].append(float(len(groups)))
        if len(groups) == 1:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if not torch.is_grad_enabled():  # evaluation: nothing to backpropagate
            return sum(self._micro_batch_loss(model, inputs, group) for group in groups)
        done = 0.0
        for group in groups[:-1]:
            with self.accelerator.no_sync(model):
                loss = self._micro_batch_loss(model, inputs, group)
                self.accelerator.backward(loss)
            done += loss.detach()
        return self._micro_batch_loss(model, inputs, groups[-1]) + done

    def _micro_batch_loss(self, model: Any, inputs: dict[str, torch.Tensor], group: list[int]) -> Any:
        """TRL's loss of the rows `group` of `inputs`, weighted by their share (an empty group: a
        pass over row 0 with every token masked, loss 0)."""
        part = take_rows(inputs, group or [0])
        if not group:
            part["completion_mask"] = part["completion_mask"].zero_()
        return super().compute_loss(model, part) * self._share(part, inputs)

    def _share(self, part: dict[str, torch.Tensor], whole: dict[str, torch.Tensor]) -> float:
        """What a micro-batch's loss counts for in the whole batch's: 1 for the loss types normalised
        by the batch's token count (`num_items_in_batch`: dapo, the default, cispo, vespo); its
        share of the rows for those averaged over rows (grpo, sapo, luspo, dr_grpo), of the loss
        tokens for bnpo."""
        if self.loss_type in ("dapo", "cispo", "vespo"):
            return 1.0
        if self.loss_type == "bnpo":

            def tokens(batch: dict[str, torch.Tensor]) -> float:
                return float((batch["completion_mask"] * batch.get("tool_mask", 1)).sum())

            return tokens(part) / max(tokens(whole), 1.0)
        share: float = part["prompt_ids"].size(0) / whole["prompt_ids"].size(0)
        return share

    def _completion_logps(self, model: Any, batch: dict[str, torch.Tensor]) -> Any:
        """Per-token log-probabilities of the batch's completions under `model`, without gradients,
        computed micro-batch by micro-batch (0 at padding)."""
        import torch

        out = None
        for group in self.micro_batches(batch):
            part = take_rows(batch, group)
            ids = torch.cat([part["prompt_ids"], part["completion_ids"]], dim=1)
            mask = torch.cat([part["prompt_mask"], part["completion_mask"]], dim=1)
            width = part["completion_ids"].size(1)
            with torch.no_grad():
                logps = self._get_per_token_logps_and_entropies(model, ids, mask, width)[0]
            if out is None:
                out = logps.new_zeros(batch["completion_ids"].shape)
            out[torch.tensor(group, device=out.device), :width] = logps
        return out

    def _reference_logps(self, batch: dict[str, torch.Tensor]) -> Any:
        """Per-token log-probabilities of the completions under the reference model (KL term)."""
        from trl.trainer.utils import use_adapter

        if self.ref_model is not None:
            return self._completion_logps(self.ref_model, batch)
        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self._completion_logps(self.model, batch)

    def _correct_for_sampler(self, mode: str, batch: dict[str, torch.Tensor], loss_mask: Any) -> None:
        """The importance-sampling correction (importance.weigh_advantages) of the trained model's
        log-probabilities of the sampled tokens against the sampler's, folded into the advantages."""
        train = self._completion_logps(self.model, batch)
        bounds = (self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max)
        for key, value in weigh_advantages(
            batch, train, loss_mask, self.vllm_importance_sampling_mode, *bounds
        ).items():
            self._metrics[mode][key].append(value)

    def _log_rollouts(self, mode: str, trajectories: list[Trajectory], rewards: Any, rows: list[TrainingRow]) -> None:
        """Per-step rollout metrics (TRL averages them per logging step)."""
        limit, simulated = self.config.max_completion_length, self.simulation is not None
        for key, value in rollout_metrics(trajectories, rewards, rows, limit, self.stop_ids, simulated).items():
            self._metrics[mode][key].append(value)
