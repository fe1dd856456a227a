"""Quantization schemes, each a quantize/dequantize pair, and decoders for quantized inputs."""
