"""The safetensors format: a strict header parser (`header`), a positional reader (`reader`) and a
streaming writer (`writer`). Each is imported by name, so that reading headers alone loads no numpy."""
