"""A causal LM run one decoder layer at a time on CPU, for checkpoints larger than memory.

The model's own transformers modules are built on the meta device (`skeleton`). The arguments each
decoder layer is called with are recorded once by running the base model with every layer replaced
by a recorder (`stream.layer_arguments`); then each layer in turn is materialised from the shards
(`source`, dequantizing a quantized checkpoint), run on every sequence, and freed. Between layers
only the hidden states of the sequences are held. `calibrate` records activation maxima on the way
(`recorders`); `logits` computes next-token metrics from the final hidden states.
"""
