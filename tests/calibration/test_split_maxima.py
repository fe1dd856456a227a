"""The maxima the ranks agreed on are split by kind; a name no rank of this job would send is one line."""

from __future__ import annotations

import pytest

from weightsmith.calibration.measure import split_maxima
from weightsmith.core.errors import WeightsmithError


def test_maxima_split_by_kind() -> None:
    reduced = {"k a.attn": 1.0, "v a.attn": 2.0, "x a.q_proj": 3.0}
    assert split_maxima(reduced) == ({"a.attn": (1.0, 2.0)}, {"a.q_proj": 3.0})


@pytest.mark.parametrize(
    ("reduced", "says"),
    [
        ({"k a.attn": 1.0}, "sent the maximum 'k a.attn' without 'v a.attn'"),
        ({"v a.attn": 1.0}, "sent the maximum 'v a.attn' without 'k a.attn'"),
        ({"": 1.0}, "sent the maximum '', which names no module's maximum"),
        ({"k": 1.0}, "sent the maximum 'k', which names no module's maximum"),
        ({"q a.attn": 1.0}, "sent the maximum 'q a.attn', which names no module's maximum"),
        ({"q " + "m" * 10_000: 1.0}, "more characters"),
    ],
    ids=["key-alone", "value-alone", "empty", "no-module", "unknown-kind", "long"],
)
def test_a_name_no_rank_of_this_job_sends_is_one_line(reduced: dict[str, float], says: str) -> None:
    with pytest.raises(WeightsmithError, match="a rank sent the maximum") as caught:
        split_maxima(reduced)
    assert says in str(caught.value) and len(str(caught.value)) < 400
