"""Sharded training (training/sharding.py): the FSDP2 settings accelerate gets, DDP's gradients as
bucket views, LoRA's defaults, and the real launched trainer in two CPU processes (gloo) under FSDP:
finite losses, sharded checkpoints equal to the gathered final model, and a resumed run equal to
the uninterrupted one."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from test_training import make_trainer, one_task  # noqa: F401 - one_task is a fixture used below

from worldsmith.bundle.loader import write_bundle
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.models.catalog import TrainingRun
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


@pytest.mark.e2e
def test_fsdp_training_in_two_gloo_processes_checkpoints_and_resumes(home, tiny_model, tmp_path):
    """The launched trainer (torch.distributed.run, 2 CPU processes, gloo) under FSDP2 for two steps
    of two-turn rollouts (generation in lockstep across the sharded processes): finite losses, weights
    that moved, a sharded checkpoint per step whose weights equal the gathered final model's, and a
    run resumed from the first checkpoint that ends with the same weights."""
    from worldsmith.training.launch import TrainRequest, launch

    bundle = write_bundle(procedural_bundle("retail", 2), tmp_path / "retail_2")
    config = TrainingConfig(
        model=str(tiny_model),
        set_name="none",
        group_size=2,
        steps=2,
        max_turns=2,
        max_completion_length=8,
        learning_rate=1e-3,
        lr_warmup_steps=0,
        processes=2,
        save_every=1,
        sharding="fsdp",
    )

    def run(output: str, resume_from: str | None = None):
        request = TrainRequest(
            config=config,
            model=str(tiny_model),
            bundles=[str(bundle)],
            run_id=add_run(TrainingRun(config={})),
            output=output,
            resume_from=resume_from,
        )
        return launch(request, 2)

    out = tmp_path / "fsdp"
    result = run(str(out))
    assert result.processes == 2 and result.steps == 2
    assert json.loads((out / "accelerate.json").read_text())["distributed_type"] == "FSDP"
    losses = [entry["loss"] for entry in result.log]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses), result.log
    final, initial = _weights(out / "final"), _weights(tiny_model)
    assert final.keys() == initial.keys()
    assert any(not torch.equal(final[k], initial[k]) for k in final), "no weight moved"
    checkpointed = _checkpoint_weights(out / "checkpoint-2")
    for name, weight in final.items():
        torch.testing.assert_close(checkpointed[name], weight, rtol=0, atol=0, msg=name)
    resumed = run(str(tmp_path / "resumed"), resume_from=str(out / "checkpoint-1"))
    assert resumed.steps == 2
    again = _weights(tmp_path / "resumed" / "final")
    for name, weight in final.items():
        torch.testing.assert_close(again[name], weight, rtol=1e-5, atol=1e-6, msg=name)
