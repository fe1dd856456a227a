"""Property tests of the arms-file loader: any document gives a usable config or a WeightsmithError.

Three sources of input: TOML-ish text; a valid arms document with some of its values (or new
keys) replaced by arbitrary TOML values; and random corruptions of a valid arms file's bytes. A
config that loads must be one a run can use and record: every number finite and within its
documented bound, and the whole of it writable as strict JSON and readable back as a results file.
Each example must finish within the deadline, so a hang (or a run-away expansion) fails the test.
"""

from __future__ import annotations

import copy
import json
import math
import tomllib
from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from weightsmith.bench import config as cfg
from weightsmith.bench.config import BenchConfig, load_config, parse_config
from weightsmith.bench.results import results_from_dict, to_jsonable
from weightsmith.bench.runner import new_results
from weightsmith.core.errors import WeightsmithError

FUZZ = settings(max_examples=300, deadline=timedelta(seconds=2), database=None)

VALID_TEXT = """\
repeats = 2
warmups = 1
baseline = "b"
prefill_min_tokens = 2000
alpha = 0.05

[workload]
prompt_tokens = [80, 600]
prompts_per_length = 4
max_tokens = 64
concurrency = 1
temperature = 0.0
endpoint = "completions"
ignore_eos = true
seed = 0
chars_per_token = 3.5
request_timeout_s = 300

[determinism]
replicates = 5
prompt_tokens = 600
max_tokens = 32
top_logprobs = 5

[[arms]]
name = "a"
command = ["vllm", "serve", "m", "--port", "{port}", "--speculative-config", '{"num_speculative_tokens": 3}']
kind = "vllm"
model = "m"
fresh_cache = true
startup_timeout_s = 900
extra_body = { cache_salt = "x" }
[arms.env]
CUDA_VISIBLE_DEVICES = "0"
[arms.sweep]
flag = "--speculative-config"
key = "num_speculative_tokens"
values = [2, 3]

[[arms]]
name = "b"
url = "http://127.0.0.1:8000"
"""


def _document() -> dict[str, Any]:
    return tomllib.loads(VALID_TEXT)


VALID = parse_config(_document(), "valid.toml")


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in the valid document (tables and arrays included)."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


PATHS = _paths(_document())
#: Strings built from what shells, URLs and TOML give meaning to, beside arbitrary ones.
SHELLISH = st.text(alphabet=st.sampled_from(list("ab '\"\\$={}port:/.[]@\x00\n")), max_size=16)
TOML_VALUES = st.recursive(
    st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, 2, -1, 100, 101, 2**20, 2**20 + 1, 2**63])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | SHELLISH
    | st.sampled_from(["{port}", "http://h:{port}", "$HOME", "a b 'c", "vllm", "chat", "\x00"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
TOMLISH = st.text(alphabet=st.sampled_from(list("[]{}=\"',.0123456789-+_aeinrstfuy \n#$")), max_size=300)


def _assert_usable(config: BenchConfig) -> None:
    """What a run relies on: bounded, finite numbers, and a config that can be recorded as strict JSON."""
    assert 1 <= config.repeats <= cfg.MAX_REPEATS and 0 <= config.warmups <= cfg.MAX_REPEATS
    assert 0 < config.alpha < 0.5
    w = config.workload
    assert 1 <= len(w.prompt_tokens) <= cfg.MAX_PROMPT_LENGTHS
    assert all(1 <= n <= cfg.MAX_TOKENS for n in w.prompt_tokens)
    assert 1 <= w.prompts_per_length <= cfg.MAX_PROMPTS_PER_LENGTH and 1 <= w.max_tokens <= cfg.MAX_TOKENS
    assert 1 <= w.concurrency <= cfg.MAX_CONCURRENCY
    assert 0 < w.request_timeout_s <= cfg.MAX_TIMEOUT_S and math.isfinite(w.temperature)
    assert 1 <= len(config.arms) <= cfg.MAX_ARMS
    for arm in config.arms:
        assert arm.url is not None or arm.command
        assert 0 < arm.startup_timeout_s <= cfg.MAX_TIMEOUT_S
        assert all("\x00" not in t for t in arm.command or [])
    results = new_results(config)
    text = json.dumps(to_jsonable(results), allow_nan=False)
    results_from_dict(json.loads(text))


def _loads_or_error(data: dict[str, Any]) -> None:
    try:
        config = parse_config(data, "fuzz.toml")
    except WeightsmithError as exc:
        assert str(exc).startswith("fuzz.toml: ")
        return
    _assert_usable(config)


def test_the_valid_document_loads() -> None:
    assert [a.name for a in VALID.arms] == ["a@num_speculative_tokens=2", "a@num_speculative_tokens=3", "b"]
    _assert_usable(VALID)


def _holds(node: Any, step: Any) -> bool:
    if isinstance(node, dict):
        return step in node
    return isinstance(node, list) and isinstance(step, int) and step < len(node)


def _replace(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """Set the value at `path`, unless an earlier change removed the way there."""
    node: Any = data
    for step in path[:-1]:
        if not _holds(node, step):
            return
        node = node[step]
    if _holds(node, path[-1]):
        node[path[-1]] = copy.deepcopy(value)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(PATHS), TOML_VALUES), min_size=1, max_size=4))
def test_valid_document_with_values_replaced(changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    data = _document()
    for path, value in changes:
        _replace(data, path, value)
    _loads_or_error(data)


@FUZZ
@given(
    st.sampled_from([(), ("workload",), ("determinism",), ("arms", 0), ("arms", 0, "sweep"), ("arms", 0, "env")]),
    st.text(min_size=1, max_size=10),
    TOML_VALUES,
)
def test_valid_document_with_a_key_added(table: tuple[Any, ...], key: str, value: Any) -> None:
    data = _document()
    node = data
    for step in table:
        node = node[step]
    node[key] = copy.deepcopy(value)
    _loads_or_error(data)


@FUZZ
@given(st.sampled_from(["name", "url", "command", "model", "kind"]), st.integers(0, 1), SHELLISH | TOML_VALUES)
def test_arm_strings(key: str, arm: int, value: Any) -> None:
    data = _document()
    data["arms"][arm][key] = value
    _loads_or_error(data)


@FUZZ
@given(TOMLISH)
def test_tomlish_text(tmp_path_factory, text: str) -> None:
    path = tmp_path_factory.getbasetemp() / "tomlish.toml"
    path.write_text(text, encoding="utf-8")
    try:
        config = load_config(path)
    except WeightsmithError as exc:
        assert str(exc).startswith(str(path))
        return
    _assert_usable(config)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID_TEXT.encode()) - 1), st.integers(0, 255)), max_size=6))
def test_corrupted_valid_file(tmp_path_factory, flips: list[tuple[int, int]]) -> None:
    data = bytearray(VALID_TEXT.encode())
    for pos, value in flips:
        data[pos] = value
    path = tmp_path_factory.getbasetemp() / "corrupted.toml"
    path.write_bytes(bytes(data))
    try:
        config = load_config(path)
    except WeightsmithError as exc:
        assert str(exc).startswith(str(path))
        return
    _assert_usable(config)
