"""GPTQ's settings and their defaults, apart from its kernels: the quantize flow, the recipe and the
command line read them without loading numba (`engine.gptq` compiles its column kernel on import)."""

#: llm-compressor's GPTQ dampening (`dampening_frac`): what a like-for-like comparison with it passes.
LLM_COMPRESSOR_DAMPENING = 0.01
#: The fraction of each Hessian's mean diagonal GPTQ adds to its diagonal. Ten times llm-compressor's:
#: with a few thousand calibration tokens and inputs as wide (Qwen2.5-1.5B's down_proj reads 8,960
#: columns), 1 % lets GPTQ fit the calibration text and lose on held-out text; 0.1 gained on both
#: models of docs/fidelity-study.md (-40 % KL against round-to-nearest on Qwen, -64 % on SmolLM2).
GPTQ_DAMPENING = 0.1
#: Column orders: "static" quantizes columns by decreasing Hessian diagonal, each on its own group's
#: grid (llm-compressor's default; the stored format is unchanged); "none" in their stored order.
ACTORDERS = ("static", "none")
