"""What names a world model, and how simulated episodes are answered: the world-model side of the
training and evaluation forms (TrainingConfig.simulate, the evaluate flow's `simulate`).

Pydantic and the standard library only, so the forms and the command line that hold these load
nothing of the world models themselves (`worldsmith/worldmodel/world_models.py` builds them).
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator


def check_world_model(spec: str, names: tuple[str, ...] = ("oracle", "static")) -> str:
    """`spec` if it is one of `names`, openai:MODEL or hf:PATH, else ValueError naming the choices
    (nothing is loaded)."""
    kind, _, target = spec.partition(":")
    if spec in names or kind in ("openai", "hf") and target:
        return spec
    raise ValueError(f"unknown world model {spec!r}: use {', '.join(names)}, openai:MODEL or hf:PATH")


class SimulationConfig(BaseModel):
    """How simulated episodes are answered."""

    world_model: str = Field(
        description="code (the environment's own tools: exact), static, openai:MODEL (the "
        "configured endpoint) or hf:PATH (a trained world model directory)."
    )
    samples: int = Field(
        1,
        ge=1,
        le=16,
        description="Predictions per call; with more than one, their disagreement is the call's uncertainty.",
    )
    uncertainty_threshold: float = Field(
        1.0,
        ge=0,
        le=1,
        description=(
            "A simulated episode stops (env_error, limit `uncertain`) at a call whose uncertainty (1 - the share of the "
            "most common prediction) is above this."
        ),
    )
    max_new_tokens: int = Field(512, ge=16, description="hf: world models: tokens generated per prediction at most.")

    @field_validator("world_model")
    @classmethod
    def _known_kind(cls, spec: str) -> str:
        return check_world_model(spec, ("code", "static"))
