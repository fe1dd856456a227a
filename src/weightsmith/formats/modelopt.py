"""NVIDIA ModelOpt exports on disk: the tensors of each quantized Linear and `hf_quant_config.json`.

Facts from vLLM's `model_executor/layers/quantization/modelopt.py` (`ModelOptNvFp4Config.from_config`,
`ModelOptNvFp4LinearMethod` / `ModelOptFp8LinearMethod` `create_weights`) and the ModelOpt export
docs (the unified Hugging Face checkpoint: `hf_quant_config.json` beside `config.json`).
"""

from __future__ import annotations

from weightsmith.formats.layouts import Args, Layout
from weightsmith.io import names
from weightsmith.quant import NVFP4_GROUP

#: ModelOpt's own quantization config, beside config.json (vLLM `get_config_filenames`).
HF_QUANT_CONFIG_FILE = "hf_quant_config.json"

#: `quant_algo` values (hf_quant_config.json `quantization.quant_algo`).
MODELOPT_NVFP4, MODELOPT_FP8 = "NVFP4", "FP8"
#: quant_algo -> the tensors of each quantized Linear. NVFP4: two FP4 (E2M1) codes per byte along
#: the input dimension, an FP8 scale per 16 inputs, float32 `weight_scale_2` and `input_scale`.
LAYOUTS: dict[str, Layout] = {
    MODELOPT_NVFP4: Layout(
        Args(4, "float", "tensor_group", NVFP4_GROUP),
        names.WEIGHT,
        "U8",
        4,
        8,
        scale_dtype="F8_E4M3",
        scale_block=(1, NVFP4_GROUP),
        global_scale=names.WEIGHT_SCALE_2,
        input_scale=names.INPUT_SCALE,
    ),
    MODELOPT_FP8: Layout(
        Args(8, "float", "tensor"), names.WEIGHT, "F8_E4M3", scale_dtype="F32", input_scale=names.INPUT_SCALE
    ),
}
#: vLLM refuses an NVFP4 hf_quant_config.json that lacks any of these keys (value may be null).
MODELOPT_NVFP4_REQUIRED_KEYS = ("group_size", "kv_cache_quant_algo", "exclude_modules")
