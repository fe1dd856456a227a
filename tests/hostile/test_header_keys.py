"""Repeated keys a fast JSON decode would silently collapse: each is still one line naming the file and name.

The header parser decodes without a hook on every object when a count of `:` proves that no key
repeats (safetensors/header.py, `_without_duplicates`). Each case here writes a header where a
repeat could hide from a weaker count (a first value that is not an object, a repeat inside an
entry or in `__metadata__`, a colon inside a name making up for a lost member) and runs
`weightsmith inspect` on a folder holding it: exit 2, one `error:` line naming the shard and the
name, no traceback, nothing written anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doctor_builders import raw_shard

from hostile.harness import Sandbox, run_inprocess
from weightsmith.core.errors import HeaderError
from weightsmith.safetensors.header import parse_header

SHARD = "model.safetensors"
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
F32 = '{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
F32_AGAIN = '{"dtype":"F32","shape":[1],"data_offsets":[4,8]}'

#: name -> (header text, data bytes, the name the line must give)
CASES: dict[str, tuple[str, int, str]] = {
    "a number before the object": ('{"w.weight":5,"w.weight":' + F32 + "}", 4, "w.weight"),
    "a list before the object": ('{"w.weight":[1,2],"w.weight":' + F32 + "}", 4, "w.weight"),
    "an empty object before the object": ('{"w.weight":{},"w.weight":' + F32 + "}", 4, "w.weight"),
    "the same object twice": ('{"w.weight":' + F32 + ',"w.weight":' + F32_AGAIN + "}", 8, "w.weight"),
    "a key repeated inside an entry": (
        '{"w.weight":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
        4,
        "dtype",
    ),
    "a key repeated in __metadata__": (
        '{"__metadata__":{"format":"pt","format":"np"},"w.weight":' + F32 + "}",
        4,
        "format",
    ),
    "a colon in a name making up for the lost member": (
        '{"a:b.weight":' + F32 + ',"w.weight":5,"w.weight":' + F32_AGAIN + "}",
        8,
        "w.weight",
    ),
    "a repeat in an object nested in a shape": (
        '{"w.weight":{"dtype":"F32","shape":[{"k":1,"k":2}],"data_offsets":[0,4]}}',
        4,
        "k",
    ),
}


def _folder(root: Path, header: str, data: int) -> Path:
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    text = header + " " * (-len(header) % 8)
    raw_shard(folder / SHARD, text, b"\0" * data)
    return folder


@pytest.mark.parametrize("case", list(CASES))
def test_a_repeated_key_is_one_line_naming_the_shard_and_the_name(
    case: str, sandbox: Sandbox, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    header, data, name = CASES[case]
    folder = _folder(sandbox.root, header, data)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "inspect", folder)
    assert result.code == 2, result
    line = result.error_line
    assert SHARD in line and f"'{name}'" in line and "appears twice" in line, line
    sandbox.assert_untouched()


@pytest.mark.parametrize("case", list(CASES))
def test_the_parser_names_the_repeat_as_the_strict_decoder_does(case: str) -> None:
    header, data, name = CASES[case]
    raw = len(header).to_bytes(8, "little") + header.encode() + b"\0" * data
    with pytest.raises(HeaderError) as caught:
        parse_header(Path(SHARD), raw, len(raw))
    assert caught.value.code == "header.duplicate-name"
    assert caught.value.tensor == name


def test_a_colon_in_a_name_is_still_a_valid_header() -> None:
    header = '{"__metadata__":{"format":"pt"},"a:b.weight":' + F32 + ',"c.weight":' + F32_AGAIN + "}"
    raw = len(header).to_bytes(8, "little") + header.encode() + b"\0" * 8
    parsed = parse_header(Path(SHARD), raw, len(raw))
    assert list(parsed.tensors) == ["a:b.weight", "c.weight"]
    assert parsed.metadata == {"format": "pt"}
