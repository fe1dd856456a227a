"""The packages import one way: no cycle between them, and the edges the architecture rules out stay out."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
assert _spec is not None and _spec.loader is not None
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)


def _edges_from(here: str) -> dict[str, list[str]]:
    return {there: lines for (a, there), lines in import_graph.imports().items() if a == here}


def test_no_cycle_between_packages() -> None:
    deps = import_graph.graph()
    layers = import_graph.layers(deps)  # raises CycleError naming the cycle
    assert "core" in layers[0] and layers[-1] == ["commands"]


def test_ruled_out_edges_stay_out() -> None:
    """The engine is the layer-streaming runtime (no eval, no quantize flow); formats and schemes know no
    flow; a scale search is a kernel and its words, below the schemes that use it; the quantize plan reads
    declarations from formats, not audit; io is below everything but core."""
    ruled_out = {
        "engine": {"fidelity", "quantization", "calibration", "audit"},
        "formats": {"schemes", "searches", "engine", "fidelity", "audit", "quantization", "calibration"},
        "quant": {"formats", "schemes", "searches", "io"},
        "io": {"formats", "schemes", "searches", "quant", "engine", "quantization", "calibration", "fidelity", "audit"},
        "fidelity": {"quantization", "calibration"},
        "searches": {"schemes", "formats", "io", "quantization"},
    }
    for here, banned in ruled_out.items():
        found = {there: lines for there, lines in _edges_from(here).items() if there in banned}
        assert not found, f"{here} imports {found}"
    plan_imports = [
        line
        for lines in _edges_from("quantization").values()
        for line in lines
        if line.startswith("quantization/plan.py")
    ]
    assert not [line for line in plan_imports if ".audit" in line]


def test_the_graph_sees_a_planted_cycle(tmp_path: Path) -> None:
    """The checker is not blind: two packages importing each other is found, lazily or not."""
    for name, other in (("alpha", "beta"), ("beta", "alpha")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
        (tmp_path / name / "m.py").write_text(f"def f():\n    from weightsmith.{other} import m\n")
    deps = import_graph.graph(tmp_path)
    assert deps == {"alpha": {"beta"}, "beta": {"alpha"}}
    try:
        import_graph.layers(deps)
    except import_graph.CycleError:
        return
    raise AssertionError("no cycle found")
