"""What `verify` says of the declaration itself: the reader's problems are errors, and what the
tensors could not be compared with (an unknown producer, possible class targets, a format no layout
describes) is reported for the record, each as one line on config.json."""

from __future__ import annotations

from typing import Any

from weightsmith.audit.check_quant import declaration_findings
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.declaration import read_declaration


def _findings(config: dict[str, Any] | None, hf_quant: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    decl = read_declaration(config, hf_quant)
    assert decl is not None
    return [(f.check, f.severity, f.line()) for f in declaration_findings(decl)]


def test_a_producer_not_read_is_reported_with_its_quant_method_as_written() -> None:
    for method, shown in (("bnb", "'bnb'"), (None, "None"), (5, "5")):
        assert _findings({"quantization_config": {"quant_method": method}}) == [
            (
                "quant.unchecked",
                "info",
                f"config.json: quant_method {shown} is not one the doctor checks; "
                "its tensors were not compared with it",
            )
        ]


def test_a_config_that_is_no_object_is_invalid_and_nothing_else() -> None:
    assert _findings({"quantization_config": 5}) == [
        ("quant.config-invalid", "error", "config.json: quantization_config is not a JSON object")
    ]


def test_problems_come_first_then_class_targets_then_formats_no_layout_describes() -> None:
    qc = ct.quantization_config("group_0", "sparse-24", ct.weight_args(4, True, 128), ["lm_head"])
    qc["config_groups"]["group_0"]["targets"] = ["Linear", "MyLinear", "re:([", "MyLinear"]
    assert _findings({"quantization_config": qc}) == [
        ("quant.config-invalid", "error", "config.json: pattern 're:([' is not a valid regular expression"),
        (
            "quant.unchecked",
            "info",
            "config.json: targets ['MyLinear'] may be class names other than Linear, which tensor names cannot "
            "reveal; each was matched as an exact module name only",
        ),
        (
            "quant.unchecked",
            "info",
            "config.json: format 'sparse-24' of group 'group_0' is not one the doctor checks tensor by tensor",
        ),
    ]


def test_a_modelopt_algorithm_no_layout_describes_names_config_json_whichever_file_declared_it() -> None:
    hf_quant = {"quantization": {"quant_algo": "W4A8_AWQ", "kv_cache_quant_algo": 8}}
    assert _findings(None, hf_quant) == [
        (
            "quant.config-invalid",
            "error",
            "hf_quant_config.json: quantization.kv_cache_quant_algo is 8, not a string or null",
        ),
        (
            "quant.unchecked",
            "info",
            "config.json: ModelOpt quant_algo 'W4A8_AWQ' is not one the doctor checks tensor by tensor",
        ),
    ]
