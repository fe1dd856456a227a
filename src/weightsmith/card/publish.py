"""Serving it: the download line and a `vllm serve` line a reader can paste, built from the checkpoint
and the measurements, with every value the command carries cited in the list under it.

A command in a code block cannot carry source comments, so the values it holds are cited again in
the list below it, and `card --check` compares the block itself with what the sources give now.
A flag goes in only when something measured supports it: `--kv-cache-dtype fp8` only when
config.json declares an FP8 KV cache and `verify` found its scales; the speculative config's
`num_speculative_tokens` only from a sweep over it.
"""

from __future__ import annotations

from typing import Any

from weightsmith.card.cite import Citations
from weightsmith.card.made import article, draft_kind
from weightsmith.card.sources import BENCH_FILE, PREFLIGHT_FILE, VERIFY_FILE, CardSources
from weightsmith.core.terminal import markdown_code, markdown_text, shell_line
from weightsmith.formats.declaration import QuantDeclaration, read_declaration
from weightsmith.io.checkpoint import CONFIG_FILE
from weightsmith.io.manifest import MANIFEST_FILE
from weightsmith.io.serving import TARGET_VARIABLE, named_target, serve_command
from weightsmith.preflight.report import NOTE

#: vLLM's `--speculative-config` method for each draft kind the card recognises.
METHODS = {"DFlash": "dflash", "EAGLE3": "eagle3", "EAGLE": "eagle", "Medusa": "medusa", "MTP": "mtp"}
K_PARAM = "num_speculative_tokens"
B, C, V, M = BENCH_FILE, CONFIG_FILE, VERIFY_FILE, MANIFEST_FILE


#: The target in a served command when the draft's folder does not name it: a variable the reader sets.


def serving_it(src: CardSources, c: Citations, repo: str) -> list[str]:
    """The commands in a code block, then one cited line per value or flag they carry (or leave out)."""
    local = repo.split("/", 1)[1]
    kind = draft_kind(src.config)
    facts: list[str] = []
    if kind is None:
        kv_flags, kv_facts = _kv(src, c)
        facts += kv_facts
        command = serve_command(f"./{local}", None, kv_flags)
    else:
        target = named_target(src.config)
        spec: dict[str, Any] = {"method": METHODS[kind], "model": f"./{local}"}
        k, k_facts = _best_k(src, c)
        if k is not None:
            spec[K_PARAM] = k
        facts += k_facts
        command = serve_command(target.name if target else None, spec)
        facts.append(
            f"- `{METHODS[kind]}`: vLLM's method for {article(kind).lower()} {kind} draft "
            f"({c.text((src.config.get('architectures') or ['no architecture named'])[0], C, 'architectures[0]')})."
        )
        if target is None:
            facts.append(
                f"- `{TARGET_VARIABLE}`: the target model, which this folder does not name (see Target assignment)."
            )
    facts += _w4a4(src, c)
    facts += _calibration(src, c)
    facts += _preflight(src, c)
    return [
        "```bash",
        shell_line(["hf", "download", repo, "--local-dir", local]),
        command,
        "```",
        "",
        "What the command carries, and why:",
        "",
        *facts,
    ]


def _best_k(src: CardSources, c: Citations) -> tuple[Any, list[str]]:
    """The swept `num_speculative_tokens` with the best median decode rate, with its interval."""
    an = src.analysis
    sweep = next((s for s in an.sweeps if s.param == K_PARAM and s.best_value is not None), None) if an else None
    if sweep is None:
        why = "no benchmark was given" if an is None else f"{B} holds no sweep over it"
        return None, [
            f"- `{K_PARAM}` is left to you: {why}, so nothing measured says which value is best for this draft."
        ]
    where = f"analysis.sweeps[{sweep.base},{sweep.param}]"
    best = c.text(str(sweep.best_value), B, where + ".best_value")
    point = next(p for p in sweep.points if p.arm == sweep.best_arm)
    line = f"- `{K_PARAM}` {best}: the swept value with the highest median decode rate"
    if point.decode_geomean is not None:
        line += f", {c.num(format(point.decode_geomean, '.1f'), B, f'{where}.points[{point.arm}].decode_geomean')}"
        if point.decode_ci:
            low = c.num(format(point.decode_ci[0], ".1f"), B, f"{where}.points[{point.arm}].decode_ci[0]")
            high = c.num(format(point.decode_ci[1], ".1f"), B, f"{where}.points[{point.arm}].decode_ci[1]")
            line += f" tok/s [95% CI {low}–{high}]"
    line += f" (arm {markdown_code(sweep.best_arm or '')})."
    if sweep.best_note:
        line += f" The intervals overlap ({sweep.best_note}): no ordering is shown between those values."
    return sweep.best_value, [line]


def _check(src: CardSources, check_id: str) -> dict[str, Any] | None:
    return next((ch for ch in src.verify["checks"] if ch["id"] == check_id), None)


def _declaration(src: CardSources) -> QuantDeclaration | None:
    """config.json's quantization declaration, read by the one reader verify, eval and the plan use."""
    return read_declaration(src.config, None)


def _kv(src: CardSources, c: Citations) -> tuple[list[str], list[str]]:
    """(`--kv-cache-dtype fp8` when an FP8 KV cache is declared and `verify` found its scales, else no
    flag; the cited lines saying why)."""
    decl = _declaration(src)
    scheme = decl.kv_args if decl is not None else None
    if scheme is None:
        return [], ["- No `--kv-cache-dtype`: config.json declares no KV-cache scheme and ships no KV scales."]
    declared = scheme.type == "float" and scheme.num_bits == 8
    static = scheme.dynamic is False
    check = _check(src, "kv-cache")
    if not (declared and static) or check is None or not check["ran"]:
        return [], [
            "- No `--kv-cache-dtype`: config.json declares a KV-cache scheme that is not a static FP8 one, or "
            "`verify` did not check its scales."
        ]
    errors = c.num(str(check["errors"]), V, "checks[kv-cache].errors")
    scope = c.text(check["scope"], V, "checks[kv-cache].scope")
    bits = c.num(str(scheme.num_bits), C, "quantization_config.kv_cache_scheme.num_bits")
    if check["errors"]:
        return [], [
            f"- No `--kv-cache-dtype`: config.json declares a static {bits}-bit float KV cache, but `verify` found "
            f"{errors} error(s) in its KV scales ({scope}); vLLM would use a scale of 1.0 where one is missing."
        ]
    return ["--kv-cache-dtype", "fp8"], [
        f"- `--kv-cache-dtype fp8`: config.json declares a static {bits}-bit float KV cache and `verify` found its "
        f"k and v scales with {errors} error(s) ({scope})."
    ]


def _w4a4(src: CardSources, c: Citations) -> list[str]:
    """The backend note for NVFP4 with static activation scales (`input_global_scale`)."""
    if not src.manifest.recipe.scheme.startswith("nvfp4"):
        return []
    decl = _declaration(src)
    for group in decl.schemes if decl is not None else ():
        act = group.activations
        if act is not None and act.type == "float" and act.num_bits == 4:
            field = f"quantization_config.config_groups[{group.name}].input_activations.num_bits"
            bits = c.num(str(act.num_bits), C, field)
            check = _check(src, "quantization")
            found = (
                f"`verify`'s quantization check, which expects an `input_global_scale` per quantized Linear, found "
                f"{c.num(str(check['errors']), V, 'checks[quantization].errors')} error(s)"
                if check is not None and check["ran"]
                else "`verify` did not check them"
            )
            return [
                f"- W4A4: config.json declares {bits}-bit activations with static scales, and {found}. vLLM applies "
                "those activation scales only where FP4 runs natively (Blackwell-class GPUs); elsewhere it falls back "
                "to weight-only FP4 through Marlin, which ignores them, and the fidelity measured here does not "
                "describe that. For MoE experts, choose a backend that applies them (FlashInfer's CUTLASS experts, "
                "`VLLM_USE_FLASHINFER_MOE_FP4=1`, or vLLM's CUTLASS FP4 experts), not the Marlin fallback."
            ]
    return []


def _calibration(src: CardSources, c: Citations) -> list[str]:
    """Where static scales (KV, activations) came from: the quantize run's record, and the record of
    KV-cache scales `calibrate-kv` added later, when the manifest has them."""
    out = []
    m = src.manifest
    first = m.quantize_calibration
    if first is not None and m.method is not None:  # a data-aware method chose the values; no static scales
        out.append(
            f"- Integer weight values chosen by {c.text(m.method.name, M, 'method.name')} on "
            f"{c.num(f'{first.tokens:,}', M, 'calibration.tokens')} tokens of "
            f"{c.text(first.text, M, 'calibration.text')} "
            f"(dampening {c.num(str(m.method.dampening), M, 'method.dampening')})."
        )
        first = None
    for field, record, what in (
        ("calibration", first, "Static scales measured by `weightsmith calibrate`"),
        ("kv_calibration", m.kv_calibration, "KV-cache scales measured by `weightsmith calibrate-kv`"),
    ):
        if record is None:
            continue
        out.append(
            f"- {what} on {c.num(f'{record.tokens:,}', M, f'{field}.tokens')} "
            f"tokens ({c.num(str(record.sequences), M, f'{field}.sequences')} sequences of "
            f"{c.num(str(record.seq_len), M, f'{field}.seq_len')}) of {c.text(record.text, M, f'{field}.text')}, "
            f"activations {c.text(record.activations, M, f'{field}.activations')}."
        )
    return out


def _preflight(src: CardSources, c: Citations) -> list[str]:
    """The vLLM versions `weightsmith preflight` checked this checkpoint against, and what each found."""
    parts = []
    for i, run in enumerate(src.preflight or []):
        version = c.text(run["vllm"], PREFLIGHT_FILE, f"runs[{i}].vllm")
        found = [
            f"{c.num(str(n), PREFLIGHT_FILE, f'runs[{i}].counts[{impact}]')} {markdown_text(impact)}"
            for impact, n in run["counts"].items()
            if n and impact != NOTE
        ]
        parts.append(f"vLLM {version}: " + (", ".join(found) if found else "nothing that would fail or degrade"))
    if not parts:
        return []
    return [f"- Checked before serving with `weightsmith preflight` (vLLM's own source, no GPU): {'; '.join(parts)}."]
