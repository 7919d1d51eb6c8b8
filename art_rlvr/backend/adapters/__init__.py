"""LoRA adapters per model and step on a shared base model, their checkpoints and sources."""
