"""The safetensors format: a strict header parser, a positional reader and a streaming writer."""

from weightsmith.safetensors.header import Header, TensorInfo, parse_header, read_header
from weightsmith.safetensors.reader import ShardReader
from weightsmith.safetensors.writer import ShardWriter, TensorSpec

__all__ = [
    "Header",
    "ShardReader",
    "ShardWriter",
    "TensorInfo",
    "TensorSpec",
    "parse_header",
    "read_header",
]
