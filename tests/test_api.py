"""The library entry points: each does what its command does (the same bytes, the same report), refuses
what its command refuses (the same one-line message), and a type checker sees their real signatures."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import weightsmith
from clirun import one_error_line, run
from synth import llama_tensors, write_checkpoint
from weightsmith.core.errors import WeightsmithError
from weightsmith.quantization.pipeline import QuantizeResult

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("api") / "src", llama_tensors(), shards=2)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BF16 Llama the engine runs in well under a second (tests/engine's, with SmolLM2's tokenizer)."""
    for library in ("torch", "transformers", "compressed_tensors"):
        pytest.importorskip(library)
    from fidelity.eval_checkpoints import TINY_LM_CONFIG, TOKENIZER_FILES
    from models import smollm2_fp32

    try:
        smollm2 = smollm2_fp32()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    folder = write_checkpoint(
        tmp_path_factory.mktemp("api") / "bf16", llama_tensors(TINY_LM_CONFIG, seed=5), TINY_LM_CONFIG
    )
    for name in TOKENIZER_FILES:
        shutil.copy(smollm2 / name, folder / name)
    return folder


def _same_files(a: Path, b: Path, skip: tuple[str, ...] = ()) -> None:
    names = sorted(p.name for p in a.iterdir() if p.name not in skip)
    assert names == sorted(p.name for p in b.iterdir() if p.name not in skip)
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _manifest(folder: Path) -> dict[str, Any]:
    """The manifest less what differs between two runs of the same command (times, the output path)."""
    doc = json.loads((folder / "weightsmith.json").read_text())
    for key in ("created", "seconds", "timing", "output"):
        doc.pop(key, None)
    return doc


def _timeless(doc: Any) -> Any:
    """A report with every `seconds` (wall time, the one thing two runs do not share) set to 0."""
    if isinstance(doc, dict):
        return {k: 0 if k == "seconds" else _timeless(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_timeless(v) for v in doc]
    return doc


def test_quantize_from_code_equals_the_command_line(src: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    result = weightsmith.quantize(
        weightsmith.QuantizeRequest(
            src, tmp_path / "lib", scheme="w4a16-asym", group_size=64, workers=2, hash_sources=False
        )
    )
    assert isinstance(result, QuantizeResult) and result.output == tmp_path / "lib"
    assert result.manifest.recipe.rules and result.manifest.recipe.rules[0].config_group == "W4A16_ASYM"
    code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "cli", "--scheme", "w4a16-asym",
                       "--group-size", "64", "--no-hash")  # fmt: skip
    assert code == 0, err
    _same_files(tmp_path / "lib", tmp_path / "cli", skip=("weightsmith.json",))


def test_plan_quantize_equals_the_dry_run_and_writes_nothing(src: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    from weightsmith.quantization.cli import plan_json

    plan = weightsmith.plan_quantize(weightsmith.QuantizeRequest(src, scheme="nvfp4a16"))
    assert plan.count("quantize") == 14 and plan.bytes_out < plan.bytes_in
    assert not list(tmp_path.iterdir())
    code, out, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "o", "--scheme", "nvfp4a16", "--dry-run",
                         "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out) == json.loads(json.dumps(plan_json(plan)))
    with pytest.raises(WeightsmithError, match="unknown scheme 'w5a16'"):
        weightsmith.plan_quantize(weightsmith.QuantizeRequest(src, scheme="w5a16"))


RECIPE = "[[rule]]\ntargets = ['Linear']\nscheme = 'w4a16'\n"
MEMORYLESS_RECIPE = RECIPE + "\n[[rule]]\ntargets = ['re:.*']\nscheme = 'w4a16'\nscale_search = 'memoryless_mse'\n"

#: (command-line arguments, the library's keyword arguments): each a contradiction both refuse.
REFUSED = [
    (["--scheme", "nvfp4a16", "--recipe", "{recipe}"], {"scheme": "nvfp4a16", "recipe": "{recipe}"}),
    (["--group-size", "32", "--recipe", "{recipe}"], {"group_size": 32, "recipe": "{recipe}"}),
    (["--scale-search", "mse", "--recipe", "{recipe}"], {"scale_search": "mse", "recipe": "{recipe}"}),
    (["--method", "gptq", "--scale-search", "memoryless_mse"], {"method": "gptq", "scale_search": "memoryless_mse"}),
    (["--method", "gptq", "--recipe", "{memoryless}"], {"method": "gptq", "recipe": "{memoryless}"}),
    (["--method", "pq"], {"method": "pq"}),
    (["--builtin", "code"], {"builtin": "code"}),
    (["--text", "{recipe}"], {"text": "{recipe}"}),
    (["--method", "gptq", "--dampening", "1.5"], {"method": "gptq", "dampening": 1.5}),
    (["--method", "gptq", "--actorder", "group"], {"method": "gptq", "actorder": "group"}),
    (["--method", "gptq", "--actorder", "dynamic"], {"method": "gptq", "actorder": "dynamic"}),
    (["--method", "gptq", "--tokens", "0"], {"method": "gptq", "tokens": 0}),
]


def _request(src: Path, out: Path | None, kwargs: dict[str, Any]) -> weightsmith.QuantizeRequest:
    """The request of the library's keyword arguments: GPTQ's go into its options."""
    gptq_fields = {f.name for f in dataclasses.fields(weightsmith.GptqOptions)}
    gptq = weightsmith.GptqOptions(**{k: v for k, v in kwargs.items() if k in gptq_fields})
    asked = {k: v for k, v in kwargs.items() if k not in gptq_fields}
    return weightsmith.QuantizeRequest(src, out, gptq=gptq, **asked)


@pytest.mark.parametrize(("args", "kwargs"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_the_library_refuses_what_the_command_refuses_in_its_words(
    args: list[str], kwargs: dict[str, Any], src: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    files = {"{recipe}": tmp_path / "r.toml", "{memoryless}": tmp_path / "m.toml"}
    files["{recipe}"].write_text(RECIPE)
    files["{memoryless}"].write_text(MEMORYLESS_RECIPE)
    args = [str(files.get(a, a)) for a in args]
    kwargs = {k: files.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    for dry in ((), ("--dry-run",)):
        code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "cli", *args, *dry)
        assert code == 2
        line = one_error_line(err)
        with pytest.raises(WeightsmithError) as refused:
            weightsmith.quantize(_request(src, tmp_path / "lib", kwargs))
        assert line == f"error: {refused.value}"
    with pytest.raises(WeightsmithError) as refused:  # a plan of the same request is refused alike
        weightsmith.plan_quantize(_request(src, None, kwargs))
    assert line == f"error: {refused.value}"
    assert not (tmp_path / "cli").exists() and not (tmp_path / "lib").exists()


def test_a_recipe_object_is_held_to_the_same_refusals(src: Path, tmp_path: Path) -> None:
    from weightsmith.quantization.recipe import load_recipe

    (tmp_path / "m.toml").write_text(MEMORYLESS_RECIPE)
    recipe = load_recipe(tmp_path / "m.toml")  # read without GPTQ in mind: memoryless_mse is a plain search
    assert weightsmith.plan_quantize(weightsmith.QuantizeRequest(src, recipe=recipe)).count("quantize") == 14
    with pytest.raises(WeightsmithError, match="rule 2: --method gptq fixes its grid"):
        weightsmith.plan_quantize(weightsmith.QuantizeRequest(src, recipe=recipe, method="gptq"))
    with pytest.raises(WeightsmithError, match="--group-size and --recipe both set the scheme"):
        weightsmith.plan_quantize(weightsmith.QuantizeRequest(src, recipe=recipe, group_size=32))
    with pytest.raises(WeightsmithError, match="--group-size 0: give a whole number from 1 to"):
        weightsmith.plan_quantize(weightsmith.QuantizeRequest(src, scheme="w4a16", group_size=0))


def test_warnings_reach_the_caller_not_the_terminal(src: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "r.toml").write_text(RECIPE + "\n[[rule]]\ntargets = ['model.nothing']\nscheme = 'w8a16'\n")
    said: list[str] = []
    weightsmith.plan_quantize(
        weightsmith.QuantizeRequest(src, recipe=tmp_path / "r.toml"), weightsmith.Hooks(warn=said.append)
    )
    assert said == ["rule 2 target 'model.nothing' matches no Linear-like weight"]
    with pytest.warns(UserWarning, match="matches no Linear-like weight"):
        weightsmith.plan_quantize(weightsmith.QuantizeRequest(src, recipe=tmp_path / "r.toml"))
    assert capsys.readouterr() == ("", "")


def test_verify_from_code_is_the_commands_report(src: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    out = weightsmith.quantize(weightsmith.QuantizeRequest(src, tmp_path / "q", workers=1)).output
    report = weightsmith.verify(out, scan_values=True)
    assert report.clean and report.errors == 0
    code, printed, err = run(capsys, monkeypatch, "verify", out, "--scan-values", "--json")
    assert code == 0, err
    assert _timeless(json.loads(printed)) == _timeless(json.loads(json.dumps(dataclasses.asdict(report))))
    (out / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 16)
    assert not weightsmith.verify(out).clean


def test_evaluate_from_code_is_the_commands_report(src: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    from weightsmith.fidelity.report import EvalReport, to_json

    out = weightsmith.quantize(weightsmith.QuantizeRequest(src, tmp_path / "q", group_size=64, workers=1)).output
    report = weightsmith.evaluate(src, out, logits=False)
    assert isinstance(report, EvalReport) and report.logits.status == "skipped"
    code, printed, err = run(capsys, monkeypatch, "eval", src, out, "--no-logits", "--json")
    assert code == 0, err
    assert _timeless(json.loads(printed)) == _timeless(json.loads(to_json(report)))
    with pytest.raises(WeightsmithError, match="--tokens '1': give a whole number of tokens from 2"):
        weightsmith.evaluate(src, out, tokens=1)


def test_gptq_from_code_equals_the_command_line(tiny_llama: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    said: list[str] = []
    result = weightsmith.quantize(
        weightsmith.QuantizeRequest(
            tiny_llama,
            tmp_path / "lib",
            method="gptq",
            group_size=32,
            workers=1,
            gptq=weightsmith.GptqOptions(builtin="code", tokens=64, seq_len=32),
        ),
        weightsmith.Hooks(warn=said.append),
    )
    assert result.manifest.method is not None and result.manifest.method.name == "gptq"
    assert len(said) == 1 and said[0].startswith("64 calibration tokens, fewer than the widest quantized input")
    assert list(result.engine)[:2] == ["libraries", "tokens"]
    code, _, err = run(capsys, monkeypatch, "quantize", tiny_llama, tmp_path / "cli", "--method", "gptq",
                       "--group-size", "32", "--builtin", "code", "--tokens", "64", "--seq-len", "32",
                       "--workers", "1")  # fmt: skip
    assert code == 0, err
    assert f"warning: {said[0]}" in " ".join(err.split())
    _same_files(tmp_path / "lib", tmp_path / "cli", skip=("weightsmith.json", "README.md"))
    assert _manifest(tmp_path / "lib")["method"] == _manifest(tmp_path / "cli")["method"]


def test_calibrate_from_code_equals_the_command_line(tiny_llama: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    from weightsmith.calibration import stats_file
    from weightsmith.io import texts

    said: list[str] = []
    result = weightsmith.calibrate(tiny_llama, tmp_path / "lib.safetensors", tokens=300, seq_len=128,
                                   warn=said.append)  # fmt: skip
    assert result.path == tmp_path / "lib.safetensors" and result.tokens == 300 and result.seconds > 0
    assert said == [f"300 calibration tokens, fewer than {texts.MIN_TOKENS}: a maximum over so few is not stable"]
    code, _, err = run(capsys, monkeypatch, "calibrate", tiny_llama, "--out", tmp_path / "cli.safetensors",
                       "--tokens", 300, "--seq-len", 128)  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "lib.safetensors").read_bytes() == (tmp_path / "cli.safetensors").read_bytes()
    assert stats_file.read(tmp_path / "lib.safetensors") == result.stats
    with pytest.raises(WeightsmithError, match=r"already exists \(pass --force"):
        weightsmith.calibrate(tiny_llama, tmp_path / "lib.safetensors", tokens=300, seq_len=128)

    # calibrate-kv: the same scales added, from code and from the command line
    quant = weightsmith.quantize(
        weightsmith.QuantizeRequest(tiny_llama, tmp_path / "w4", group_size=32, workers=1)
    ).output
    added = weightsmith.calibrate_kv(quant, tiny_llama, tokens=64, seq_len=32, out=tmp_path / "kv-lib")
    assert added.output == tmp_path / "kv-lib" and added.calibration["kv_scales"] == 4
    code, _, err = run(capsys, monkeypatch, "calibrate-kv", quant, "--from", tiny_llama, "--tokens", 64,
                       "--seq-len", 32, "--out", tmp_path / "kv-cli")  # fmt: skip
    assert code == 0, err
    _same_files(tmp_path / "kv-lib", tmp_path / "kv-cli", skip=("weightsmith.json",))


def test_the_entry_points_load_on_first_use() -> None:
    """`import weightsmith` loads neither numpy nor the API; each entry point is the API's function."""
    script = (
        "import sys, weightsmith\n"
        "print('numpy' in sys.modules, 'weightsmith.api' in sys.modules)\n"
        "from weightsmith import api\n"
        "names = ('quantize', 'plan_quantize', 'calibrate', 'calibrate_kv', 'verify', 'evaluate', 'QuantizeRequest')\n"
        "import inspect\n"
        "print(all(getattr(weightsmith, n) is getattr(api, n) for n in names),\n"
        "      list(inspect.signature(weightsmith.quantize).parameters) == ['request', 'hooks'])\n"
        "import weightsmith.quantization.recipe as recipe\n"
        "print(recipe.__name__)\n"
    )
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True", "True", "weightsmith.quantization.recipe"]
    assert set(weightsmith.__all__) >= {"quantize", "plan_quantize", "calibrate", "calibrate_kv", "verify", "evaluate"}


#: mypy reads weightsmith (what the user's call resolves to) but not the libraries under it: checking
#: torch and transformers takes minutes, and the API's own signatures are what the test is about.
MYPY_CONFIG = """[mypy]
strict = True
incremental = False
follow_imports = silent

[mypy-torch.*,transformers.*,numba.*,scipy.*,numpy.*,ml_dtypes.*,rich.*,typer.*,safetensors.*,compressed_tensors.*,huggingface_hub.*,tokenizers.*]
follow_imports = skip
"""


def _mypy(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    user, config = tmp_path / "user.py", tmp_path / "mypy.ini"
    user.write_text(code)
    config.write_text(MYPY_CONFIG)
    environ = dict(os.environ, MYPYPATH=str(SRC))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), str(user)],
        capture_output=True, text=True, env=environ, cwd=tmp_path,
    )  # fmt: skip


def test_a_type_checker_sees_the_real_signatures(tmp_path: Path) -> None:
    """Through the module `__getattr__`, mypy checks a user's calls against the API's signatures and the
    request's fields: wrong arguments are errors, a right call is none."""
    pytest.importorskip("mypy")
    wrong = _mypy(tmp_path, "import weightsmith\n\nweightsmith.quantize(123)\n"
                            "weightsmith.QuantizeRequest('src', scheme=5, bogus=True)\n"
                            "weightsmith.verify(1)\nweightsmith.calibrate('a')\n")  # fmt: skip
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    for expected in (
        'Unexpected keyword argument "bogus" for "QuantizeRequest"',
        'Argument "scheme" to "QuantizeRequest" has incompatible type "int"',
        'Argument 1 to "quantize" has incompatible type "int"',
        'Argument 1 to "verify" has incompatible type "int"',
        'Missing positional argument "out"',
    ):
        assert expected in wrong.stdout, wrong.stdout
    right = _mypy(
        tmp_path,
        "from pathlib import Path\n\nimport weightsmith\n"
        "from weightsmith.quantization.pipeline import QuantizeResult\n\n"
        "gptq = weightsmith.GptqOptions(builtin='prose', tokens=512)\n"
        "request = weightsmith.QuantizeRequest('src', Path('out'), 'w4a16', group_size=64, method='gptq',\n"
        "                                      gptq=gptq)\n"
        "result: QuantizeResult = weightsmith.quantize(request, weightsmith.Hooks(warn=print))\n"
        "plan = weightsmith.plan_quantize(weightsmith.QuantizeRequest('org/name@main', recipe='r.toml'))\n"
        "clean: bool = weightsmith.verify('out', scan_values=True).clean\n"
        "status: str = weightsmith.evaluate('src', 'out', logits=False).logits.status\n"
        "seconds: float = weightsmith.calibrate('src', 's.safetensors', builtin='prose').seconds\n"
        "folder: Path = weightsmith.calibrate_kv('out', 'src').output\n",
    )
    assert right.returncode == 0, right.stdout + right.stderr
