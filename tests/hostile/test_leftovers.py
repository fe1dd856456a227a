"""What killed runs leave behind, and interrupts at any moment, start-up included."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from clirun import sigint_default
from hostile.harness import Sandbox, run_inprocess, snapshot
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.io.outputdir import LOCK_FILE, REPLACED_MARKER, remove_stale


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped), so nothing runs under it now."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_kill_9_leaves_an_unfinished_folder_that_the_next_run_removes(sandbox: Sandbox, capsys, monkeypatch) -> None:
    big = {f"model.layers.{i}.mlp.up_proj.weight": np.ones((4096, 4096), ml_dtypes.bfloat16) for i in range(8)}
    src = write_checkpoint(sandbox.root / "src", big, shards=2)
    out = sandbox.root / "out"
    sandbox.freeze()
    proc = subprocess.Popen(
        [sys.executable, "-m", "weightsmith", "quantize", str(src), str(out), "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 60
    while not list(sandbox.root.glob("out.partial-*/*.safetensors")) and time.time() < deadline:
        assert proc.poll() is None, "finished before it could be killed"
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    left = list(sandbox.root.glob("out.partial-*"))
    assert len(left) == 1 and not out.exists()  # unfinished by its name; nothing named `out`

    result = run_inprocess(capsys, monkeypatch, "quantize", src, out, "--workers", "1", "--no-hash")
    assert result.code == 0, result.err
    assert f"removed {left[0].name}, left by an interrupted run (process {proc.pid} is gone)" in result.out
    assert out.is_dir() and not (out / LOCK_FILE).exists()
    sandbox.assert_untouched("out")


def test_a_live_runs_partial_folder_is_left_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    partial = tmp_path / f"out.partial-{_dead_pid()}"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"x")
    fd = os.open(partial / LOCK_FILE, os.O_WRONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a live run holds it (flock conflicts across open files)
    try:
        assert remove_stale(out) == []
        assert (partial / "model.safetensors").exists()
    finally:
        os.close(fd)
    assert remove_stale(out) == [f"removed {partial.name}, left by an interrupted run (process "
                                 f"{partial.name.rsplit('-', 1)[1]} is gone)"]
    assert not partial.exists()


def test_a_partial_folder_without_our_lock_file_is_never_removed(tmp_path: Path) -> None:
    """Its name and a dead pid prove nothing: without our lock file it may be anyone's folder."""
    dead = tmp_path / f"out.partial-{_dead_pid()}"
    dead.mkdir()
    (dead / "notes.txt").write_text("mine")
    assert remove_stale(tmp_path / "out") == []
    assert (dead / "notes.txt").read_text() == "mine"


def _set_aside(out: Path, pid: int) -> Path:
    """What a run with `pid` replacing `out` leaves when killed between the renames: `out`, marked, renamed aside."""
    record = {"pid": pid, "device": out.stat().st_dev, "inode": out.stat().st_ino}
    (out / REPLACED_MARKER).write_text(json.dumps(record))
    aside = out.with_name(f"{out.name}.replaced-{pid}")
    out.rename(aside)
    return aside


def test_a_run_that_died_mid_replace_gets_the_previous_output_back(tmp_path: Path) -> None:
    """Killed between renaming OUT aside and renaming the new one in: OUT is missing, so it is restored."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    old = _set_aside(out, _dead_pid())
    said = remove_stale(out)
    assert said == [f"restored out from {old.name}: a run replacing it died before finishing"]
    assert (out / "config.json").read_text() == "{}" and not old.exists()
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]  # the marker is gone with it

    old = _set_aside(out, _dead_pid())  # and when the new OUT did take its place, the previous one is left over
    out.mkdir()
    said = remove_stale(out)
    assert said == [f"removed {old.name}, the previous out left by a run that died replacing it"]
    assert out.is_dir() and not old.exists()


def test_names_that_only_look_like_leftovers_are_not_touched(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("mine")
    (tmp_path / "out.partial-abc").mkdir()  # not a pid
    (tmp_path / "other.partial-1").mkdir()  # another output's
    (tmp_path / f"out.partial-{_dead_pid()}x").mkdir()
    os.symlink(elsewhere, tmp_path / f"out.partial-{_dead_pid()}")  # a link is never followed or removed
    (tmp_path / f"out.replaced-{_dead_pid()}").write_text("a file, not a folder")
    before = snapshot(tmp_path)
    assert remove_stale(tmp_path / "out") == []
    assert snapshot(tmp_path) == before


#: Frames of the interpreter's own start-up (`python -m` finding and importing the package): frozen
#: modules, and importlib's Python parts, which some builds run unfrozen (`importlib/_abc.py`).
_STDLIB = Path(os.__file__).parent
_INTERPRETER_START_UP = ('"<frozen ', f'"{_STDLIB / "importlib"}{os.sep}', f'"{_STDLIB / "runpy.py"}"')


def test_ctrl_c_during_start_up_is_one_line(tmp_path: Path) -> None:
    """Interrupts from the first import to the command's end: never a traceback through our code.

    Only the interpreter's own start-up, before `python -m weightsmith` reaches our first line, can
    still print one (its frames are all `<frozen runpy>`/importlib's): no program can catch that.
    """
    interrupted = 0
    src = write_checkpoint(tmp_path / "src", llama_tensors(LLAMA_CONFIG), LLAMA_CONFIG)
    for delay in (0.05, 0.15, 0.3, 0.5, 0.8, 1.2):
        proc = subprocess.Popen(
            [sys.executable, "-m", "weightsmith", "inspect", str(src)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=sigint_default,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        frames = [ln for ln in err.splitlines() if ln.strip().startswith('File "')]
        ours = [ln for ln in frames if not any(mark in ln for mark in _INTERPRETER_START_UP)]
        assert not ours, f"a traceback through our code or a library's, after {delay} s:\n{err}"
        if "Traceback" not in err:
            assert len([ln for ln in err.splitlines() if ln.strip()]) <= 1, err
        interrupted += "interrupted" in err
    assert interrupted, "no interrupt landed during start-up: the delays no longer cover it"


def test_transplant_puts_back_a_target_a_killed_in_place_run_had_renamed_aside(tmp_path: Path) -> None:
    """Killed mid-replace in place: the target is missing, its previous self sits in TARGET.replaced-PID."""
    from doctor_builders import tiny_moe, write

    from weightsmith.audit.transplant import transplant

    donor = write(tiny_moe(kv_scales=True, seed=1), tmp_path / "donor")
    target = write(tiny_moe(kv_scales=False, seed=2), tmp_path / "target")
    aside = _set_aside(target, _dead_pid())
    result = transplant(donor, target, [r"re:.*\.(k|v)_scale$"])
    assert result.notes[0] == f"restored target from {aside.name}: a run replacing it died before finishing"
    assert not aside.exists() and result.verify_errors == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["donor", "target"]


def _main_exit_code(
    monkeypatch: pytest.MonkeyPatch, command: Callable[[], None], ending: Callable[[], None] = lambda: None
) -> int | str | None:
    """`weightsmith.__main__.main` in this process, `command` standing for the command line: its exit code.

    `ending` stands for the real one (which would ignore Ctrl-C in the test process from then on), and
    the unraisable-exception hook `main` installs is put back after. An interrupt escaping `main`
    fails the test (escaping, it would also stop the whole test run); other exceptions propagate.
    """
    from weightsmith import __main__ as entry

    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    monkeypatch.setattr(entry, "ending", ending)
    monkeypatch.setitem(sys.modules, "weightsmith.cli", types.SimpleNamespace(main=command))
    # Python's own Ctrl-C handler, as a command started from a shell has: a background test run
    # inherits SIGINT ignored, and then `_thread.interrupt_main` (the redelivery) does nothing
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as stopped:
            entry.main()
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped main() and would print a traceback")
    finally:
        signal.signal(signal.SIGINT, before)
    return stopped.value.code


def test_an_interrupt_wrapped_by_a_class_body_is_still_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Python 3.11 wraps what a `__set_name__` raises (cached_property's, mid-import of typer) in a
    RuntimeError; Ctrl-C landing there is answered as any other interrupt, other RuntimeErrors are not."""

    class Interrupting:
        def __set_name__(self, owner: type, name: str) -> None:
            raise KeyboardInterrupt

    def start_up() -> None:
        type("Built", (), {"field": Interrupting()})

    assert _main_exit_code(monkeypatch, start_up) == 130 and capsys.readouterr().err == "interrupted\n"

    def failing() -> None:
        raise RuntimeError("not an interrupt")

    with pytest.raises(RuntimeError, match="not an interrupt"):
        _main_exit_code(monkeypatch, failing)


def test_an_interrupt_as_the_command_ends_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C landing after the command finished, while the process ends (a CI run caught one there
    with a traceback through typer's exit): answered as any other interrupt."""

    def finished() -> None:
        raise SystemExit(0)  # what typer raises when a command returns

    def interrupted_while_ending() -> None:
        raise KeyboardInterrupt

    code = _main_exit_code(monkeypatch, finished, ending=interrupted_while_ending)
    assert code == 130 and capsys.readouterr().err == "interrupted\n"


def test_the_ending_ignores_ctrl_c_from_then_on() -> None:
    """Once the command's work is over an interrupt has nothing left to stop; during interpreter
    shutdown it could only print a traceback. Run in a child, since it changes the process's handler."""
    code = (
        "import os, signal\n"
        "from weightsmith.__main__ import ending\n"
        "ending()\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "print('still here')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "still here\n", "")


def test_an_interrupt_a_library_swallowed_is_delivered_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An interrupt raised where it cannot propagate (pydantic-core's callbacks at start-up; here a
    `__del__`) is written as unraisable: it is raised again instead of printed, and ends the command."""

    class Swallowed:
        def __del__(self) -> None:
            raise KeyboardInterrupt

    finished: list[bool] = []

    def start_up() -> None:
        Swallowed()  # dropped at once: its __del__'s interrupt goes to sys.unraisablehook
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the command going on, as it did after pydantic-core's
            pass
        finished.append(True)

    assert _main_exit_code(monkeypatch, start_up) == 130 and capsys.readouterr().err == "interrupted\n"
    assert not finished, "the command went on to finish after the interrupt"


def test_the_entry_point_imports_only_what_runs_no_python_code() -> None:
    """What `weightsmith/__init__` and `__main__` import runs before `main` can answer Ctrl-C: nothing
    but built-in modules (a `signal` or `typing` import there took 4-8 ms, an interrupt landing in it
    printed a traceback through our file)."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import weightsmith.__main__\n"
        "print(*sorted(set(sys.modules) - before - set(sys.builtin_module_names)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["weightsmith", "weightsmith.__main__"]
