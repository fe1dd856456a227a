"""Which entry of an ordered target or ignore list claims a module: vLLM's rules, written once.

vLLM (`compressed_tensors/utils.py`: `find_matched_target`, `should_ignore_layer`) resolves a
layer it builds in three steps: the first target, in config order, that equals the layer's name
or `re.match`es it; else the first class target (`"Linear"`: vLLM tests whether the target is a
substring of the layer's class name, and every Linear class ends in `Linear`); else, for a fused
layer (`qkv_proj`), the target of its first shard, provided every shard matches one. A fused
layer is ignored when its own name is listed exactly, otherwise when its shards are (they must
agree). `config_groups` become one target -> group map in group order, so a target two groups
name keeps its first position and the later group's scheme.

compressed-tensors, which produced the checkpoint (`match_targets` in `utils/match.py`), ranks a
module's matching targets differently: exact names first, then regexes in alphabetical order of
their text, then class names, and it sees the shards, never the fused layer. `Groups.conflicts`
lists the modules where the two pick different groups: the weights were quantized with one scheme
and vLLM would load them with the other. (llm-compressor's `model_free_ptq` has a third order: the
first group with any target naming the module, `Linear` naming every one; the configs `quantize`
writes name each module in one group only, so all three agree on them.)

Every regex is compiled and matched by `Pattern`: a bad one is one line naming it, a slow
one is stopped at the time limit. ModelOpt's `exclude_modules` are fnmatch wildcards, matched
against the whole name.
"""

from __future__ import annotations

import fnmatch
import functools
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.lazy import lazy_module
from weightsmith.core.terminal import echo
from weightsmith.io import names

if TYPE_CHECKING:
    import regex
else:  # imported when a recipe has a regex: most runs match names only
    regex = lazy_module("regex")

REGEX = "re:"
#: The class target compressed-tensors and vLLM write for every Linear layer.
LINEAR = "Linear"
#: What `re.compile` raises for a pattern it cannot build, not only `re.error`.
REGEX_ERRORS = (re.error, OverflowError, RecursionError)
#: How long one match of a supplied pattern may run. Real patterns match a module name in
#: microseconds; one that backtracks catastrophically (`re:(a|aa)+$` against a long name) would
#: otherwise hang the command for hours.
MATCH_TIMEOUT_S = 1.0
#: How long all matches of supplied patterns may run in one run, together, beyond
#: `MATCH_ALLOWANCE_S` for each match: a pattern that takes just under the limit on each of 200
#: names would otherwise take minutes. A real pattern matches a name in 2-20 microseconds, so a
#: checkpoint of 500,000 tensors costs seconds and never comes near the budget.
MATCH_BUDGET_S = 10.0
MATCH_ALLOWANCE_S = 100e-6


class _Clock:
    """The matching time spent in this run beyond the allowance (one command; `reset_budget` starts the next)."""

    spent = 0.0


def reset_budget() -> None:
    """Start a new run: no matching time spent, and no pattern judged slow yet (`entry_regex` forgets)."""
    _Clock.spent = 0.0
    entry_regex.cache_clear()


def _bounded_match(compiled: regex.Pattern, name: str) -> regex.Match | None:
    """`compiled.match(name)`, stopped with TimeoutError at the per-name limit or when the run's budget is spent.

    Each match earns `MATCH_ALLOWANCE_S`, so the budget bounds what slow matches cost, however many
    names a checkpoint holds, and never what fast ones do."""
    left = MATCH_BUDGET_S - _Clock.spent
    if left <= 0:
        raise TimeoutError
    started = time.perf_counter()
    try:
        return compiled.match(name, timeout=min(MATCH_TIMEOUT_S, left))
    finally:
        _Clock.spent += time.perf_counter() - started - MATCH_ALLOWANCE_S


class Pattern:
    """A regular expression a user or a checkpoint supplied: Python's syntax, a bounded match.

    Validity is judged by Python's `re`, as vLLM judges it; matching runs on the `regex` library,
    which reads the same syntax and can stop a match at a time limit, which `re` cannot.
    """

    def __init__(self, text: str, what: str, file: str | Path | None = None) -> None:
        """`what` names the pattern in messages: where it was given, and as the user wrote it."""
        self.text, self.what, self.file = text, what, file
        #: Why this pattern was judged too slow, once it was: every later match is refused at once.
        self._slow: str | None = None
        try:
            re.compile(text)
            self._compiled = regex.compile(text)
        except (*REGEX_ERRORS, regex.error) as exc:
            raise WeightsmithError(
                f"{what} is not a valid regular expression ({exc})", file=file, code="usage"
            ) from None

    def match(self, name: str) -> bool:
        """Whether the pattern matches at the start of `name` (`re.match`), within the time limits.

        A pattern that runs out of time once is judged bad for the rest of the run: one line (or one
        finding), never the same wait again for each name.
        """
        if self._slow is None:
            per_name = MATCH_BUDGET_S - _Clock.spent >= MATCH_TIMEOUT_S  # the limit that can stop this match
            try:
                return _bounded_match(self._compiled, name) is not None
            except TimeoutError:
                if per_name:
                    self._slow = (
                        f"took over {MATCH_TIMEOUT_S:g} s to match one name ({len(name)} characters): "
                        "it backtracks catastrophically; simplify it"
                    )
                else:  # the combined alternation may have spent it: this one is where the run stopped
                    self._slow = (
                        f"was stopped: supplied patterns had spent {MATCH_BUDGET_S:g} s matching, beyond "
                        f"{MATCH_ALLOWANCE_S * 1000:g} ms a name (one backtracks catastrophically; simplify it)"
                    )
        raise WeightsmithError(f"{self.what} {self._slow}", file=self.file, code="usage")


@functools.lru_cache(maxsize=4096)
def entry_regex(entry: str, origin: str, file: str | Path | None = None) -> Pattern:
    """The pattern of a `re:` entry, or one line naming the entry and where it came from.

    Every `re:` pattern a user or a checkpoint supplies is compiled here, so a bad one (`re:([`,
    a repeat count too large, nesting too deep) is never a traceback and a slow one never a hang.
    `origin` says where it was given: `--ignore`, `--select`, `quantization_config targets`.
    """
    return Pattern(entry[len(REGEX) :], f"{origin} {echo(entry)}", file)


#: What a pattern may not hold to be tried inside one alternation with others: a backreference
#: (numbering shifts) or a global inline flag (it would apply to every alternative).
_UNCOMBINABLE = re.compile(r"\\[1-9]|\\g<|\(\?P=|\(\?[aiLmsux]+\)|wsmatch")
_GROUP = "wsmatch"


def fused_layer(module: str) -> str | None:
    """The fused layer vLLM builds from this shard (`qkv_proj` for `q_proj`), or None.

    Routed experts are not Linear layers in vLLM but one FusedMoE layer, resolved by their own
    names, so their gate/up pair is not fused here.
    """
    fused = names.fused_partners(module)
    if fused is None or names.expert_layer(module) is not None:
        return None
    return fused[0]


#: An exact name with an all-digit path component (`model.layers.3.mlp`): it tells layers apart.
_NUMBERED = re.compile(r"(?:^|\.)\d+(?:\.|$)")


def number_blind(entries: Iterable[str]) -> bool:
    """Whether these target or ignore entries answer alike for any two module names that differ only
    in their all-digit path components (`layers.3` and `layers.17`, `experts.0` and `experts.255`).

    True when no exact name has an all-digit component and every `re:` pattern is written from
    literals other than digits, `.*`, `*` after a literal or group, groups and `(?:...)`, `|`, `^`
    and `$`: such a pattern can match a run of digits only with `.*`, which matches any other run
    as well. Anything that might count or spell digits (a digit, `\\d` or any letter escape, `[...]`,
    `{m,n}`, `+`, `?`, a lone `.`, inline flags) leaves the answer to each name. The audit then
    resolves a 100k-module MoE once per name pattern instead of once per module.
    """
    for entry in entries:
        if entry.startswith(REGEX):
            if not _blind_regex(entry[len(REGEX) :]):
                return False
        elif _NUMBERED.search(entry):
            return False
    return True


def _blind_regex(text: str) -> bool:
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":  # an escaped punctuation mark is a literal; a letter or digit escape is a class or a reference
            if text[i + 1 : i + 2].isalnum() or i + 1 == len(text):
                return False
            i += 2
        elif c == ".":
            if text[i + 1 : i + 2] != "*":
                return False
            i += 2
        elif c == "(" and text[i + 1 : i + 2] == "?":
            if text[i + 2 : i + 3] != ":":
                return False
            i += 3
        elif c.isdigit() or c in "[]{}+?":
            return False
        else:
            i += 1
    return True


class Targets:
    """Ordered entries: exact module names, `re:` regexes, class names (`Linear`), or fnmatch wildcards.

    Compiled once; a thousand exact names cost one set lookup per module.
    """

    def __init__(
        self,
        entries: Iterable[str],
        origin: str,
        file: str | Path | None = None,
        *,
        wildcards: bool = False,
        strict: bool = True,
    ) -> None:
        """`origin` names the list in messages (`--ignore`, `config group 'W4A16' target`).

        `wildcards`: every entry is an fnmatch wildcard (ModelOpt). `strict=False` leaves out an
        entry that does not compile and lists it in `broken` instead of raising.
        """
        self.entries = tuple(entries)
        self.broken: list[str] = []
        self._exact: dict[str, int] = {}
        self._patterns: list[tuple[int, Pattern]] = []
        self._linear: int | None = None
        for i, entry in enumerate(self.entries):
            try:
                if wildcards:
                    self._patterns.append((i, Pattern(fnmatch.translate(entry), f"{origin} {echo(entry)}", file)))
                elif entry.startswith(REGEX):
                    self._patterns.append((i, entry_regex(entry, origin, file)))
                else:
                    self._exact.setdefault(entry, i)
                    if self._linear is None and entry.lower() == LINEAR.lower():
                        self._linear = i
            except WeightsmithError:
                if strict:
                    raise
                self.broken.append(entry)
        self._combined = _combine(self._patterns)
        #: The patterns in compressed-tensors' order (by their text), made when first asked.
        self._by_text: tuple[list[tuple[int, Pattern]], regex.Pattern | None] | None = None

    def __bool__(self) -> bool:
        return bool(self.entries)

    def first(self, *modules: str) -> str | None:
        """The earliest entry that equals or `re.match`es any of `modules` by name (vLLM's `_find_first_match`)."""
        best = len(self.entries)
        exact, patterns, combined = self._exact, self._patterns, self._combined  # once per module of a 100k MoE
        for module in modules:
            hit = exact.get(module)
            if hit is not None and hit < best:
                best = hit
            hit = _first_match(patterns, combined, module) if patterns else None
            if hit is not None and hit < best:
                best = hit
        return self.entries[best] if best < len(self.entries) else None

    def matches(self, *modules: str) -> bool:
        """Whether any entry claims any of `modules` by name."""
        return self.first(*modules) is not None

    def listed(self, module: str) -> bool:
        """Whether `module` is listed exactly."""
        return module in self._exact

    def linear(self, lm_head: bool = False) -> str | None:
        """The first class target that claims a Linear layer; vLLM's `ParallelLMHead` is not one."""
        return None if lm_head or self._linear is None else self.entries[self._linear]

    def resolve(self, module: str, lm_head: bool | None = None) -> str | None:
        """The target vLLM picks for the layer it builds from `module` (vLLM's `find_matched_target`).

        By name first (the fused layer's name for a shard), then by class, then, for a fused
        layer, through its shards. `lm_head` may be passed when the caller already knows.
        """
        fused = fused_layer(module)
        head = names.is_lm_head(module) if lm_head is None else lm_head
        found = self.first(fused or module) or self.linear(head)
        partners = names.fused_partners(module)  # never None where `fused` is not
        if found is None and fused is not None and partners is not None:
            shards = [self.first(s) for s in partners[1]]
            found = shards[0] if all(shards) else None
        return found

    def ignores(self, module: str) -> bool:
        """Whether vLLM skips the layer `module` belongs to (vLLM's `should_ignore_layer`).

        A fused layer is skipped when listed exactly; otherwise each shard by its own name (vLLM
        refuses a fused layer whose shards disagree, which the storage checks report).
        """
        fused = fused_layer(module)
        return (fused is not None and self.listed(fused)) or self.matches(module)

    def compressed_tensors_order(self, module: str, linear: bool = True) -> str | None:
        """The target compressed-tensors picks for `module` (`match_targets`): exact, regexes by text, class.

        `linear`: whether the module is an `nn.Linear` in transformers (lm_head is).
        """
        if module in self._exact:
            return module
        if self._by_text is None:
            by_text = sorted(self._patterns, key=lambda p: self.entries[p[0]])
            self._by_text = (by_text, _combine(by_text))
        hit = _first_match(*self._by_text, module)
        if hit is not None:
            return self.entries[hit]
        return LINEAR if linear and LINEAR in self._exact else None


def _combine(patterns: list[tuple[int, Pattern]]) -> regex.Pattern | None:
    """All patterns as one alternation, each alternative a group named after its entry's index.

    Matching a module against a hundred patterns one by one costs a hundred calls; this costs one,
    and an alternation takes its first alternative that matches, as trying them in order would.
    None when there are fewer than two, or when combining could change what one of them means.
    """
    if len(patterns) < 2 or any(_UNCOMBINABLE.search(p.text) for _, p in patterns):
        return None
    try:
        return regex.compile("|".join(f"(?P<{_GROUP}{i}>{p.text})" for i, p in patterns))
    except (regex.error, *REGEX_ERRORS):
        return None  # too large to compile as one: match them one by one


def _first_match(patterns: list[tuple[int, Pattern]], combined: regex.Pattern | None, module: str) -> int | None:
    """The entry index of the first of `patterns` (in their order) that matches `module`, or None.

    The combined alternation when there is one; each pattern in turn otherwise, or when the
    combined match runs out of time, so that the line names the pattern that is slow.
    """
    if combined is not None:
        try:
            hit = _bounded_match(combined, module)
        except TimeoutError:
            pass
        else:
            return None if hit is None else int(hit.lastgroup[len(_GROUP) :])
    return next((i for i, p in patterns if p.match(module)), None)


class Groups:
    """The `config_groups` of a quantization config as vLLM reads them: one target -> group map, in order."""

    def __init__(
        self, groups: Mapping[str, Iterable[str]], file: str | Path | None = None, *, strict: bool = True
    ) -> None:
        """A bad regex raises a line naming its group, or with `strict=False` is left out and listed in `broken`."""
        self.group_of: dict[str, str] = {}
        self._broken: list[str] = []
        for group, targets in groups.items():
            for target in targets:
                if target.startswith(REGEX):
                    try:
                        entry_regex(target, f"config group {group!r} target", file)
                    except WeightsmithError:
                        if strict:
                            raise
                        self._broken.append(target)
                        continue
                self.group_of[target] = group  # a later group wins a shared target, at its first position
        self.targets = Targets(self.group_of, "config group target", file)

    @property
    def broken(self) -> list[str]:
        return self._broken

    def group(self, module: str, lm_head: bool | None = None) -> str | None:
        """The group vLLM loads `module` with, or None when no target claims it."""
        target = self.targets.resolve(module, lm_head)
        return None if target is None else self.group_of[target]

    def compressed_tensors_group(self, module: str) -> str | None:
        """The group compressed-tensors quantized `module` with, by its own precedence."""
        target = self.targets.compressed_tensors_order(module)
        return None if target is None else self.group_of[target]

    def conflicts(self, modules: Iterable[str], ignore: Targets | None = None) -> list[tuple[str, str, str]]:
        """(module, vLLM's group, compressed-tensors' group) wherever both claim a module vLLM does not
        ignore, with different groups. A module only one of them claims is a coverage question, not this."""
        found = []
        for module in modules:
            if ignore is not None and ignore.ignores(module):
                continue
            ours, theirs = self.group(module), self.compressed_tensors_group(module)
            if ours is not None and theirs is not None and ours != theirs:
                found.append((module, ours, theirs))
        return found
