"""NVIDIA ModelOpt exports on disk: the tensors of each quantized Linear and `hf_quant_config.json`.

Facts from vLLM's `model_executor/layers/quantization/modelopt.py` (`ModelOptNvFp4Config.from_config`,
`ModelOptNvFp4LinearMethod` / `ModelOptFp8LinearMethod` `create_weights`) and the ModelOpt export
docs (the unified Hugging Face checkpoint: `hf_quant_config.json` beside `config.json`).
"""

from __future__ import annotations

from weightsmith import names
from weightsmith.quant import NVFP4_GROUP

#: ModelOpt's own quantization config, beside config.json (vLLM `get_config_filenames`).
HF_QUANT_CONFIG_FILE = "hf_quant_config.json"

#: `quant_algo` values (hf_quant_config.json `quantization.quant_algo`).
MODELOPT_NVFP4, MODELOPT_FP8 = "NVFP4", "FP8"
#: quant_algo -> parameter -> safetensors dtype of each quantized Linear.
MODELOPT_PARAMS: dict[str, dict[str, str | None]] = {
    MODELOPT_NVFP4: {
        names.WEIGHT: "U8",  # two FP4 E2M1 codes per byte along the input dim
        names.WEIGHT_SCALE: "F8_E4M3",  # one per 16 inputs
        names.WEIGHT_SCALE_2: "F32",
        names.INPUT_SCALE: "F32",
    },
    MODELOPT_FP8: {names.WEIGHT: "F8_E4M3", names.WEIGHT_SCALE: "F32", names.INPUT_SCALE: "F32"},
}
#: Inputs per FP8 block scale of an NVFP4 weight: the NVFP4 format's group.
MODELOPT_NVFP4_GROUP = NVFP4_GROUP
#: vLLM refuses an NVFP4 hf_quant_config.json that lacks any of these keys (value may be null).
MODELOPT_NVFP4_REQUIRED_KEYS = ("group_size", "kv_cache_quant_algo", "exclude_modules")
