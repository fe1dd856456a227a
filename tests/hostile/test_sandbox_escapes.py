"""Model-written code trying to get out of the python_tests sandbox, or to pass without passing.

Each hostile program *passes* only if it got away with what it tried; every test asserts it did not
and, where the effect would land outside the program, that nothing arrived there.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pyseccomp
import pytest

from weightsmith.bench.quality import sandbox
from weightsmith.bench.quality.sandbox import run_program
from weightsmith.core.errors import WeightsmithError

pytestmark = pytest.mark.skipif(
    sandbox.unavailable() is not None, reason=f"no sandbox on this machine: {sandbox.unavailable()}"
)


class _Listener:
    """A Unix-socket listener on the host that records whatever a connection sends it."""

    def __init__(self, path: str, family: int = socket.AF_UNIX) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    self.received.append(conn.recv(1024))
                except OSError:
                    self.received.append(b"<connected>")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _send_to(address: str) -> str:
    return (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({address!r})\n"
        "s.sendall(b'run: rm -rf ~')\n"
        "s.close()\n"
    )


def test_a_unix_socket_where_the_sandbox_may_read_is_not_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The listener sits in a folder Landlock lets the program read, so only the socket ban stops it.
    roots = sandbox._readable_roots()
    monkeypatch.setattr(sandbox, "_readable_roots", lambda: [*roots, str(tmp_path)])
    path = str(tmp_path / "host.sock")
    listener = _Listener(path)
    try:
        outcome = run_program(_send_to(path), sandboxed=True, time_limit_s=5)
    finally:
        listener.close()
    assert listener.received == []
    assert not outcome.passed and "PermissionError" in outcome.detail, outcome


def test_an_abstract_unix_socket_on_the_host_is_not_reached() -> None:
    name = f"\0weightsmith-test-{os.getpid()}"
    listener = _Listener(name)
    try:
        outcome = run_program(_send_to(name), sandboxed=True, time_limit_s=5)
    finally:
        listener.close()
    assert listener.received == []
    assert not outcome.passed


@pytest.mark.parametrize(
    "family", ["AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK", "AF_PACKET"], ids=lambda f: f.lower()
)
def test_no_socket_of_any_family_can_be_made(family: str) -> None:
    outcome = run_program(f"import socket\nsocket.socket(socket.{family}, socket.SOCK_DGRAM)\n", sandboxed=True)
    assert not outcome.passed and "PermissionError" in outcome.detail, outcome


def test_no_socket_pair_and_no_io_uring() -> None:
    # io_uring can open sockets without the socket() call a filter sees, so its setup is denied too.
    pair = run_program("import socket\nsocket.socketpair()\n", sandboxed=True)
    assert not pair.passed and "PermissionError" in pair.detail, pair
    ring = run_program(
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "params = ctypes.create_string_buffer(120)\n"
        "fd = libc.syscall(425, 4, params)\n"  # io_uring_setup
        "assert fd >= 0, os.strerror(ctypes.get_errno())\n",
        sandboxed=True,
    )
    assert not ring.passed and "Operation not permitted" in ring.detail, ring


def test_a_system_call_through_the_32_bit_abi_is_killed() -> None:
    # i386's `int 0x80` reaches the kernel's 32-bit table, where `socketcall` would make a socket the
    # 64-bit filter never names: libseccomp's architecture check kills the process instead.
    program = (
        "import ctypes, mmap\n"
        "code = bytes.fromhex('b814000000cd80c3')\n"  # mov eax, 20 (i386 getpid); int 0x80; ret
        "page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "page.write(code)\n"
        "ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()\n"
    )
    outcome = run_program(program, sandboxed=True, time_limit_s=5)
    assert not outcome.passed and outcome.detail.startswith("killed by"), outcome


@pytest.mark.parametrize(
    "forgery",
    [
        "import os\nos._exit(77)",
        "raise SystemExit(77)",
        "import sys\nsys.exit(77)",
        "print(77)\nimport os\nos._exit(0)",
        "print('PASSED')\nprint('77')\nimport os\nos._exit(0)",
    ],
    ids=["os-exit-77", "systemexit-77", "sys-exit-77", "print-77", "print-markers"],
)
def test_a_wrong_answer_cannot_fake_a_pass(forgery: str) -> None:
    # HumanEval/0's shape: a wrong body that tries to end the program as a pass before the checks run.
    program = (
        "def has_close_elements(numbers, threshold):\n"
        f"    {forgery.replace(chr(10), chr(10) + '    ')}\n"
        "\n"
        "def check(candidate):\n"
        "    assert candidate([1.0, 2.8, 3.0], 0.3) is True\n"
        "\n"
        "check(has_close_elements)\n"
    )
    outcome = run_program(program, sandboxed=True, time_limit_s=5)
    assert not outcome.passed, outcome


def test_a_program_that_forks_is_bounded_as_a_whole() -> None:
    # Five children of 300 MiB each stay under the per-process address-space limit, but not under
    # the program's: held at the same time they need 1.5 GiB, and the whole program gets 1 GiB.
    children, size = 5, 300 << 20
    program = (
        "import os, time\n"
        "pids = []\n"
        f"for _ in range({children}):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        f"        block = b'x' * {size}\n"
        "        time.sleep(3)\n"
        "        os._exit(0 if len(block) else 1)\n"
        "    pids.append(pid)\n"
        "codes = [os.waitpid(pid, 0)[1] for pid in pids]\n"
        "assert codes == [0] * len(pids), f'exit codes {codes}'\n"
    )
    outcome = run_program(program, sandboxed=True, time_limit_s=10)
    assert not outcome.passed, outcome
    assert children * size > sandbox.MEMORY_BYTES
    # The kernel's OOM killer ended a child (status 9, SIGKILL), or the program as a whole.
    assert outcome.detail.startswith(("AssertionError: exit codes", "killed by SIGKILL")), outcome


@pytest.fixture
def fresh_probe() -> Iterator[None]:
    """`unavailable` is worked out once a process; a test that changes what it finds starts afresh."""
    sandbox.unavailable.cache_clear()
    yield
    sandbox.unavailable.cache_clear()


def test_without_libseccomp_model_written_code_is_refused(
    monkeypatch: pytest.MonkeyPatch, fresh_probe: None
) -> None:
    def missing() -> bytes:
        raise sandbox.syscall_filter.FilterUnavailable("libseccomp cannot be loaded (not installed)")

    monkeypatch.setattr(sandbox.syscall_filter, "program", missing)
    assert sandbox.unavailable() == "no seccomp filter: libseccomp cannot be loaded (not installed)"
    with pytest.raises(WeightsmithError, match=r"without its sandbox .*no seccomp filter"):
        sandbox.require(False)
    ran = run_program("open('ran', 'w')\n", sandboxed=True)
    assert ran == sandbox.RunOutcome(False, "sandbox unavailable: libseccomp cannot be loaded (not installed)")


def test_a_kernel_that_refuses_the_filter_runs_nothing(monkeypatch: pytest.MonkeyPatch, fresh_probe: None) -> None:
    # A filter the kernel will not load (here, one instruction that is no BPF) stands for a kernel
    # without seccomp: the harness stops before the program, and the probe says the sandbox is missing.
    monkeypatch.setattr(sandbox.syscall_filter, "program", lambda: b"\xff" * 8)
    outcome = run_program("print('the program ran')\n", sandboxed=True)
    assert outcome == sandbox.RunOutcome(False, "sandbox: cannot apply the seccomp filter")
    assert sandbox.unavailable() == "a trivial program fails in the sandbox (sandbox: cannot apply the seccomp filter)"


def test_root_without_a_control_group_runs_nothing(monkeypatch: pytest.MonkeyPatch, fresh_probe: None) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root needs the control group (others run as one process)")
    monkeypatch.setattr(sandbox.cgroups, "_hierarchies", list)
    assert sandbox.unavailable() == (
        "running as root and no memory and pids cgroup can be made to bound the program"
    )
    assert run_program("pass\n", sandboxed=True) == sandbox.RunOutcome(
        False, "sandbox unavailable: no cgroup to bound the program"
    )


_AS_NOBODY = """\
import sys
sys.path[:0] = sys.argv[1:3]
from weightsmith.bench.quality import sandbox
print(sandbox.unavailable())
forks = "import os\\npid = os.fork()\\nif pid == 0:\\n    os._exit(0)\\nos.waitpid(pid, 0)\\n"
print(sandbox.run_program(forks, sandboxed=True))
print(sandbox.run_program("block = b'x' * (100 << 20)\\n", sandboxed=True))
"""


def test_a_user_without_a_control_group_runs_the_program_as_one_process(tmp_path: Path) -> None:
    # Not root, no cgroup can be made: the program may not fork (RLIMIT_NPROC 1), so the address-space
    # limit of its one process bounds it whole. Run as `nobody` with the system's Python 3.
    system_python, setpriv = Path("/usr/bin/python3"), shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None or not system_python.exists():
        pytest.skip("needs root to become nobody, setpriv and the system's python3")
    shared = Path(tempfile.mkdtemp(prefix="weightsmith-nobody-"))  # tmp_path is root's alone
    try:
        shutil.copy(Path(pyseccomp.__file__), shared / "pyseccomp.py")
        (shared / "probe.py").write_text(_AS_NOBODY)
        for path in (shared, *shared.iterdir()):
            path.chmod(0o755)
        src = str(Path(sandbox.__file__).parents[3])
        argv = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", str(system_python)]
        done = subprocess.run(
            [*argv, str(shared / "probe.py"), src, str(shared)], cwd=shared, capture_output=True, text=True, timeout=120
        )
    finally:
        shutil.rmtree(shared)
    lines = done.stdout.splitlines()
    if done.returncode != 0 or lines[:1] != ["None"]:
        pytest.skip(f"no sandbox for nobody here: {done.stdout}{done.stderr}"[:300])
    assert lines[1] == "RunOutcome(passed=False, detail='BlockingIOError: [Errno 11] Resource temporarily unavailable')"
    assert lines[2] == "RunOutcome(passed=True, detail='')"
