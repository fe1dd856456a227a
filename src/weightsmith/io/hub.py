"""A quantize SRC that names a Hugging Face Hub model (`org/name`, `org/name@revision`) instead of a folder.

The id is resolved through `huggingface_hub` to a snapshot folder in the Hub cache, which the checkpoint
reader then opens like any other folder (its files are links into the cache's blob store). Three rules
keep this from surprising anyone:

- A local path wins. Whatever exists under the spelling the user typed is what they meant, so a folder
  `org/name` in the working directory is never shadowed by a Hub repository of the same name.
- The cache is asked first, without the network. A snapshot already on disk is used as it is: a run is
  then reproducible and works on a machine that cannot reach the Hub. Only a repository not in the
  cache is downloaded, and never when `HF_HUB_OFFLINE` is set.
- The cache is a folder like any other, so it is not trusted: the folder returned must be a commit-named
  folder directly inside that repository's `snapshots/` (a `refs/main` holding `../../..` or a snapshot
  that links elsewhere is refused), and a revision can never spell a path.

`huggingface_hub` is imported only when an id is resolved: a local SRC costs no import time, and the
parsing here mirrors its `validate_repo_id` without it. Every failure is one `WeightsmithError` line that
names the id; none of the library's exceptions reach the user as a traceback.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightsmith.core.errors import WeightsmithError

if TYPE_CHECKING:
    from huggingface_hub.utils import tqdm as HubTqdm

#: The files a checkpoint folder is read and rebuilt from: weights and their index, every JSON (config,
#: generation config, tokenizer configs) and the tokenizer's vocabularies, merges and chat template.
#: Everything else a repository may hold (PyTorch `.bin` twins, GGUF and ONNX exports, images) is left
#: on the Hub: a `.bin` copy of the weights alone would double the download.
ALLOW_PATTERNS = (
    "*.safetensors",
    "*.safetensors.index.json",
    "*.json",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
)

#: One part of a repo id, as `huggingface_hub.utils.validate_repo_id` allows it: ASCII letters, digits,
#: `-`, `_` and `.`, at most 96 of them, starting and ending with a letter, digit or `_`.
_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]{0,94}[A-Za-z0-9_])?")
#: A branch, tag or commit: one path component that cannot be `.`, `..` or start with `-` (an option to
#: someone's tool). A slash is refused: the revision is written under the cache's `refs/` as a path.
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
#: How the Hub names a commit, and so each snapshot folder.
_COMMIT = re.compile(r"[0-9a-f]{40}")

_TRUE = frozenset({"1", "ON", "YES", "TRUE"})


@dataclass(frozen=True)
class HubSource:
    """Where a SRC given as a Hub id came from, for the manifest and the card: the commit pins it."""

    repo_id: str
    """`org/name`."""
    revision: str | None
    """The revision as the user asked for it; None: the default branch (`main`)."""
    commit: str
    """The 40-hex commit of the snapshot that was used."""
    path: Path
    """The snapshot folder in the Hub cache."""


def parse_hub_id(text: str) -> tuple[str, str | None] | None:
    """`(repo_id, revision)` when `text` is shaped as a Hub model id, `org/name` or `org/name@revision`;
    None for anything else (the caller then treats it as a path).

    A namespace is required: a bare `name` is far more often a local folder with a typo than a Hub
    model. The shape check is `validate_repo_id`'s, written out so that a local path never imports
    `huggingface_hub`; a revision with a path separator or `..` is refused here, before it could reach
    the cache's `refs/` folder.
    """
    repo_id, at, revision = text.partition("@")
    if at and not _is_revision(revision):
        return None
    namespace, slash, name = repo_id.partition("/")
    if not slash or not _is_part(namespace) or not _is_part(name):
        return None
    return repo_id, revision if at else None


def _is_part(part: str) -> bool:
    return (
        _PART.fullmatch(part) is not None
        and "--" not in part  # the cache folder is `models--org--name`: a `--` would be ambiguous
        and ".." not in part
        and not part.endswith(".git")
    )


def _is_revision(revision: str) -> bool:
    return _REVISION.fullmatch(revision) is not None and ".." not in revision


def resolve_source(src: str | os.PathLike[str], *, progress: bool = False) -> tuple[Path, HubSource | None]:
    """The folder to read a SRC from, and where it came from when it is a Hub snapshot.

    A local path that exists (a file, a folder, or a link, even a broken one) is returned as it is with
    None, and so is an `os.PathLike`, which is always meant as a path. A string that does not exist
    locally and parses as a Hub id is resolved from the Hub cache, or downloaded when it is not cached
    and `HF_HUB_OFFLINE` is not set (progress bars only with `progress`). Anything else comes back as
    `Path(src)` with None: the checkpoint reader reports the missing folder in its own words.
    """
    if isinstance(src, os.PathLike):
        return Path(src), None
    path = Path(src)
    if os.path.lexists(path):
        return path, None
    parsed = parse_hub_id(src)
    if parsed is None:
        return path, None
    repo_id, revision = parsed
    snapshot = _snapshot(src, repo_id, revision, progress=progress)
    return snapshot.path, snapshot


def _hub_cache_dir() -> Path:
    """The Hub cache as `huggingface_hub` would choose it, read from the environment now.

    The library reads these variables once, at its import; reading them at each call lets a caller (or
    a test) that sets `HF_HUB_CACHE` or `HF_HOME` afterwards be obeyed, and the folder is then passed
    to it explicitly.
    """
    env = os.environ
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        home = env.get("HF_HOME") or os.path.join(
            env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
        )
        cache = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def _offline_reason(constants: Any) -> str | None:
    """Why the network must not be used, or None when it may: `HF_HUB_OFFLINE` (or transformers'
    `TRANSFORMERS_OFFLINE`) as set now, or as the library saw it at its import (its sessions then refuse
    every request anyway)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().upper() in _TRUE:
            return f"{name} is set"
    if getattr(constants, "HF_HUB_OFFLINE", False) is True:
        return "HF_HUB_OFFLINE was set when huggingface_hub was imported"
    return None


def _detail(exc: BaseException) -> str:
    """An exception's text as one short line: the library's messages run to paragraphs."""
    text = " ".join(str(exc).split())
    if len(text) > 200:
        text = text[:197] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Never(Exception):
    """Stands in, in an `except`, for an exception class this huggingface_hub release does not have."""


def _snapshot(src: str, repo_id: str, revision: str | None, *, progress: bool) -> HubSource:
    """Resolve a parsed id: the cache first, then (online) a download; each failure one line naming `src`."""
    try:
        import httpx
        import huggingface_hub
        from huggingface_hub import constants, errors
    except ImportError:
        raise WeightsmithError(
            "looks like a Hub model id and is not a local folder, but resolving Hub ids needs "
            "huggingface_hub, which is not installed",
            file=src,
            code="hub.library",
        ) from None

    # newer than some releases the project accepts: absent, nothing raises them
    xet_error: type[Exception] = getattr(errors, "XetDownloadError", _Never)
    incomplete_error: type[Exception] = getattr(errors, "IncompleteSnapshotError", _Never)
    cache = _hub_cache_dir()
    endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    # No token is passed: the library finds the user's own (HF_TOKEN or `hf auth login`) for a private
    # or gated repository.
    common: dict[str, Any] = {"revision": revision, "cache_dir": cache, "allow_patterns": list(ALLOW_PATTERNS)}

    def not_cached(why: str) -> WeightsmithError:
        return WeightsmithError(
            f"not a local folder, and not in the Hub cache at {cache} ({why})", file=src, code="hub.offline"
        )

    def failure(exc: Exception) -> WeightsmithError:
        """One line for whatever the library raised; the order matters (the classes subclass each other)."""
        if isinstance(exc, errors.GatedRepoError):
            return WeightsmithError(
                f"the repository is gated on {endpoint}: accept its terms there and log in (`hf auth login`) "
                f"[{_detail(exc)}]",
                file=src,
                code="hub.gated",
            )
        if isinstance(exc, errors.RevisionNotFoundError):
            return WeightsmithError(
                f"the repository has no revision {revision!r} on {endpoint}", file=src, code="hub.revision"
            )
        if isinstance(exc, errors.RepositoryNotFoundError):
            return WeightsmithError(
                f"no such repository on {endpoint} (or it is private and no token with access was found)",
                file=src,
                code="hub.not-found",
            )
        if isinstance(exc, errors.LocalEntryNotFoundError):
            # raised by a download when the Hub cannot be reached and nothing usable is cached
            cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else None
            reachable = _detail(cause) if cause is not None else "the Hub cannot be reached"
            return not_cached(f"offline: {endpoint} cannot be reached: {reachable}")
        if isinstance(exc, errors.HfHubHTTPError):
            return WeightsmithError(f"the Hub at {endpoint} refused: {_detail(exc)}", file=src, code="hub.http")
        if isinstance(exc, httpx.HTTPError):
            return not_cached(f"offline: {endpoint} cannot be reached: {_detail(exc)}")
        if isinstance(exc, xet_error):
            return WeightsmithError(f"the download failed: {_detail(exc)}", file=src, code="hub.download")
        if isinstance(exc, OSError):
            return WeightsmithError(
                f"the Hub cache at {cache} cannot be read or written: {_detail(exc)}", file=src, code="hub.cache"
            )
        return WeightsmithError(f"cannot be resolved: {_detail(exc)}", file=src, code="hub.error")

    caught = (
        errors.HfHubHTTPError,
        errors.LocalEntryNotFoundError,
        xet_error,
        errors.HFValidationError,
        httpx.HTTPError,
        OSError,
        ValueError,
    )
    folder: str | None = None
    incomplete = ""
    try:
        folder = huggingface_hub.snapshot_download(repo_id, local_files_only=True, **common)
    except incomplete_error:
        incomplete = "a snapshot is cached but misses files"
    except errors.LocalEntryNotFoundError:
        pass
    except caught as exc:
        raise failure(exc) from None

    if folder is None:
        offline = _offline_reason(constants)
        if offline is not None:
            raise not_cached(f"offline: {offline}" + (f"; {incomplete}" if incomplete else ""))
        try:
            folder = huggingface_hub.snapshot_download(
                repo_id, endpoint=endpoint, tqdm_class=None if progress else _quiet_bar(), **common
            )
        except caught as exc:
            raise failure(exc) from None

    return _checked(src, repo_id, revision, Path(folder), cache)


def _quiet_bar() -> type[HubTqdm]:
    """A progress bar class that never draws: the library draws its own unless told otherwise, and a
    quantize run without `progress` writes nothing but its result."""
    from huggingface_hub.utils import tqdm

    class QuietBar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]  # tqdm is untyped

    return QuietBar


def _checked(src: str, repo_id: str, revision: str | None, folder: Path, cache: Path) -> HubSource:
    """The snapshot folder the library returned, refused unless it is a commit-named folder directly
    inside this repository's `snapshots/` once every link is followed.

    The library builds the path from `refs/<revision>`, a file anyone who can write the cache controls;
    a ref holding `../../../elsewhere`, or a snapshot folder that is a link out of the cache, would
    otherwise hand the checkpoint reader a folder of the writer's choosing.
    """
    namespace, _, name = repo_id.partition("/")
    snapshots = cache / f"models--{namespace}--{name}" / "snapshots"
    try:
        real_snapshots = snapshots.resolve(strict=True)
        real = folder.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a link loop on Python 3.11/3.12
        raise WeightsmithError(
            f"the Hub cache's snapshot {folder} cannot be opened: {_detail(exc)}", file=src, code="hub.cache"
        ) from None
    commit = real.name
    if real.parent != real_snapshots or _COMMIT.fullmatch(commit) is None or not real.is_dir():
        raise WeightsmithError(
            f"the Hub cache gave {folder}, which is not a commit's folder inside {snapshots}; "
            "the cache has been tampered with",
            file=src,
            code="hub.cache",
        )
    if revision is not None and _COMMIT.fullmatch(revision) and revision != commit:
        raise WeightsmithError(f"asked for commit {revision}, the Hub cache gave {commit}", file=src, code="hub.cache")
    return HubSource(repo_id=repo_id, revision=revision, commit=commit, path=real)
