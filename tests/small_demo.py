"""The demo checkpoint's shape, small: W4A16 groups of 128 still fit every Linear, and a checkpoint
writes in well under a second (preflight's tests quantize it with several schemes)."""

from pathlib import Path

from audit.doctor_builders import cli
from weightsmith.quantization.demo import DEMO_CONFIG, write_demo_checkpoint

SMALL_DEMO = {
    **DEMO_CONFIG,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}


def quantized_small_demos(root: Path, schemes: tuple[str, ...]) -> dict[str, Path]:
    """The small demo checkpoint written under `root` and quantized by the CLI with each scheme."""
    bf16 = write_demo_checkpoint(root / "bf16", config=SMALL_DEMO)
    found = {}
    for scheme in schemes:
        found[scheme] = root / scheme
        assert cli(["quantize", str(bf16), str(found[scheme]), "--scheme", scheme, "--no-hash"]) == 0
    return found
