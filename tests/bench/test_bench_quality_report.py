"""The report's Quality section and plot, from synthetic results (no server, no runner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weightsmith.bench.report import write_all
from weightsmith.bench.results import (
    ArmInfo,
    BenchResults,
    QualityRun,
    ScenarioOutcome,
    load_results,
    to_jsonable,
)
from weightsmith.core.errors import WeightsmithError

CATEGORIES = ("tool choice", "argument construction", "multi-step", "restraint")


def quality_runs() -> list[QualityRun]:
    """Two arms, two runs, 40 scenarios in four categories.

    `w4a16` passes everything but s0 (flips between its runs) and s1; `w4a4` also fails s2-s13 in both
    runs, a 12-scenario gap that the sign test and the noise rule both accept.
    """
    runs = []
    for arm, failing in (("w4a16", {1}), ("w4a4", {1, *range(2, 14)})):
        for run in range(2):
            flipped = failing | ({0} if run == 1 else set())
            outcomes = [
                ScenarioOutcome(f"s{k}", CATEGORIES[k % 4], k not in flipped, "" if k not in flipped else "no match")
                for k in range(40)
            ]
            runs.append(QualityRun(arm, run, "builtin:tool-use", outcomes))
    return runs


def results_with_quality(quality: list[QualityRun]) -> BenchResults:
    return BenchResults(
        created="2026-01-01T00:00:00Z", weightsmith_version="0.1.0", host={"cpu": "test"},
        config={"repeats": 1, "warmups": 0, "quality": {"suite": "builtin:tool-use", "runs": 2}},
        baseline="w4a16", prefill_min_tokens=256, alpha=0.05, chars_per_token=3.5, chars_per_token_source="fixed",
        arms=[ArmInfo("w4a16", "llama.cpp"), ArmInfo("w4a4", "llama.cpp")], quality=quality,
    )  # fmt: skip


def test_report_states_the_noise_floor_then_the_comparison_then_categories(tmp_path: Path) -> None:
    analysis, files = write_all(results_with_quality(quality_runs()), tmp_path)
    report = (tmp_path / "report.md").read_text()
    section = report[report.index("## Quality") : report.index("## Server log check")]
    floor, versus, categories = (section.index(h) for h in ("### Noise floor", "### Against", "### Per category"))
    assert floor < versus < categories
    assert "- `w4a16` passed 39 and 38 of 40 in its 2 runs; 1 of 40 scenarios flip between its own runs" in section
    assert "Flipping: `s0`." in section
    assert (
        "- **difference shown**: `w4a4` passed 27 and 26 of 40 in its 2 runs, `w4a16` 39 and 38 of 40 in its 2 runs; "
        "of the 12 scenarios they did not pass equally often, 0 also flip between either arm's own runs; sign test "
        "0 for `w4a4` and 12 for `w4a16`, p = 0.000488: difference shown: `w4a16` passed more." in section
    )
    assert "| tool choice | 10, 9 / 10 ‡ | 7, 6 / 10 ‡ |" in section  # s0 is a tool-choice scenario
    assert "| restraint | 10, 10 / 10 | 7, 7 / 10 |" in section
    assert "![scenarios passed per run, per arm and category](quality.png)" in section
    assert "Scenarios whose outcome is not the same in every run of every arm (13 of 40)" in section
    assert "| `s0` | tool choice | ✓✗ | ✓✗ |" in section
    assert files["quality"].stat().st_size > 10_000

    data = json.loads((tmp_path / "results.json").read_text())
    q = data["analysis"]["quality"]
    assert q["comparisons"][0]["verdict"] == "difference shown" and q["comparisons"][0]["better"] == "w4a16"
    assert q["scenarios"][0] == {"scenario": "s0", "category": "tool choice",
                                 "passed": {"w4a16": [True, False], "w4a4": [True, False]}}  # fmt: skip
    again = load_results(tmp_path / "results.json")  # the raw runs read back, the analysis recomputed
    assert again.quality == results_with_quality(quality_runs()).quality
    assert analysis.quality is not None


def test_without_quality_the_section_says_it_was_not_run(tmp_path: Path) -> None:
    _, files = write_all(results_with_quality([]), tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "## Quality\n\nNot run (no `[quality]` table in the arms file)." in report
    assert "quality" not in files
    assert json.loads((tmp_path / "results.json").read_text())["analysis"]["quality"] is None


def test_one_run_per_arm_reports_no_noise_floor_and_no_ordering(tmp_path: Path) -> None:
    one_each = [r for r in quality_runs() if r.run == 0]
    write_all(results_with_quality(one_each), tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "`w4a16` ran once and passed 39 of 40; what flips between two runs of the same bytes was not measured" in (
        report
    )
    assert "- no ordering shown: `w4a4` passed 27 of 40" in report
    assert "`w4a16` and `w4a4` ran once, so what flips between its own runs is unknown" in report


def test_failed_scenario_requests_are_named_in_read_first(tmp_path: Path) -> None:
    runs = quality_runs()
    runs[2].outcomes[5] = ScenarioOutcome("s5", CATEGORIES[1], False, "request failed", error="HTTP 500")
    write_all(results_with_quality(runs), tmp_path)
    report = (tmp_path / "report.md").read_text()
    first = report[report.index("## Read first") : report.index("## Verdicts")]
    assert "- `w4a4`: 1 quality scenario request(s) failed and count as not passed, e.g. `s5`: HTTP 500" in first


def test_a_quality_run_of_an_unknown_arm_is_a_malformed_file(tmp_path: Path) -> None:
    data = to_jsonable(results_with_quality(quality_runs()))
    data["quality"][3]["arm"] = "ghost"
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    with pytest.raises(WeightsmithError, match=r"field quality\[3\]\.arm: 'ghost' is not one of the arms"):
        load_results(path)
