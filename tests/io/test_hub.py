"""A SRC given as a Hub id: parsed without huggingface_hub, resolved from a Hub cache laid out by hand
(checked first with the library's own cache readers), downloaded from a stand-in for the Hub API served
on localhost, and refused in one line when offline, unknown or tampered with. Nothing reaches the network.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from safetensors.numpy import load_file, save

from weightsmith.core.errors import WeightsmithError
from weightsmith.io.hub import HubSource, parse_hub_id, resolve_source

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def closed_port() -> int:
    """A localhost port nothing listens on: a request there is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hub cache of the test's own, online, with the endpoint on a closed localhost port so that a
    request the test did not mean to make fails instead of reaching huggingface.co. Returns the cache."""
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    constants = pytest.importorskip("huggingface_hub.constants")
    # read at the library's import: an offline setting from the shell running the tests must not leak in
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return cache


def checkpoint_files() -> dict[str, bytes]:
    """A tiny real checkpoint: a config and one safetensors file."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4}
    tensors = {"model.embed_tokens.weight": np.arange(8, dtype=np.float32).reshape(2, 4)}
    return {
        "config.json": json.dumps(config).encode(),
        "model.safetensors": save(tensors),
    }


def git_blob_id(data: bytes) -> str:
    """The id git gives a blob, which the Hub uses as a small file's ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def blob_name(name: str, data: bytes) -> str:
    """The cache's name for a file's blob: the sha256 of an LFS file (weights), the git id of the rest."""
    return hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_blob_id(data)


def lay_out_repo(cache: Path, repo_id: str, commit: str, files: dict[str, bytes], refs: dict[str, str]) -> Path:
    """The cache layout huggingface_hub writes, by hand: `blobs/<id>`, `snapshots/<commit>/<file>` as
    relative links to the blobs, `refs/<branch>` holding the commit. Returns the snapshot folder."""
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (storage / "blobs").mkdir()
    for name, data in files.items():
        blob = storage / "blobs" / blob_name(name, data)
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    (storage / "refs").mkdir()
    for ref, target in refs.items():
        (storage / "refs" / ref).write_text(target)  # no newline, as the library writes it
    return snapshot


# --- parsing ---------------------------------------------------------------------------------------

ACCEPTED = {
    "org/name": ("org/name", None),
    "org/name@main": ("org/name", "main"),
    "org/name@v1.0": ("org/name", "v1.0"),
    f"org/name@{COMMIT}": ("org/name", COMMIT),
    "HuggingFaceTB/SmolLM2-135M-Instruct": ("HuggingFaceTB/SmolLM2-135M-Instruct", None),
    "meta-llama/Llama-3.1-8B@release_2": ("meta-llama/Llama-3.1-8B", "release_2"),
    "a/b": ("a/b", None),
    "_x/y_": ("_x/y_", None),
}
REFUSED = [
    "",
    "name",  # no namespace: a local folder with a typo, far more likely
    "./x",
    "/abs/path",
    "../org/name",
    "a/b/c",
    "org/",
    "/name",
    "org//name",
    "org/..",
    "../name",
    "org/.",
    "org/name@",
    "org/name@../x",
    "org/name@a/b",
    "org/name@..",
    "org/name@.hidden",
    "org/name@-rf",
    "org/name@a\\b",
    "org/name@x@y",
    "@main",
    "org/-name",
    "org/name-",
    "org/.name",
    "org/name.",
    "org/na--me",
    "org/na..me",
    "org/name.git",
    "org/na me",
    "org/café",
    "~/models/x",
    "C:\\models\\x",
    "org/name\n",
    "o" * 97 + "/name",
    "org/" + "n" * 97,
]


@pytest.mark.parametrize(("text", "expected"), ACCEPTED.items())
def test_parse_hub_id_accepts(text: str, expected: tuple[str, str | None]) -> None:
    assert parse_hub_id(text) == expected


@pytest.mark.parametrize("text", REFUSED)
def test_parse_hub_id_refuses(text: str) -> None:
    assert parse_hub_id(text) is None


def test_parse_hub_id_agrees_with_validate_repo_id() -> None:
    """Every repo id accepted here is one the library accepts too (the check is a copy of its rules)."""
    hub_utils = pytest.importorskip("huggingface_hub.utils")
    for text in [*ACCEPTED, *REFUSED]:
        parsed = parse_hub_id(text)
        if parsed is not None:
            hub_utils.validate_repo_id(parsed[0])
    for repo_id in ("org/-name", "org/na--me", "org/na..me", "org/name.git", "org/café", "a/b/c"):
        with pytest.raises(hub_utils.HFValidationError):
            hub_utils.validate_repo_id(repo_id)


# --- local paths win --------------------------------------------------------------------------------


def test_local_folder_wins_over_hub_id(hub_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder `org/name` in the working directory is what the user meant, even with the same id cached."""
    lay_out_repo(hub_env, "org/name", COMMIT, checkpoint_files(), {"main": COMMIT})
    local = tmp_path / "work" / "org" / "name"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work")
    assert resolve_source("org/name") == (Path("org/name"), None)
    # a file, and a link (even a broken one), are local too
    (tmp_path / "work" / "org" / "file").write_text("x")
    assert resolve_source("org/file") == (Path("org/file"), None)
    (tmp_path / "work" / "org" / "gone").symlink_to(tmp_path / "nowhere")
    assert resolve_source("org/gone") == (Path("org/gone"), None)
    # an os.PathLike is always a path, whether or not it exists
    assert resolve_source(Path("org/missing")) == (Path("org/missing"), None)


def test_not_a_hub_id_is_returned_as_a_path(hub_env: Path) -> None:
    for text in ("./missing", "/no/such/folder", "a/b/c", "org/name@../x"):
        assert resolve_source(text) == (Path(text), None)


def test_local_path_does_not_import_huggingface_hub(tmp_path: Path) -> None:
    """A local SRC, or a string that is no Hub id, costs no import of huggingface_hub."""
    code = (
        "import sys; from weightsmith.io.hub import resolve_source; "
        f"resolve_source({str(tmp_path)!r}); resolve_source('./missing'); "
        "print('huggingface_hub' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- the Hub cache ----------------------------------------------------------------------------------


def test_cached_snapshot_resolves(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = pytest.importorskip("huggingface_hub")
    snapshot = lay_out_repo(hub_env, "org/name", COMMIT, checkpoint_files(), {"main": COMMIT, "v1.0": COMMIT})

    # the hand-made layout is the library's: its own readers see the repo, the revision and a file
    info = hub.scan_cache_dir(hub_env)
    assert not info.warnings
    (repo,) = info.repos
    assert (repo.repo_id, repo.repo_type) == ("org/name", "model")
    (revision,) = repo.revisions
    assert revision.commit_hash == COMMIT
    assert revision.refs == frozenset({"main", "v1.0"})
    assert {f.file_name for f in revision.files} == {"config.json", "model.safetensors"}
    found = hub.try_to_load_from_cache("org/name", "config.json", cache_dir=hub_env)
    assert isinstance(found, str) and Path(found) == snapshot / "config.json"

    path, source = resolve_source("org/name")
    assert path == snapshot.resolve()
    assert source == HubSource(repo_id="org/name", revision=None, commit=COMMIT, path=snapshot.resolve())
    assert load_file(path / "model.safetensors")["model.embed_tokens.weight"].shape == (2, 4)
    for revision_name in ("main", "v1.0", COMMIT):
        path, source = resolve_source(f"org/name@{revision_name}")
        assert source is not None
        assert (path, source.revision, source.commit) == (snapshot.resolve(), revision_name, COMMIT)

    # the cache is asked first: offline, a cached snapshot still resolves
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_source("org/name")[0] == snapshot.resolve()


def test_offline_and_not_cached_is_one_line(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lay_out_repo(hub_env, "org/name", COMMIT, checkpoint_files(), {"main": COMMIT})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for text in ("org/other", "org/other@v2", "org/name@v2", f"org/name@{OTHER_COMMIT}"):
        with pytest.raises(WeightsmithError) as caught:
            resolve_source(text)
        line = str(caught.value)
        assert caught.value.code == "hub.offline"
        assert line.startswith(f"{text}: not a local folder, and not in the Hub cache at {hub_env}")
        assert "HF_HUB_OFFLINE" in line and "\n" not in line


def test_offline_at_import_is_obeyed(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HUB_OFFLINE set when huggingface_hub was imported (and since unset) still means offline."""
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(WeightsmithError) as caught:
        resolve_source("org/other")
    assert caught.value.code == "hub.offline" and "when huggingface_hub was imported" in str(caught.value)


def test_without_huggingface_hub(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import then raises ImportError
    with pytest.raises(WeightsmithError) as caught:
        resolve_source("org/name")
    assert caught.value.code == "hub.library"
    assert str(caught.value).startswith("org/name: looks like a Hub model id and is not a local folder")
    assert resolve_source("./missing") == (Path("./missing"), None)


def test_unreachable_hub_and_not_cached_is_one_line(hub_env: Path) -> None:
    """Online, but the endpoint refuses connections (a closed localhost port): one line, no traceback."""
    with pytest.raises(WeightsmithError) as caught:
        resolve_source("org/absent@main")
    line = str(caught.value)
    assert caught.value.code == "hub.offline"
    assert line.startswith(f"org/absent@main: not a local folder, and not in the Hub cache at {hub_env}")
    assert "cannot be reached" in line and "\n" not in line


def test_tampered_cache_is_refused(hub_env: Path, tmp_path: Path) -> None:
    """A ref or a snapshot that points out of the repo's `snapshots/` folder is not followed."""
    elsewhere = tmp_path / "elsewhere" / COMMIT
    elsewhere.mkdir(parents=True)
    (elsewhere / "config.json").write_text("{}")

    storage = hub_env / "models--org--escape"
    (storage / "snapshots").mkdir(parents=True)
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(os.path.relpath(elsewhere, storage / "snapshots"))
    with pytest.raises(WeightsmithError) as caught:
        resolve_source("org/escape")
    assert caught.value.code == "hub.cache" and "tampered" in str(caught.value)

    storage = hub_env / "models--org--linked"
    (storage / "snapshots").mkdir(parents=True)
    (storage / "snapshots" / COMMIT).symlink_to(elsewhere)
    with pytest.raises(WeightsmithError) as caught:
        resolve_source(f"org/linked@{COMMIT}")
    assert caught.value.code == "hub.cache"

    storage = hub_env / "models--org--notcommit"
    (storage / "snapshots" / "not-a-commit").mkdir(parents=True)
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text("not-a-commit")
    with pytest.raises(WeightsmithError) as caught:
        resolve_source("org/notcommit")
    assert caught.value.code == "hub.cache"


# --- downloading, from a stand-in for the Hub ---------------------------------------------------------


class HubStandIn(BaseHTTPRequestHandler):
    """A stand-in for the Hub's HTTP API, serving one repository, with just the requests that
    `snapshot_download` makes (huggingface_hub 1.x): the revision's info (`sha`), the commit's file
    tree, and each file's `HEAD` and `GET` under `resolve/`, with the headers the library reads for
    a plain (not Xet) file. An unknown repo or revision is answered as the Hub answers it (404 with
    `X-Error-Code`)."""

    repo_id = "org/served"
    commit = COMMIT
    branches: ClassVar[dict[str, str]] = {"main": COMMIT}
    files: ClassVar[dict[str, bytes]] = {}
    requests: ClassVar[list[str]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.answer(body=True)

    def do_HEAD(self) -> None:
        self.answer(body=False)

    def answer(self, *, body: bool) -> None:
        type(self).requests.append(f"{self.command} {self.path}")
        path = self.path.split("?")[0]
        api = f"/api/models/{self.repo_id}/"
        resolve = f"/{self.repo_id}/resolve/"
        if path.startswith(api + "revision/"):
            revision = path[len(api + "revision/") :]
            if revision not in self.branches and revision != self.commit:
                return self.error(404, "RevisionNotFound")
            sha = self.branches.get(revision, self.commit)
            siblings = [{"rfilename": name} for name in self.files]
            return self.send(200, json.dumps({"id": self.repo_id, "sha": sha, "siblings": siblings}).encode(), body)
        if path == api + f"tree/{self.commit}":
            tree = [
                {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
                for name, data in self.files.items()
            ]
            return self.send(200, json.dumps(tree).encode(), body)
        if path.startswith(resolve + self.commit + "/"):
            name = path[len(resolve + self.commit + "/") :]
            if name not in self.files:
                return self.error(404, "EntryNotFound")
            data = self.files[name]
            headers = {"X-Repo-Commit": self.commit, "ETag": f'"{blob_name(name, data)}"'}
            return self.send(200, data, body, headers)
        if path.startswith("/api/models/") or "/resolve/" in path:
            return self.error(404, "RepoNotFound")
        return self.error(404, None)

    def error(self, status: int, code: str | None) -> None:
        headers = {"X-Error-Code": code} if code else {}
        self.send(status, b'{"error": "not found"}', True, headers)

    def send(self, status: int, data: bytes, body: bool, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if data[:1] in b"[{" else "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)


@pytest.fixture
def stand_in(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[HubStandIn]]:
    """The stand-in Hub on a localhost port, named by HF_ENDPOINT (read by `resolve_source` at each call)."""
    handler = type("Handler", (HubStandIn,), {"files": checkpoint_files(), "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_download_from_stand_in(
    hub_env: Path, stand_in: type[HubStandIn], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    hub = pytest.importorskip("huggingface_hub")
    path, source = resolve_source("org/served")
    assert capfd.readouterr() == ("", "")  # no progress bars unless asked for
    assert source == HubSource(repo_id="org/served", revision=None, commit=COMMIT, path=path)
    assert path == (hub_env / "models--org--served" / "snapshots" / COMMIT).resolve()
    assert json.loads((path / "config.json").read_text())["model_type"] == "llama"
    assert load_file(path / "model.safetensors")["model.embed_tokens.weight"].tolist()[1] == [4, 5, 6, 7]
    assert any(r.startswith("GET /org/served/resolve/") for r in stand_in.requests)

    # the download is an ordinary cache entry: the library's scan sees it, with its ref
    (repo,) = hub.scan_cache_dir(hub_env).repos
    (revision,) = repo.revisions
    assert (repo.repo_id, revision.commit_hash, revision.refs) == ("org/served", COMMIT, frozenset({"main"}))

    # and a second resolve, offline, finds it without a request
    served = len(stand_in.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_source("org/served") == (path, source)
    assert resolve_source(f"org/served@{COMMIT}")[0] == path
    assert len(stand_in.requests) == served

    # a snapshot that lost a file is incomplete (the library's cached tree listing says so): offline that
    # is one line, online the missing file is fetched again
    (path / "config.json").unlink()
    with pytest.raises(WeightsmithError) as caught:
        resolve_source("org/served")
    assert caught.value.code == "hub.offline" and "misses files" in str(caught.value)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert resolve_source("org/served") == (path, source)
    assert (path / "config.json").is_file()


def test_download_unknown_repo_or_revision(hub_env: Path, stand_in: type[HubStandIn]) -> None:
    with pytest.raises(WeightsmithError) as caught:
        resolve_source("org/absent")
    assert caught.value.code == "hub.not-found"
    assert str(caught.value).startswith("org/absent: no such repository on http://127.0.0.1:")

    with pytest.raises(WeightsmithError) as caught:
        resolve_source("org/served@v9")
    assert caught.value.code == "hub.revision"
    assert str(caught.value).startswith("org/served@v9: the repository has no revision 'v9'")
    assert not (hub_env / "models--org--served" / "snapshots").exists()


# --- quantize from a Hub id ---------------------------------------------------------------------------


def test_quantize_takes_a_hub_id_and_records_the_commit(
    hub_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`quantize org/name@main` reads the cached snapshot (its files links into the cache's blobs, as the
    library lays them out); the manifest records the repository, the revision and the commit, and the card
    names them, not the cache's folder."""
    import weightsmith
    from clirun import run
    from synth import llama_tensors, write_checkpoint

    folder = write_checkpoint(tmp_path / "made", llama_tensors())
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    snapshot = lay_out_repo(hub_env, "org/tiny", COMMIT, files, {"main": COMMIT})
    result = weightsmith.quantize(
        weightsmith.QuantizeRequest("org/tiny@main", tmp_path / "lib", scheme="w4a16", group_size=64, workers=1)
    )
    hub = result.manifest.source.hub
    assert hub is not None and (hub.repo_id, hub.revision, hub.commit) == ("org/tiny", "main", COMMIT)
    assert Path(result.manifest.source.path) == snapshot.resolve()
    assert result.manifest.tensors.quantize == 14

    code, out, err = run(capsys, monkeypatch, "quantize", "org/tiny", tmp_path / "cli", "--scheme", "w4a16",
                         "--group-size", "64", "--workers", "1", "--json")  # fmt: skip
    assert code == 0, err
    manifest = json.loads(out)["manifest"]
    assert manifest["source"]["hub"] == {"repo_id": "org/tiny", "revision": None, "commit": COMMIT}
    for name in files:
        if name.endswith(".safetensors"):
            assert (tmp_path / "lib" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes()

    code, _, err = run(capsys, monkeypatch, "card", tmp_path / "lib")
    assert code == 0, err
    card = (tmp_path / "lib" / "README.md").read_text()
    assert "checkpoint at Hub repository `org/tiny`" in card and f"at commit `{COMMIT}`" in card
    assert str(hub_env) not in card
    code, _, err = run(capsys, monkeypatch, "card", tmp_path / "lib", "--check")
    assert code == 0, err

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run(capsys, monkeypatch, "quantize", "org/other", tmp_path / "none")
    assert code == 2 and "org/other" in err and "not in the Hub cache" in " ".join(err.split())
    assert not (tmp_path / "none").exists()
