"""Hostile inputs to `weightsmith preflight`: one line naming the file, exit 2, nothing written.

The vLLM installation is an input too: a file that is not a wheel, a wheel or folder without the
package, and a package whose own tables name files outside it. Preflight only reads; each case
also checks that nothing in the sandbox changed.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from audit.doctor_builders import tiny_moe, write
from hostile.harness import Sandbox, copies, run_inprocess, tiny_pair
from weightsmith.quantization.demo import DEMO_CONFIG, write_demo_checkpoint

SMALL = {**DEMO_CONFIG, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 32}  # fmt: skip


@pytest.fixture
def pair(sandbox: Sandbox) -> tuple[Path, Path]:
    target = write(tiny_moe(layers=24, experts=2), sandbox.root / "target")
    draft = write_demo_checkpoint(sandbox.root / "draft", config=SMALL)
    return target, draft


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_pair(tmp_path_factory.mktemp("tiny"))


def fake_vllm(root: Path, files: dict[str, str]) -> Path:
    """A site-packages folder with a `vllm` package holding only FILES."""
    for rel, text in {"vllm/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_vllm_not_a_wheel(sandbox, pair, capsys, monkeypatch) -> None:
    bogus = sandbox.root / "vllm.whl"
    bogus.write_bytes(b"not a zip")
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "preflight", pair[0], "--vllm", bogus)
    assert r.code == 2 and "vllm.whl" in r.error_line and "is not a wheel" in r.error_line
    sandbox.assert_untouched()


def test_wheel_without_vllm(sandbox, pair, capsys, monkeypatch) -> None:
    wheel = sandbox.root / "other.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("other/__init__.py", "")
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "preflight", pair[0], "--vllm", wheel)
    assert r.code == 2 and "other.whl" in r.error_line and "no vllm/__init__.py" in r.error_line
    sandbox.assert_untouched()


def test_folder_without_vllm(sandbox, pair, capsys, monkeypatch) -> None:
    empty = sandbox.root / "site-packages"
    empty.mkdir()
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "preflight", pair[0], "--vllm", empty)
    assert r.code == 2 and "site-packages" in r.error_line and "holds no vllm package" in r.error_line
    sandbox.assert_untouched()


def test_no_vllm_installed_here(sandbox, pair, capsys, monkeypatch) -> None:
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "preflight", pair[0])
    assert r.code == 2 and "no vllm package is installed here" in r.error_line
    sandbox.assert_untouched()


def test_missing_target(sandbox, capsys, monkeypatch) -> None:
    vllm = fake_vllm(sandbox.root / "sp", {})
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "preflight", sandbox.root / "nope", "--vllm", vllm)
    assert r.code == 2 and "nope" in r.error_line and "does not exist" in r.error_line
    sandbox.assert_untouched()


def test_draft_given_as_one_shard(sandbox, pair, capsys, monkeypatch) -> None:
    vllm = fake_vllm(sandbox.root / "sp", {})
    sandbox.freeze()
    shard = pair[1] / "model.safetensors"
    r = run_inprocess(capsys, monkeypatch, "preflight", pair[0], "--draft", shard, "--vllm", vllm)
    assert r.code == 2 and "model.safetensors" in r.error_line and "checkpoint folder" in r.error_line
    sandbox.assert_untouched()


def test_draft_that_names_no_method(sandbox, pair, capsys, monkeypatch) -> None:
    vllm = fake_vllm(sandbox.root / "sp", {})
    config = json.loads((pair[1] / "config.json").read_text())
    del config["dflash_config"]
    config["architectures"] = "not a list"
    (pair[1] / "config.json").write_text(json.dumps(config))
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "preflight", pair[0], "--draft", pair[1], "--vllm", vllm)
    assert r.code == 2 and "config.json" in r.error_line and "pass --method" in r.error_line
    sandbox.assert_untouched()


def test_registry_naming_a_file_outside_the_package(sandbox, pair, capsys, monkeypatch) -> None:
    """A registry entry whose module leads out of the package is not followed; an unparsable model file
    is reported as unread, not as a crash."""
    secret = sandbox.root / "secret.py"
    secret.write_text("x.quant_config.get_cache_scale(n)\n")
    vllm = fake_vllm(
        sandbox.root / "sp",
        {
            "vllm/model_executor/models/registry.py": '_M = {"DFlashDraftModel": ("../../../../secret", "X"),'
            ' "DFlashLagunaForCausalLM": ("broken", "Y")}\n',
            "vllm/model_executor/models/broken.py": "def (:\n",
        },
    )
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "preflight", pair[0], "--draft", pair[1], "--vllm", vllm, "--json")
    doc = json.loads(r.out)
    assert r.code == 1 and doc["counts"]["will not load"] == 1
    assert doc["findings"][0]["check"] == "draft.architecture"
    sandbox.assert_untouched()
    config = json.loads((pair[1] / "config.json").read_text())
    config["architectures"] = ["DFlashLagunaForCausalLM"]
    (pair[1] / "config.json").write_text(json.dumps(config))
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "preflight", pair[0], "--draft", pair[1], "--vllm", vllm, "--json")
    assert r.code == 1 and "Traceback" not in r.err  # what it could not read fails the run (issue 45, item 14)
    doc = json.loads(r.out)
    assert doc["vllm"]["version"] == "unknown"
    assert any(f["message"].endswith("models/broken.py does not parse") for f in doc["findings"])
    sandbox.assert_untouched()


@pytest.mark.parametrize(
    ("report", "says"),
    [
        ({"schema": "weightsmith.eval", "vllm": {"version": "1"}, "method": None, "passed": True, "counts": {}},
         "is not `weightsmith preflight --json` output"),
        ({"schema": "weightsmith.preflight", "vllm": {"version": 25}, "method": None, "passed": True, "counts": {}},
         "vllm.version is an integer"),
        ({"schema": "weightsmith.preflight", "vllm": {"version": "0.33.0"}, "passed": "yes", "counts": {}},
         "has no field method"),
    ],
)  # fmt: skip
def test_card_refuses_a_report_that_is_not_preflight_output(
    sandbox: Sandbox, tiny, capsys, monkeypatch, report: dict, says: str
) -> None:
    _, out = copies(sandbox, tiny)
    path = sandbox.root / "report.json"
    path.write_text(json.dumps(report))
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "card", out, "--preflight", path)
    assert r.code == 2 and "report.json" in r.error_line and says in r.error_line
    sandbox.assert_untouched()
