"""TrainingConfig: the paper's defaults, validation, and a schema Prefect can render as a form."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from worldsmith.training.config import TrainingConfig


def test_defaults_follow_the_reference_recipe():
    config = TrainingConfig(model="/models/tiny", set_name="train-set")
    assert (config.group_size, config.learning_rate, config.history, config.window) == (16, 7e-7, "windowed", 3)
    assert config.rewards.reward("format_error") == -1.0 and config.lora.enabled is False


def test_bad_values_are_named():
    with pytest.raises(ValidationError, match="group_size"):
        TrainingConfig(model="m", set_name="s", group_size=1)
    with pytest.raises(ValidationError, match="window applies to history='windowed' only"):
        TrainingConfig(model="m", set_name="s", history="full", window=5)


def test_json_schema_has_descriptions_enums_and_nested_fields():
    schema = TrainingConfig.model_json_schema()
    properties = schema["properties"]
    assert properties["history"]["enum"] == ["windowed", "full"] and properties["profile"]["enum"] == ["cpu-test", "gpu"]
    assert all(properties[name].get("description") for name in ("model", "set_name", "group_size", "learning_rate", "window"))
    assert schema["$defs"]["LoraConfig"]["properties"]["rank"]["maximum"] == 512
