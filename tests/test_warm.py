"""The install step that compiles every kernel: each registered scheme and search, each input dtype."""

from __future__ import annotations

from weightsmith import warm
from weightsmith.schemes import REGISTRY


def test_every_scheme_and_search_is_compiled() -> None:
    variants = warm._variants()
    assert {s.name for s in variants} == set(REGISTRY)
    assert ("w4a16", "memoryless_mse") in {(s.name, s.scale_search) for s in variants}
    assert ("w4a16", None) in {(s.name, s.scale_search) for s in variants}  # `none`: plain round-to-nearest
    assert warm.compile_all() == len(variants) * len(warm.INPUT_DTYPES)
