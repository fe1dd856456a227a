"""How much a quantization costs: weight error streamed from disk, and logits on CPU where possible.

`weights.weight_error` compares the dequantized weights of a compressed-tensors checkpoint with the
originals one tensor at a time, for any model size. `logits.compare` runs both checkpoints through
transformers (when it is installed and the model fits in memory) and measures what the error does
to next-token predictions. `cli` joins them as `weightsmith eval`.
"""
