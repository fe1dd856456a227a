"""weightsmith: serving-ready LLM checkpoints from raw safetensors, and the evidence for them."""

__version__ = "0.1.0"
