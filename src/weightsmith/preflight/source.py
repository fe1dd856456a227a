"""vLLM's own source files, read in place from a wheel or an installation, never imported.

Importing vLLM needs its GPU stack; reading its `.py` files does not. A wheel is a zip file whose
members are the package's files, so both forms answer the same question: the text of
`vllm/<path>`, or None when this installation has no such file.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from weightsmith.errors import WeightsmithError

_VERSION = re.compile(r"^Version:\s*(\S+)", re.MULTILINE)


class VllmSourceError(WeightsmithError):
    """The vLLM installation named (or the default one) cannot be read."""


@dataclass
class VllmSource:
    """One vLLM installation: a wheel file or a folder holding the `vllm` package."""

    where: Path
    _zip: zipfile.ZipFile | None = field(default=None, repr=False)
    _texts: dict[str, str | None] = field(default_factory=dict, repr=False)
    _trees: dict[str, tuple[ast.Module, list[str]] | None] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, path: Path | None) -> VllmSource:
        """The installation at PATH (a wheel, a site-packages folder or the `vllm` folder itself), or
        the `vllm` package importable here, found without importing it."""
        if path is None:
            spec = importlib.util.find_spec("vllm")
            if spec is None or not spec.submodule_search_locations:
                raise VllmSourceError(
                    "no vllm package is installed here; name one with --vllm (a wheel or a site-packages folder)",
                    code="vllm.missing",
                )
            return cls(Path(next(iter(spec.submodule_search_locations))).parent)
        if path.is_file():
            try:
                archive = zipfile.ZipFile(path)
            except (zipfile.BadZipFile, OSError) as exc:
                raise VllmSourceError(f"is not a wheel (a zip file): {exc}", file=path, code="vllm.unreadable") from exc
            if "vllm/__init__.py" not in archive.namelist():
                raise VllmSourceError("is not a vllm wheel: it has no vllm/__init__.py", file=path, code="vllm.missing")
            return cls(path, archive)
        root = path.parent if path.name == "vllm" and (path / "__init__.py").is_file() else path
        if not (root / "vllm" / "__init__.py").is_file():
            raise VllmSourceError(
                "holds no vllm package (expected a wheel, a site-packages folder or the vllm folder)",
                file=path,
                code="vllm.missing",
            )
        return cls(root)

    def text(self, rel: str) -> str | None:
        """The text of `rel` (a path starting `vllm/`), or None when this installation lacks it."""
        if rel not in self._texts:
            self._texts[rel] = self._read(rel)
        return self._texts[rel]

    def parsed(self, rel: str) -> tuple[ast.Module, list[str]] | None:
        """`rel` parsed by `ast`, with its lines; None when it is missing or does not parse.

        Parsed once: the checks of one run read the same model and quantization files several times.
        """
        if rel not in self._trees:
            text = self.text(rel)
            try:
                self._trees[rel] = None if text is None else (ast.parse(text), text.splitlines())
            except SyntaxError:
                self._trees[rel] = None
        return self._trees[rel]

    def _read(self, rel: str) -> str | None:
        parts = rel.split("/")
        if parts[0] != "vllm" or ".." in parts or "" in parts:
            return None  # a name taken from vLLM's own tables never leads out of the package
        try:
            if self._zip is not None:
                return self._zip.read(rel).decode("utf-8", errors="replace")
            return (self.where / rel).read_text(encoding="utf-8", errors="replace")
        except (KeyError, OSError):
            return None

    def files(self, folder: str) -> list[str]:
        """The `.py` files under `folder` (a path starting `vllm/`), sorted."""
        prefix = folder.rstrip("/") + "/"
        if self._zip is not None:
            return sorted(n for n in self._zip.namelist() if n.startswith(prefix) and n.endswith(".py"))
        base = self.where / folder
        return sorted(str(p.relative_to(self.where)) for p in base.rglob("*.py")) if base.is_dir() else []

    @property
    def version(self) -> str:
        """The version its metadata (or `vllm/version.py`) records, or "unknown"."""
        return _version(self)


def _version(src: VllmSource) -> str:
    if src._zip is not None:
        metas = [n for n in src._zip.namelist() if n.endswith(".dist-info/METADATA") and n.startswith("vllm-")]
        texts = [src._zip.read(m).decode("utf-8", errors="replace") for m in metas]
    else:
        texts = [p.read_text(errors="replace") for p in src.where.glob("vllm-*.dist-info/METADATA")]
    for text in texts:
        match = _VERSION.search(text)
        if match:
            return match.group(1)
    version_py = src.text("vllm/_version.py") or src.text("vllm/version.py") or ""
    match = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", version_py)
    return match.group(1) if match else "unknown"
