"""The arms file: validation, defaults, sweep expansion, kind detection."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from weightsmith.bench.config import ArmSpec, SweepSpec, expand_sweep, load_config, parse_config
from weightsmith.core.errors import WeightsmithError


def test_minimal_file_gets_documented_defaults() -> None:
    config = parse_config({"arms": [{"name": "a", "url": "http://127.0.0.1:8000"}]})
    assert config.repeats == 2 and config.warmups == 2
    assert config.workload.prompt_tokens == [80, 600, 2048]
    assert config.workload.temperature == 0.0 and config.workload.concurrency == 1
    assert config.baseline_arm == "a"
    assert config.determinism.replicates == 5


def test_speculative_config_sweep_changes_only_the_key() -> None:
    arm = ArmSpec(
        name="eagle",
        command=[
            "vllm",
            "serve",
            "m",
            "--speculative-config",
            '{"method": "eagle3", "model": "d", "num_speculative_tokens": 3}',
            "--port",
            "{port}",
        ],
        sweep=SweepSpec(flag="--speculative-config", key="num_speculative_tokens", values=(1, 4)),
    )
    arms = expand_sweep(arm)
    assert [a.name for a in arms] == ["eagle@num_speculative_tokens=1", "eagle@num_speculative_tokens=4"]
    for a, k in zip(arms, (1, 4), strict=True):
        assert a.command is not None
        spec = json.loads(a.command[a.command.index("--speculative-config") + 1])
        assert spec == {"method": "eagle3", "model": "d", "num_speculative_tokens": k}
        assert a.sweep_param == "num_speculative_tokens" and a.sweep_value == k
        assert a.resolved_kind == "vllm"


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["llama-server", "--spec-draft-n-max", "3"], ["llama-server", "--spec-draft-n-max", "8"]),
        (["llama-server", "--spec-draft-n-max=3"], ["llama-server", "--spec-draft-n-max=8"]),
        (["llama-server"], ["llama-server", "--spec-draft-n-max", "8"]),
    ],
)
def test_plain_flag_sweep_replaces_or_appends(command: list[str], expected: list[str]) -> None:
    arm = ArmSpec(name="x", command=command, url="http://h:1", sweep=SweepSpec("--spec-draft-n-max", (8,)))
    (only,) = expand_sweep(arm)
    assert only.command == expected
    assert only.resolved_kind == "llama.cpp"


def test_sweep_of_json_flag_with_bad_json_is_one_clear_error() -> None:
    data = {
        "arms": [
            {
                "name": "a",
                "command": ["vllm", "serve", "--speculative-config", "{not json", "--port", "{port}"],
                "sweep": {"flag": "--speculative-config", "key": "num_speculative_tokens", "values": [2]},
            }
        ]
    }
    with pytest.raises(WeightsmithError, match="not JSON"):
        parse_config(data, "arms.toml")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"arms": []}, "no \\[\\[arms\\]\\]"),
        ({"arms": [{"name": "a"}]}, "give 'url'"),
        ({"arms": [{"name": "a", "command": "vllm serve m"}]}, "put \\{port\\}"),
        ({"arms": [{"name": "a", "url": "h:1"}]}, "must start with http"),
        ({"arms": [{"name": "a", "url": "http://h:1", "colour": 1}]}, "unknown key 'colour'"),
        ({"repeat": 2, "arms": [{"name": "a", "url": "http://h:1"}]}, "unknown key 'repeat'"),
        ({"arms": [{"name": "a b", "url": "http://h:1"}]}, "may use letters"),
        ({"arms": [{"name": "a", "url": "http://h:1"}, {"name": "a", "url": "http://h:2"}]}, "unique"),
        ({"baseline": "z", "arms": [{"name": "a", "url": "http://h:1"}]}, "baseline 'z'"),
        ({"workload": {"endpoint": "embeddings"}, "arms": [{"name": "a", "url": "http://h:1"}]}, "endpoint"),
        ({"workload": {"prompt_tokens": [0]}, "arms": [{"name": "a", "url": "http://h:1"}]}, r"\[0\] must be > 0"),
        ({"workload": {"max_tokens": "64"}, "arms": [{"name": "a", "url": "http://h:1"}]}, "must be int"),
        ({"determinism": {"replicates": 1}, "arms": [{"name": "a", "url": "http://h:1"}]}, "at least 2"),
        ({"repeats": 0, "arms": [{"name": "a", "url": "http://h:1"}]}, "repeats must be > 0"),
        ({"arms": [{"name": "a", "url": "http://h:1", "sweep": {"flag": "-k", "values": [1]}}]}, "only an arm"),
        ({"arms": [{"name": "a", "command": "$WS_UNSET_VAR --port {port}"}]}, "not set: WS_UNSET_VAR"),
    ],
)
def test_bad_files_fail_with_one_line_naming_the_problem(data: dict, message: str) -> None:
    with pytest.raises(WeightsmithError, match=message) as info:
        parse_config(data, "arms.toml")
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("arms.toml: ")


def test_command_string_is_split_and_env_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WS_TEST_MODEL", "/models/m.gguf")
    path = tmp_path / "arms.toml"
    path.write_text(
        '[[arms]]\nname = "a"\ncommand = "llama-server -m $WS_TEST_MODEL --port {port}"\n'
        "[arms.env]\nOMP_NUM_THREADS = 2\n"
    )
    config = load_config(path)
    assert config.arms[0].command == ["llama-server", "-m", "/models/m.gguf", "--port", "{port}"]
    assert config.arms[0].env == {"OMP_NUM_THREADS": "2"}


def test_unreadable_or_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(WeightsmithError, match="cannot read arms file"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[arms]\n")
    with pytest.raises(WeightsmithError, match="not valid TOML"):
        load_config(bad)


def test_cli_reports_a_bad_arms_file_as_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "arms.toml"
    bad.write_text('[[arms]]\nname = "a"\nurl = "http://127.0.0.1:9"\nrepeatz = 3\n')
    proc = subprocess.run(
        [sys.executable, "-m", "weightsmith.cli", "bench", "run", str(bad), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown key 'repeatz'" in lines[0]
    assert not (tmp_path / "o").exists()


def test_the_arms_file_keys_are_the_spec_fields() -> None:
    """Each table's keys are its dataclass's fields, less those only the run sets."""
    import dataclasses

    from weightsmith.bench import config as c

    for spec, keys, run_only in (
        (c.BenchConfig, c._TOP_KEYS, {"source"}),
        (c.WorkloadSpec, c._WORKLOAD_KEYS, set()),
        (c.DeterminismSpec, c._DETERMINISM_KEYS, set()),
        (c.ArmSpec, c._ARM_KEYS, {"sweep_param", "sweep_value"}),
        (c.SweepSpec, c._SWEEP_KEYS, set()),
    ):
        assert set(keys) == {f.name for f in dataclasses.fields(spec)} - run_only
    assert c._ARM_KEYS["command"] == (str, list) and c._ARM_KEYS["sweep"] is dict
    assert c._WORKLOAD_KEYS["max_tokens"] == c.Bound(int, 0, c.MAX_TOKENS, low_open=True)
