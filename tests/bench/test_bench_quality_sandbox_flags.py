"""The sandbox's namespace flags are one constant: the probe, the run and the docs say the same."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from weightsmith.bench.quality import sandbox


def test_probe_and_run_use_the_one_flag_list(monkeypatch: pytest.MonkeyPatch) -> None:
    probed: list[list[str]] = []

    def fake_probe(argv: list[str], **_: Any) -> subprocess.CompletedProcess[bytes]:
        probed.append(argv)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(sandbox.shutil, "which", lambda _: "/usr/bin/unshare")
    monkeypatch.setattr(sandbox.subprocess, "run", fake_probe)
    sandbox._unshare.cache_clear()
    try:
        assert sandbox._unshare() == "/usr/bin/unshare"
    finally:
        sandbox._unshare.cache_clear()
    flags = list(sandbox.NAMESPACE_FLAGS)
    assert probed[0][1 : 1 + len(flags)] == flags

    ran: list[list[str]] = []
    monkeypatch.setattr(sandbox, "_unshare", lambda: "/usr/bin/unshare")
    monkeypatch.setattr(sandbox, "_run", lambda argv, *_: ran.append(argv) or sandbox.RunOutcome(True, ""))
    sandbox.run_program("pass", sandboxed=True, time_limit_s=1.0)
    assert ran[0][:1] == ["/usr/bin/unshare"] and ran[0][1 : 1 + len(flags)] == flags
    assert f"unshare {' '.join(flags)}" in (sandbox.__doc__ or "")
