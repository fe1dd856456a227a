"""The demo checkpoint's shape, small: W4A16 groups of 128 still fit every Linear, and a checkpoint
writes in well under a second (preflight's tests quantize it with several schemes)."""

from weightsmith.demo import DEMO_CONFIG

SMALL_DEMO = {
    **DEMO_CONFIG,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
