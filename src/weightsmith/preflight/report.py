"""What preflight reports: findings by what the user would see, and the checkpoints they concern.

Impacts: it will not load, it will load but serve wrong numbers, it will be slower than it could,
it could not be checked (a fact a check needs was not found in vLLM's source), or a note. They map
onto the project's severities (`audit.findings`): the first two are errors, the next two warnings, a
note an info; an error or a warning makes the command exit 1, so a vLLM preflight could not read
never passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightsmith.audit.findings import ERROR, INFO, WARNING, Finding, Severity
from weightsmith.audit.modules import Module, group_modules
from weightsmith.audit.survey import Survey, survey
from weightsmith.core.errors import WeightsmithError
from weightsmith.formats.declaration import MODELOPT, QuantDeclaration, read_declaration
from weightsmith.preflight.code import Evidence

LOAD, WRONG, SLOW, NOTE = "will not load", "serves wrong numbers", "slower than it could", "note"
UNCHECKED = "could not check"
#: The project's severity for each impact: what fails or silently degrades is an error or a warning,
#: and so is what could not be checked: a pass must mean the facts behind it were read.
SEVERITY: dict[str, Severity] = {LOAD: ERROR, WRONG: ERROR, SLOW: WARNING, UNCHECKED: WARNING, NOTE: INFO}
IMPACTS = tuple(SEVERITY)
#: What to do about a fact that was not found: preflight reads the layouts of released vLLMs.
UNREAD_FIX = "point --vllm at the vLLM you will serve with, as released: its wheel, or the site-packages it is in"
#: `--json` output identifies itself, so the card can tell a preflight report from any other JSON.
SCHEMA, SCHEMA_VERSION = "weightsmith.preflight", 1


@dataclass(frozen=True)
class Item:
    """One preflight finding: what happens, why (vLLM's own lines), and what to do."""

    check: str
    impact: str
    message: str
    fix: str | None = None
    evidence: tuple[Evidence, ...] = ()
    #: The checkpoint file (relative to its folder, prefixed by the folder's role) it concerns.
    file: str | None = None
    tensor: str | None = None

    @property
    def severity(self) -> Severity:
        return SEVERITY[self.impact]

    def line(self) -> str:
        """`file: tensor 'name': message`, spelled as every finding of the project is (`Finding.line`)."""
        return Finding(self.check, self.severity, self.message, self.file, self.tensor).line()

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "impact": self.impact,
            "severity": self.severity,
            "message": self.message,
            "fix": self.fix,
            "file": self.file,
            "tensor": self.tensor,
            "evidence": [e.as_dict() for e in self.evidence],
        }


def unread(check: str, what: str, why: str, file: str | None = None, tensor: str | None = None) -> Item:
    """`check` could not decide `what`, because a fact it needs was not found in vLLM's source (`why`:
    `vllm/.../x.py not found`, `Y not found in vllm/.../x.py`): a finding that fails the run, never a
    silent pass."""
    return Item(check, UNCHECKED, f"could not check {what}: {why}", UNREAD_FIX, file=file, tensor=tensor)


@dataclass
class Preflight:
    """The whole answer: which vLLM, which pair, the findings and the command to serve it."""

    vllm: str
    vllm_version: str
    target: str
    draft: str | None
    method: str | None
    items: list[Item] = field(default_factory=list)
    serve: str = ""
    #: The platform the vLLM build is for (`VllmSource.platform`): "cpu", "cuda", ... or "unknown".
    vllm_platform: str = "unknown"

    @property
    def failed(self) -> bool:
        """Something would fail or silently degrade."""
        return any(i.severity in (ERROR, WARNING) for i in self.items)

    def as_dict(self) -> dict[str, Any]:
        counts = {impact: sum(i.impact == impact for i in self.items) for impact in IMPACTS}
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "vllm": {"path": self.vllm, "version": self.vllm_version, "platform": self.vllm_platform},
            "target": self.target,
            "draft": self.draft,
            "method": self.method,
            "passed": not self.failed,
            "counts": counts,
            "findings": [i.as_dict() for i in sorted(self.items, key=lambda i: IMPACTS.index(i.impact))],
            "serve": self.serve,
        }


@dataclass
class Side:
    """One checkpoint of the pair as preflight needs it."""

    role: str
    found: Survey
    decl: QuantDeclaration | None
    modules: dict[str, Module]

    @property
    def config(self) -> dict[str, Any]:
        config = self.found.config
        return config if isinstance(config, dict) else {}

    def get(self, key: str) -> Any:
        """A config value, also looked for in `text_config` (multimodal targets keep the LM there)."""
        if key in self.config:
            return self.config[key]
        text = self.config.get("text_config")
        return text.get(key) if isinstance(text, dict) else None

    @property
    def architectures(self) -> list[str]:
        """The names config.json lists under `architectures` (none when it lists none)."""
        listed = self.config.get("architectures")
        return [a for a in listed if isinstance(a, str)] if isinstance(listed, list) else []

    def where(self, file: str | None) -> str | None:
        return f"{self.role}/{file}" if file else self.role

    def module_file(self, module: Module) -> str | None:
        """The shard that holds `module` (its first parameter's), as `where` names it."""
        return self.where(next(iter(module.params.values())).shard)

    @property
    def depth(self) -> int | None:
        layers = self.get("num_hidden_layers")
        if isinstance(layers, int) and not isinstance(layers, bool):
            return layers
        seen = [m.layer for m in self.modules.values() if m.layer is not None]
        return max(seen) + 1 if seen else None

    @property
    def quant_method(self) -> str | None:
        """The `quant_method` vLLM looks its config class up by (`modelopt_fp4` for ModelOpt NVFP4)."""
        if self.decl is None:
            return None
        if self.decl.method == MODELOPT:
            algo = " ".join(s.format or "" for s in self.decl.schemes)
            return "modelopt_fp4" if "FP4" in algo.upper() else "modelopt"
        return self.decl.method


def open_side(path: Path, role: str) -> Side:
    found = survey(path)
    if found.single_file:
        raise WeightsmithError(
            "is one shard; preflight needs the checkpoint folder (its config.json names the architecture)",
            file=path,
            code="file.missing",
        )
    found.refuse_hostile_index()
    return Side(role, found, read_declaration(found.config, found.hf_quant_config), group_modules(found.headers))
