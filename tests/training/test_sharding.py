"""Sharded training (training/sharding.py): the FSDP2 settings accelerate gets, DDP's gradients as
bucket views, LoRA's defaults, and the real launched trainer in two CPU processes (gloo) under FSDP:
finite losses, sharded checkpoints equal to the gathered final model, and a resumed run equal to
the uninterrupted one."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from test_training import make_trainer, one_task  # noqa: F401 - one_task is a fixture used below

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.loader import write_bundle
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.models.catalog import TrainingRun
from worldsmith.models.training import TrainerOutcome
from worldsmith.storage.run_records import add_run
from worldsmith.training.config import LORA_ALL_LINEAR, TrainingConfig
from worldsmith.training.sharding import accelerate_config, fsdp_plugin_args, process_group_environment

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.mark.unit
def test_fsdp_settings_are_fsdp2_full_shard_by_decoder_layer_with_sharded_checkpoints():
    config = TrainingConfig(model="m", set_name="s", processes=4, nodes=2, sharding="fsdp")
    assert fsdp_plugin_args(config) == {
        "fsdp_version": 2,
        "reshard_after_forward": True,  # full shard
        "auto_wrap_policy": "transformer_based_wrap",  # the model's decoder layer (_no_split_modules)
        "state_dict_type": "SHARDED_STATE_DICT",
        "cpu_offload": False,
        "cpu_ram_efficient_loading": False,
        "activation_checkpointing": False,
    }
    written = accelerate_config(config.model_copy(update={"profile": "gpu", "cpu_offload": True}))
    assert written["distributed_type"] == "FSDP" and written["num_processes"] == 8 and written["num_machines"] == 2
    assert written["mixed_precision"] == "bf16" and written["fsdp_config"]["fsdp_offload_params"] is True
    assert written["fsdp_config"]["fsdp_version"] == 2
    ddp = TrainingConfig(model="m", set_name="s", processes=2)
    assert fsdp_plugin_args(ddp) is None and accelerate_config(ddp)["distributed_type"] == "MULTI_GPU"
    # CPU-held shards need gloo beside nccl, which accelerate opens when told FSDP offloads
    assert process_group_environment(config.model_copy(update={"profile": "gpu", "cpu_offload": True})) == {
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_OFFLOAD_PARAMS": "true",
    }
    assert process_group_environment(ddp) == {}


@pytest.mark.unit
def test_fsdp_settings_refuse_what_they_cannot_mean():
    with pytest.raises(ValueError, match="cpu_offload applies to sharding='fsdp' only"):
        TrainingConfig(model="m", set_name="s", cpu_offload=True)
    with pytest.raises(ValueError, match="train LoRA with sharding ddp"):
        TrainingConfig(model="m", set_name="s", sharding="fsdp", lora={"enabled": True})
    with pytest.raises(ValueError, match="use sharding ddp with rollout_engine"):
        TrainingConfig(model="m", set_name="s", sharding="fsdp", rollout_engine="local")


@pytest.mark.unit
def test_lora_defaults_learn_at_1e_5_on_every_linear_layer():
    config = TrainingConfig(model="m", set_name="s", lora={"enabled": True})
    assert config.lora.learning_rate == 1e-5 and config.learning_rate == 7e-7
    assert tuple(config.lora.target_modules) == LORA_ALL_LINEAR
    assert {"q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= set(config.lora.target_modules)


@pytest.mark.e2e
def test_lora_trains_at_its_own_learning_rate_on_every_linear_layer(tiny_model, one_task, runtime, tmp_path):  # noqa: F811
    trainer = make_trainer(tiny_model, one_task, runtime, tmp_path, lora={"enabled": True})
    assert trainer.args.learning_rate == 1e-5
    # names like model.layers.0.self_attn.q_proj.lora_A.default.weight
    adapted = {name.split(".")[-4] for name, _ in trainer.model.named_parameters() if ".lora_A." in name}
    assert adapted == set(LORA_ALL_LINEAR)


@pytest.mark.e2e
def test_ddp_keeps_gradients_as_bucket_views(tiny_model, one_task, runtime, tmp_path):  # noqa: F811
    from accelerate.utils import DistributedDataParallelKwargs

    trainer = make_trainer(tiny_model, one_task, runtime, tmp_path)
    handlers = [h for h in trainer._build_accelerator_args()["kwargs_handlers"]]
    (ddp,) = [h for h in handlers if isinstance(h, DistributedDataParallelKwargs)]
    assert ddp.gradient_as_bucket_view is True and ddp.to_kwargs()["gradient_as_bucket_view"] is True
    assert "fsdp_plugin" not in trainer._build_accelerator_args()


def sometimes_calling(model_dir: Path, bundle: Bundle, out: Path, share: float = 0.5) -> Path:
    """The tiny model taught, by a few steps on the last position of episodes' first prompts, to open
    its turn with `<tool_call>` `share` of the time and to end it at once (`<|im_end|>`) otherwise:
    its rollouts then differ from their first token (a malformed call is a format_error, an empty
    answer incomplete), so a group has something to teach."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worldsmith.agent.hf_policy import render_prompt
    from worldsmith.agent.loop import system_prompt
    from worldsmith.agent.messages import Message
    from worldsmith.runtime.episode import tool_schemas

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    call, end = tokenizer.convert_tokens_to_ids(["<tool_call>", "<|im_end|>"])
    prompts = [  # an episode's first prompt, as the trainer's policy renders it
        render_prompt(
            tokenizer,
            [
                Message(role="system", content=system_prompt(bundle, with_tools=False)),
                Message(role="user", content=task.instruction),
            ],
            tool_schemas(bundle),
        )
        for task in bundle.tasks[:2]  # the tools make most of a prompt: two teach them all
    ]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(100):  # a few steps suffice; bounded
        logps = torch.stack([model(torch.tensor([ids])).logits[0, -1].log_softmax(-1)[[call, end]] for ids in prompts])
        if logps.exp().sum(-1).min() >= 0.9:
            break
        optimizer.zero_grad()
        (-(logps * torch.tensor([share, 1 - share])).sum(-1).mean()).backward()
        optimizer.step()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _weights(directory) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


def _checkpoint_weights(checkpoint) -> dict[str, torch.Tensor]:
    """The model weights of a sharded (torch.distributed.checkpoint) trainer checkpoint, read in this
    one process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    (shards,) = [p for p in checkpoint.iterdir() if p.name.startswith("pytorch_model_fsdp")]
    dcp_to_torch_save(shards, checkpoint / "gathered.pt")
    state = torch.load(checkpoint / "gathered.pt", weights_only=True)
    return state.get("model", state)


@pytest.fixture(scope="module")
def fsdp_launch(tiny_model, tmp_path_factory: pytest.TempPathFactory):
    """`launch(output, resume_from)`: the launched trainer (torch.distributed.run, 2 CPU processes, gloo)
    under FSDP2 for two steps of two-turn rollouts of a model that sometimes calls a tool (format_error
    worth 0.1 over incomplete's 0: groups with signal), a checkpoint per step; in a home of this module's own."""
    from worldsmith.settings import get_settings
    from worldsmith.training.launch import TrainRequest, launch

    root = tmp_path_factory.mktemp("fsdp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORLDSMITH_HOME", str(root / "home"))
        patch.setenv("WORLDSMITH_SANDBOX_WORKERS", "2")
        get_settings.cache_clear()
        retail = procedural_bundle("retail", 2)
        bundle = write_bundle(retail, root / "retail_2")
        model = sometimes_calling(tiny_model, retail, root / "calling")
        config = TrainingConfig(
            model=str(model),
            set_name="none",
            group_size=4,
            steps=2,
            max_turns=2,
            max_completion_length=8,
            learning_rate=1e-3,
            lr_warmup_steps=0,
            rewards={"format_error": 0.1},
            processes=2,
            save_every=1,
            sharding="fsdp",
        )

        def run(output: Path, resume_from: Path | None = None) -> TrainerOutcome:
            request = TrainRequest(
                config=config,
                model=str(model),
                bundles=[str(bundle)],
                run_id=add_run(TrainingRun(config={})),
                output=str(output),
                resume_from=str(resume_from) if resume_from else None,
            )
            return launch(request, 2)

        yield model, root, run
    get_settings.cache_clear()


@pytest.fixture(scope="module")
def fsdp_trained(fsdp_launch):
    """The FSDP run's initial model, output directory and outcome."""
    model, root, run = fsdp_launch
    return model, root / "fsdp", run(root / "fsdp")


@pytest.mark.e2e
def test_fsdp_training_in_two_gloo_processes_checkpoints_the_gathered_weights(fsdp_trained):
    """Finite losses, weights that moved, the run's accelerate config, and a sharded checkpoint per
    step whose weights equal the gathered final model's (the last step's)."""
    model, out, result = fsdp_trained
    assert result.processes == 2 and result.steps == 2
    assert json.loads((out / "accelerate.json").read_text())["distributed_type"] == "FSDP"
    losses = [entry["loss"] for entry in result.log]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses), result.log
    assert any(entry["skipped_step"] == 0 for entry in result.log), result.log  # at least one optimizer step
    final, initial = _weights(out / "final"), _weights(model)
    assert final.keys() == initial.keys()
    assert any(not torch.equal(final[k], initial[k]) for k in final), "no weight moved"
    checkpointed = _checkpoint_weights(out / "checkpoint-2")
    for name, weight in final.items():
        torch.testing.assert_close(checkpointed[name], weight, rtol=0, atol=0, msg=name)


@pytest.mark.e2e
def test_fsdp_run_resumed_from_its_sharded_checkpoint_ends_as_the_uninterrupted_one(fsdp_launch, fsdp_trained):
    _, root, run = fsdp_launch
    _, out, _ = fsdp_trained
    resumed = run(root / "resumed", resume_from=out / "checkpoint-1")
    assert resumed.steps == 2
    again, final = _weights(root / "resumed" / "final"), _weights(out / "final")
    for name, weight in final.items():
        torch.testing.assert_close(again[name], weight, rtol=1e-5, atol=1e-6, msg=name)
