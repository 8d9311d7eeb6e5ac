"""worldsmith's worlds in other RL stacks: the environment object (environment.py) and, in-process,
the adapters that wrap it for Gymnasium, SkyRL-gym and TRL's GRPOTrainer; sets as Hugging Face
datasets of tasks (dataset.py). docs/integrations.md shows each at work."""
