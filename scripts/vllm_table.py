"""docs/vllm.md: every checkpoint weightsmith writes, served by vLLM's CPU build, checked token for token.

For each row: `weightsmith quantize` SmolLM2-135M (or calibrate-kv / transplant a quantized one), start
vLLM CPU on it as a user would (`tests/vllm_cpu.py`), record what vLLM chose (its log's
`Using/Selected <kernel> for <scheme>` lines) or its error line, score greedy completions of three
prompts against the reference that computes what vLLM should (`tests/vllm_reference.py`), and time
prefill and decode. Results go to docs/vllm.json (rows already there are kept unless --redo) and the
table to docs/vllm.md.

    make vllm-table            # or: .venv/bin/python scripts/vllm_table.py [--only w4a16 ...] [--redo]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("TQDM_DISABLE", "1")

import vllm_cpu  # noqa: E402
from models import smollm2_fp32  # noqa: E402
from vllm_reference import Reference  # noqa: E402
from weightsmith.bench.servers import ServerError  # noqa: E402
from weightsmith.fidelity.logits import load_tokenizer  # noqa: E402

RESULTS = REPO / "docs" / "vllm.json"
TABLE = REPO / "docs" / "vllm.md"
WS = [sys.executable, "-m", "weightsmith"]
PROMPTS = (
    "def fibonacci(n):",
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
)
SCORED_TOKENS = 24
DECODE_TOKENS = 32
PREFILL_TOKENS = 512
MIXED_RECIPE = """\
[[rule]]
targets = ["category:attention"]
scheme = "fp8-dynamic"

[[rule]]
targets = ["category:dense mlp"]
scheme = "w4a16"
group_size = 64
"""
G64 = ["--group-size", "64"]  # SmolLM2's 576 columns: group 128 would leave every 576-wide Linear in BF16
#: The weights as the source stores them (int4's default pre-pass would balance them first).
PLAIN = ["--pre-pass", "none"]

#: name -> (how it is made, extra vLLM flags)
ROWS: dict[str, tuple[list[str], list[str]]] = {
    "bf16 (original)": ([], []),
    "w4a16": (["--scheme", "w4a16", *G64, *PLAIN], []),
    "w4a16-asym": (["--scheme", "w4a16-asym", *G64, *PLAIN], []),
    "w8a16": (["--scheme", "w8a16", *G64], []),
    "w4a16-asym + --scale-search hqq": (["--scheme", "w4a16-asym", *G64, "--scale-search", "hqq", *PLAIN], []),
    "w4a16 + --scale-search qkx2": (["--scheme", "w4a16", *G64, "--scale-search", "qkx2", *PLAIN], []),
    "w4a16 + --pre-pass sinq": (["--scheme", "w4a16", *G64, "--pre-pass", "sinq"], []),
    "w4a16-asym + --pre-pass sinq": (["--scheme", "w4a16-asym", *G64, "--pre-pass", "sinq"], []),
    "w4a16 gptq": (["--scheme", "w4a16", *G64, "--method", "gptq", "--tokens", "512"], []),
    "fp8-dynamic": (["--scheme", "fp8-dynamic"], []),
    "fp8 (static)": (["--scheme", "fp8", "@calibration"], []),
    "fp8-block": (["--scheme", "fp8-block"], []),
    "w8a8": (["--scheme", "w8a8"], []),
    "w4afp8": (["--scheme", "w4afp8", *G64], []),
    "mxfp4a16": (["--scheme", "mxfp4a16"], []),
    "mxfp4": (["--scheme", "mxfp4"], []),
    "mxfp8a16": (["--scheme", "mxfp8a16"], []),
    "mxfp8": (["--scheme", "mxfp8"], []),
    "nvfp4a16": (["--scheme", "nvfp4a16"], []),
    "nvfp4": (["--scheme", "nvfp4", "@calibration"], []),
    "mixed recipe (attention fp8-dynamic, dense mlp w4a16)": (["@recipe"], []),
    "fp8 + --kv-cache fp8": (["--scheme", "fp8", "@calibration", "--kv-cache", "fp8"], ["--kv-cache-dtype", "fp8"]),
    "fp8-dynamic + calibrate-kv": (["--scheme", "fp8-dynamic", "@calibrate-kv"], ["--kv-cache-dtype", "fp8"]),
    "fp8-dynamic + transplanted KV scales": (["--scheme", "fp8-dynamic", "@transplant"], ["--kv-cache-dtype", "fp8"]),
}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else the machine type."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def run(cmd: list[str], **kw: Any) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, **kw)


def build(name: str, how: list[str], src: Path, work: Path) -> Path:
    """The checkpoint of row `name`, made by weightsmith's own commands."""
    if not how:
        return src
    stats = work / "stats.npz"
    if ("@calibration" in how or "@calibrate-kv" in how) and not stats.exists():
        run([*WS, "calibrate", str(src), "--out", str(stats), "--tokens", "512"])
    args: list[str] = []
    for a in how:
        if a == "@calibration":
            args += ["--calibration", str(stats)]
        elif a == "@recipe":
            (work / "mixed.toml").write_text(MIXED_RECIPE)
            args += ["--recipe", str(work / "mixed.toml")]
        elif a not in ("@calibrate-kv", "@transplant"):
            args.append(a)
    out = work / f"row{len(list(work.glob('row*')))}"
    run([*WS, "quantize", str(src), str(out), *args])
    if "@calibrate-kv" in how:
        run([*WS, "calibrate-kv", str(out), "--from", str(src), "--tokens", "512"])
    if "@transplant" in how:
        donor = work / "kv-donor"
        if not donor.exists():
            run([*WS, "quantize", str(src), str(donor), "--scheme", "fp8", "--calibration", str(stats),
                 "--kv-cache", "fp8"])  # fmt: skip
        run([*WS, "transplant", str(donor), str(out), "--select", r"re:.*self_attn\.[kv]_scale$"])
    return out


def _kv_lines(log: str) -> list[str]:
    keys = ("k_scale", "kv cache scaling", "KV cache scaling", "kv_cache_dtype=fp8", "fp8_e4m3")
    found = {line.split("] ", 1)[-1].strip()[:160] for line in log.splitlines() if any(k in line for k in keys)}
    return sorted(found)[:4]


def _declares_kv_cache(model: Path) -> bool:
    config = json.loads((model / "config.json").read_text())
    return bool((config.get("quantization_config") or {}).get("kv_cache_scheme"))


def measure(name: str, model: Path, extra: list[str], log_dir: Path) -> dict[str, Any]:
    """One row: what vLLM chose or its error, agreement with the reference, speed, peak RSS."""
    row: dict[str, Any] = {"name": name, "flags": extra}
    try:
        with vllm_cpu.serve(model, log_dir, extra) as s:
            row["startup_s"] = round(s.server.startup_s or 0.0, 1)
            row["choices"] = s.choices()
            tok = load_tokenizer(model)
            completions = [s.complete(tok(p)["input_ids"], SCORED_TOKENS) for p in PROMPTS]
            if _declares_kv_cache(model):
                # transformers builds k_scale/v_scale and leaves them unloaded ("missing keys"), then
                # quantizes its cache with them: no reference; compared with the same weights' row
                row["completions"] = [c.ids for c in completions]
                row["compare_to"] = "fp8-dynamic"
            else:
                ref = Reference(model)
                row["scores"] = [
                    {**ref.score(tok(p)["input_ids"], c.ids, c.logprobs).__dict__, "ids": c.ids, "logprobs": c.logprobs}
                    for p, c in zip(PROMPTS, completions, strict=True)
                ]
            rng = random.Random(0)
            one = s.complete([rng.randrange(1000, 40000) for _ in range(16)], 1)
            many = s.complete([rng.randrange(1000, 40000) for _ in range(16)], DECODE_TOKENS + 1)
            row["decode_tok_s"] = round(DECODE_TOKENS / max(many.wall_s - one.wall_s, 1e-6), 2)
            pre = s.complete([rng.randrange(1000, 40000) for _ in range(PREFILL_TOKENS)], 1)
            row["prefill_tok_s"] = round(PREFILL_TOKENS / pre.wall_s, 1)
            row["peak_rss_mib"] = round(s.peak_rss_mib())
            row["kv_lines"] = _kv_lines(s.log)
            row["served"] = True
    except (ServerError, OSError, KeyError) as exc:
        log = (log_dir / "server.log").read_text(errors="replace") if (log_dir / "server.log").exists() else ""
        row["served"] = False
        row["choices"] = vllm_cpu._CHOICE.findall(log)[:4]
        row["error"] = vllm_cpu.error_line(log) or str(exc).splitlines()[0]
    return row


def _leading_equal(got: list[int], want: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))


def table(measured: dict[str, Any]) -> str:
    rows = []
    for name in ROWS:
        r = measured.get(name)
        if r is None:
            continue
        kernel = "; ".join(f"`{k}` for `{s}`" for k, s in dict.fromkeys(map(tuple, r["choices"]))) or "-"
        if not r["served"]:
            rows.append(f"| {name} | **no**: `{r['error'][:200]}` | {kernel} | - | - | - | - | - |")
            continue
        if "compare_to" in r:
            base = [sc["ids"] for sc in measured[r["compare_to"]]["scores"]]
            equal = " ".join(f"{_leading_equal(c, b)}/{len(b)}" for c, b in zip(r["completions"], base, strict=True))
            rows.append(
                f"| {name} | yes | {kernel} | not scored (transformers does not load KV scales); equal to "
                f"{r['compare_to']}'s tokens (BF16 cache): {equal} | - | {r['decode_tok_s']:.1f} "
                f"| {r['prefill_tok_s']:.0f} | {r['peak_rss_mib']:,} |"
            )
            continue
        agree = " ".join(f"{s['agree']}/{s['total']}" for s in r["scores"])
        gap = max(s["max_gap"] for s in r["scores"])
        margins = [s["margin_at_split"] for s in r["scores"] if s["margin_at_split"] is not None]
        ranks = [s.get("rank_at_split") for s in r["scores"] if s.get("rank_at_split") is not None]
        split = f" (parts at margin {max(margins):.3f}, rank {max(ranks)})" if margins and ranks else ""
        split = split or (f" (parts at margin {max(margins):.3f})" if margins else "")
        rows.append(
            f"| {name} | yes | {kernel} | {agree}{split} | {gap:.3f} | {r['decode_tok_s']:.1f} "
            f"| {r['prefill_tok_s']:.0f} | {r['peak_rss_mib']:,} |"
        )
    head = (
        "| checkpoint | loads and serves | vLLM's choice (its log) | greedy tokens equal to the reference "
        "(3 prompts) | max logprob gap (nats) | decode tok/s | prefill tok/s | peak RSS MiB |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    return head + "\n" + "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="rows to run (names as in the table; a prefix is enough)")
    ap.add_argument("--redo", action="store_true", help="measure rows already in docs/vllm.json again")
    ap.add_argument("--keep", type=Path, help="keep checkpoints and server logs here")
    ap.add_argument("--render", action="store_true", help="only write the tables from docs/vllm.json")
    args = ap.parse_args()
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": {}}
    if args.render:
        render(results)
        return
    src = smollm2_fp32()
    work = Path(args.keep or tempfile.mkdtemp(prefix="vllm-table-"))
    work.mkdir(parents=True, exist_ok=True)
    machine = {"isa": vllm_cpu.isa(), "cpu": cpu_model(), "cores": os.cpu_count()}
    results["vllm"] = vllm_cpu.VERSION
    measured = results["runs"].setdefault(machine["isa"], {"rows": {}})
    measured["machine"] = machine
    rows = measured["rows"]
    try:
        for name, (how, extra) in ROWS.items():
            if args.only and not any(name.startswith(o) for o in args.only):
                continue
            if name in rows and not args.redo:
                continue
            start = time.monotonic()
            print(f"{name}: ", end="", flush=True)
            model = build(name, how, src, work)
            row = measure(name, model, extra, work / f"logs-{len(rows)}-{int(start)}")
            row["isa"] = machine["isa"]
            rows[name] = row
            verdict = "served" if row["served"] else f"refused: {row['error'][:120]}"
            print(verdict, f"({time.monotonic() - start:.0f} s)")
            RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    render(results)


#: How each native library is named in the tables' headings, in the order they are shown.
LIBRARIES = {"avx512": "`_C` (AVX-512 with BF16)", "avx2": "`_C_AVX2` (no AVX-512)"}


def render(results: dict[str, Any]) -> None:
    """One table per instruction set measured, between the page's `<!-- table -->` and `<!-- /table -->`
    marks; the prose around them stays."""
    head, rest = TABLE.read_text().split("<!-- table -->", 1)
    tail = rest.split("<!-- /table -->", 1)[1] if "<!-- /table -->" in rest else "\n"
    order = list(LIBRARIES)
    parts = []
    for isa in sorted(results["runs"], key=lambda k: order.index(k) if k in order else len(order)):
        measured = results["runs"][isa]
        machine = measured.get("machine", {})
        parts.append(
            f"### vLLM CPU {results.get('vllm')} with {LIBRARIES.get(isa, isa)}: {machine.get('cpu')}, "
            f"{machine.get('cores')} cores\n\n{table(measured['rows'])}\n"
        )
    TABLE.write_text(f"{head}<!-- table -->\n" + "\n".join(parts) + f"<!-- /table -->{tail}")


if __name__ == "__main__":
    main()
