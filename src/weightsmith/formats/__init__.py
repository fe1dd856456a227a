"""Quantization formats as they appear on disk: what each writes, and how to read it back."""
