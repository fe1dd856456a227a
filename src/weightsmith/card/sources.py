"""What a card is written from, gathered into the checkpoint folder so the card can be checked later.

Writing a card runs `inspect` and `verify` on the checkpoint and keeps their results as
`inspect.json` and `verify.json`, and writes the `eval` and `bench` JSON given into the folder as
`eval.json` and `bench.json` (with local paths made portable, `bench/paths.py`, since they are
published with the card). The card cites those names, so `card --check` works on the folder alone:
it re-runs `inspect` and `verify` when the safetensors are there, and otherwise reads the kept results.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightsmith.audit.coverage import QUANTIZED
from weightsmith.audit.inspect import inspect
from weightsmith.audit.verify import verify
from weightsmith.bench.analysis import Analysis, analyse
from weightsmith.bench.paths import file_name, is_local_absolute, make_portable
from weightsmith.bench.results import BenchResults, load_results, to_jsonable
from weightsmith.card import schema
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import MAX_JSON_BYTES, read_regular, replace_file
from weightsmith.fidelity.report import SCHEMA as EVAL_SCHEMA
from weightsmith.fidelity.report import SCHEMA_VERSION as EVAL_SCHEMA_VERSION
from weightsmith.io.checkpoint import CONFIG_FILE, read_json
from weightsmith.io.manifest import MANIFEST_FILE, Manifest, load_manifest
from weightsmith.io.serving import CARD_FILE
from weightsmith.preflight.report import SCHEMA as PREFLIGHT_SCHEMA

INSPECT_FILE = "inspect.json"
VERIFY_FILE = "verify.json"
EVAL_FILE = "eval.json"
BENCH_FILE = "bench.json"
PREFLIGHT_FILE = "preflight.json"


@dataclass
class CardSources:
    """Everything one card is rendered from: the manifest and bench results typed, the rest plain JSON values."""

    folder: Path
    manifest: Manifest
    config: dict[str, Any]
    inspect: dict[str, Any]
    verify: dict[str, Any]
    eval: dict[str, Any] | None = None
    bench: BenchResults | None = None
    analysis: Analysis | None = None
    #: `weightsmith preflight` runs: which vLLM versions the checkpoint was checked against, and what they found.
    preflight: list[dict[str, Any]] | None = None
    #: One line per source saying whether it was measured now or read from a kept file.
    provenance: list[str] = field(default_factory=list)


def has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors"))


def _eval_checked(path: Path) -> dict[str, Any]:
    data = read_json(path)
    if data.get("schema") != EVAL_SCHEMA or data.get("schema_version") != EVAL_SCHEMA_VERSION:
        raise WeightsmithError(
            f"is not `weightsmith eval --json` output ({EVAL_SCHEMA} v{EVAL_SCHEMA_VERSION})", file=path
        )
    schema.check_eval(data, path)
    return data


def _read_checked(path: Path, spec: dict[str, Any]) -> dict[str, Any]:
    data = read_json(path)
    schema.check(data, spec, path)
    return data


def _measure(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    inspected = dataclasses.asdict(inspect(folder))
    verified = dataclasses.asdict(verify(folder))
    for report in (inspected, verified):
        report["path"] = "."  # the card travels with its folder; an absolute path would not
    verified["summary"] = verified["summary"].replace(str(folder), ".")
    return inspected, verified


def _write(path: Path, data: dict[str, Any]) -> None:
    _replace_recorded(path, (json.dumps(data, indent=2) + "\n").encode())


#: Inside a card's folder: `{"device", "inode", "files": {name: sha256}}`, what `card` wrote there.
CARD_RECORD = ".weightsmith-card.json"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def card_record(folder: Path) -> dict[str, str]:
    """The files `card` wrote into `folder` and their digests, from a record naming this very folder
    (a copied record names another); empty without one."""
    try:
        st = os.lstat(folder)
        if not stat.S_ISREG(os.lstat(folder / CARD_RECORD).st_mode):
            return {}
        data = json.loads(read_regular(folder / CARD_RECORD, MAX_JSON_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or (data.get("device"), data.get("inode")) != (st.st_dev, st.st_ino):
        return {}
    files = data.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return {}
    return files


def written_by_card(path: Path) -> bool:
    """Whether the file at `path` is, byte for byte, one `card` wrote there (its record says so)."""
    recorded = card_record(path.parent).get(path.name)
    try:
        return (
            recorded is not None
            and stat.S_ISREG(os.lstat(path).st_mode)
            and (_digest(read_regular(path, MAX_JSON_BYTES)) == recorded)
        )
    except OSError:
        return False


def _replace_recorded(path: Path, data: bytes) -> None:
    """Record `data` as the card's `path` first (a crash in between leaves a record that does not match,
    so proves nothing), then write it whole."""
    files = {**card_record(path.parent), path.name: _digest(data)}
    st = os.stat(path.parent)
    record = {"device": st.st_dev, "inode": st.st_ino, "files": files}
    replace_file(path.parent / CARD_RECORD, (json.dumps(record, indent=1) + "\n").encode())
    replace_file(path, data)


def cited_files(eval_given: bool, bench_given: bool, preflight_given: bool) -> list[str]:
    """The files `keep` writes beside the card, README.md aside."""
    given = ((EVAL_FILE, eval_given), (BENCH_FILE, bench_given), (PREFLIGHT_FILE, preflight_given))
    return [INSPECT_FILE, VERIFY_FILE] + [name for name, yes in given if yes]


def _load_common(folder: Path) -> tuple[Manifest, dict[str, Any]]:
    if not folder.is_dir():
        raise WeightsmithError("is not a folder", file=folder)
    if not (folder / MANIFEST_FILE).exists():
        raise WeightsmithError(
            f"has no {MANIFEST_FILE}; a card is written for `weightsmith quantize` output", file=folder
        )
    return load_manifest(folder / MANIFEST_FILE), _read_checked(folder / CONFIG_FILE, schema.CONFIG)


def disagreements(src: CardSources) -> list[str]:
    """Where two sources state the same fact differently, each as `FILE: what`: a card citing both
    would contradict itself, so `card` refuses to write it and `card --check` reports it.

    The count of quantized weights is stated by the manifest (the run's plan, in total and per
    recipe rule) and by inspect (the modules stored quantized now); an edit to one shows here.
    """
    m = src.manifest
    found = []
    rules = m.recipe.rules or []
    if rules and sum(r.quantized for r in rules) != m.tensors.quantize:
        found.append(
            f"{MANIFEST_FILE}: tensors.quantize is {m.tensors.quantize:,}, but its recipe rules quantized "
            f"{sum(r.quantized for r in rules):,} (recipe.rules[].quantized)"
        )
    statuses = (src.inspect.get("quantization") or {}).get("statuses")
    stored = sum(s["modules"] for s in statuses or [] if s["status"] == QUANTIZED)
    if statuses is not None and stored != m.tensors.quantize:
        found.append(
            f"{MANIFEST_FILE}: tensors.quantize is {m.tensors.quantize:,}, but {INSPECT_FILE} counts {stored:,} "
            "modules stored quantized (quantization.statuses)"
        )
    return found


def _bench(path: Path | None) -> tuple[BenchResults | None, Analysis | None]:
    if path is None:
        return None, None
    # a results file of schema version 1 holds the run's own paths; the card shows none of them
    results = make_portable(load_results(path), None, None)
    return results, analyse(results)


def _preflight_runs(paths: Sequence[Path]) -> list[dict[str, Any]] | None:
    """What the card keeps of each `weightsmith preflight --json` report: version, method, verdict, counts.

    The report's paths (the user's folders, the wheel) stay out: the kept copy is published.
    """
    runs = []
    for path in paths:
        data = _read_checked(path, schema.PREFLIGHT)
        if data["schema"] != PREFLIGHT_SCHEMA:
            raise WeightsmithError(f"is not `weightsmith preflight --json` output ({PREFLIGHT_SCHEMA})", file=path)
        runs.append({k: data[k] for k in ("method", "passed", "counts")} | {"vllm": data["vllm"]["version"]})
    return runs or None


def gather(
    folder: Path, eval_path: Path | None, bench_path: Path | None, preflight_paths: Sequence[Path] = ()
) -> CardSources:
    """Read every input and measure the checkpoint now (for writing a card); nothing is written yet."""
    manifest, config = _load_common(folder)
    if not has_weights(folder):
        raise WeightsmithError("has no .safetensors files to inspect and verify", file=folder)
    evaluated = _eval_checked(eval_path) if eval_path is not None else None
    bench, analysis = _bench(bench_path)
    preflight = _preflight_runs(preflight_paths)
    inspected, verified = _measure(folder)
    src = CardSources(folder, manifest, config, inspected, verified, evaluated, bench, analysis, preflight)
    problems = disagreements(src)
    if problems:
        raise WeightsmithError(f"{problems[0]}; nothing written", file=folder, code="card.disagree")
    return src


def keep(src: CardSources, card: str) -> None:
    """Write what the card cites into its folder, then the card: only once everything was read and rendered.

    The eval and bench records are written with their local paths made portable, as the card is:
    they are published beside it.
    """
    _write(src.folder / INSPECT_FILE, src.inspect)
    _write(src.folder / VERIFY_FILE, src.verify)
    if src.eval is not None:
        paths = {k: file_name(v) for k in ("orig", "quant") if isinstance(v := src.eval.get(k), str) and
                 is_local_absolute(v)}  # fmt: skip
        _write(src.folder / EVAL_FILE, {**src.eval, **paths})
    if src.bench is not None:
        _write(src.folder / BENCH_FILE, {**to_jsonable(src.bench), "analysis": to_jsonable(src.analysis)})
    if src.preflight is not None:
        _write(src.folder / PREFLIGHT_FILE, {"runs": src.preflight})
    _replace_recorded(src.folder / CARD_FILE, card.encode("utf-8"))


def reload(folder: Path) -> CardSources:
    """Re-derive every source from `folder` (for checking a card); says which were measured again."""
    manifest, config = _load_common(folder)
    provenance = [f"{MANIFEST_FILE}, {CONFIG_FILE}: read"]
    if has_weights(folder):
        inspected, verified = _measure(folder)
        provenance.append(f"{INSPECT_FILE}, {VERIFY_FILE}: re-derived by running inspect and verify on the safetensors")
    else:
        inspected = _read_checked(folder / INSPECT_FILE, schema.INSPECT)
        verified = _read_checked(folder / VERIFY_FILE, schema.VERIFY)
        provenance.append(f"{INSPECT_FILE}, {VERIFY_FILE}: read (no safetensors here to re-run inspect and verify)")
    evaluated = None
    if (folder / EVAL_FILE).exists():
        evaluated = _eval_checked(folder / EVAL_FILE)
        provenance.append(f"{EVAL_FILE}: read")
    bench, analysis = _bench(folder / BENCH_FILE if (folder / BENCH_FILE).exists() else None)
    if bench is not None:
        provenance.append(f"{BENCH_FILE}: read, analysis recomputed from the raw samples")
    preflight = None
    if (folder / PREFLIGHT_FILE).exists():
        preflight = _read_checked(folder / PREFLIGHT_FILE, schema.PREFLIGHT_KEPT)["runs"]
        provenance.append(f"{PREFLIGHT_FILE}: read")
    return CardSources(folder, manifest, config, inspected, verified, evaluated, bench, analysis, preflight, provenance)
