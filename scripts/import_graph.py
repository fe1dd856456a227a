"""The import graph between weightsmith's packages, read from the source (`python scripts/import_graph.py`).

Every `import` counts, also one inside a function or under `TYPE_CHECKING`: a lazy import is still a
dependency a reader must know about. A node is a subpackage of `weightsmith`; the command modules (each
package's `cli.py`, the top-level `cli.py` and `__main__.py`) are one node, `commands`, and the library
entry points (`api.py`, `__init__.py`) another, `api`: they sit on top and may import anything.
tests/test_layout.py holds the graph to no cycles; docs/architecture.md shows it in layers.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "weightsmith"
COMMANDS, API = "commands", "api"


def node_of(module: str, src: Path = SRC) -> str:
    """The node a dotted module name (`weightsmith.quantization.plan`) belongs to."""
    parts = module.split(".")
    if parts[-1] in ("cli", "__main__"):
        return COMMANDS
    if len(parts) > 1 and (src / parts[1]).is_dir():
        return parts[1]
    return API


def _module_name(path: Path, src: Path) -> str:
    name = ".".join(("weightsmith", *path.relative_to(src).with_suffix("").parts))
    return name.removesuffix(".__init__")


def imports(src: Path = SRC) -> dict[tuple[str, str], list[str]]:
    """(from node, to node) -> the import lines that make the edge, as `file:line -> module`."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(src.rglob("*.py")):
        here = node_of(_module_name(path, src), src)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                base = node.module
                targets = [f"{base}.{a.name}" for a in node.names] if base == "weightsmith" else [base]
            else:
                continue
            for target in targets:
                if target.split(".")[0] != "weightsmith":
                    continue
                there = node_of(target, src)
                if there != here:
                    edges[here, there].append(f"{path.relative_to(src)}:{node.lineno} -> {target}")
    return dict(edges)


def graph(src: Path = SRC) -> dict[str, set[str]]:
    """Each node and the nodes it imports."""
    out: dict[str, set[str]] = {node_of(_module_name(p, src), src): set() for p in src.rglob("*.py")}
    for here, there in imports(src):
        out[here].add(there)
    return out


def layers(deps: dict[str, set[str]]) -> list[list[str]]:
    """The nodes bottom-up: each layer imports only from layers below it. Raises CycleError on a cycle."""
    sorter = TopologicalSorter(deps)
    sorter.prepare()
    out = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        out.append(ready)
        sorter.done(*ready)
    return out


def main() -> int:
    deps = graph()
    try:
        for i, layer in enumerate(layers(deps)):
            print(f"{i:2}  " + "   ".join(f"{n} -> {', '.join(sorted(deps[n])) or '(nothing)'}" for n in layer))
    except CycleError as exc:
        print(f"cycle: {' -> '.join(exc.args[1])}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
