"""GGUF models named on the Hugging Face hub: `hf://OWNER/REPO/FILE.gguf`, `hf://OWNER/REPO:QUANT`.

Downloads go into `huggingface_hub`'s cache (the `hub` extra), with what it brings: `HF_TOKEN`
for gated repositories, `HF_ENDPOINT` for a mirror, `HF_HUB_OFFLINE=1` for the cache alone,
`HF_HUB_CACHE` / `HF_HOME` for the cache's place (all read when called, not when imported).
huggingface_hub 2.x deletes a partial download when it fails, so an LFS file served over plain
HTTP is fetched here into its blob through a `.partial` file that the next pull resumes with a
`Range` request (`_fetch_blob`), and huggingface_hub links it into the snapshot; a file the hub
serves through Xet is fetched by huggingface_hub itself (Xet's own chunk store).

Each file is checked against the hub's LFS sha256 (the listing's `lfs.oid`; offline, the cache's
blob name, which is that sha256); a verified file gets a marker in hybridllm's cache, so later
opens do not hash it again.

`:QUANT` picks the repository's GGUF whose name carries the quantization (`Q4_K_M`, `IQ4_XS`,
...), case-insensitively; a model split in shards (`-00001-of-00003.gguf`) is fetched whole and
named by its first shard. Nothing here runs at import or at request time: only when an engine
opens or `hybridllm models pull` runs.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridllm.errors import (
    HubError,
    InvalidArgumentError,
    MissingExtraError,
    ModelCorruptError,
    ModelTooLargeError,
)
from hybridllm.local import models
from hybridllm.local.fingerprint import sha256_file
from hybridllm.local.gguf import read_header

SCHEME = "hf://"
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REF_RE = re.compile(
    rf"^hf://(?P<repo>{_PART}/{_PART})(?:@(?P<rev>[A-Za-z0-9._/-]+?))?"
    rf"(?:/(?P<file>[^:@]+)|:(?P<quant>[A-Za-z0-9_]+))$"
)
_SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20
RULE = "hf://OWNER/REPO/FILE.gguf or hf://OWNER/REPO:QUANT (e.g. hf://Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M)"


@dataclass(frozen=True)
class HubRef:
    """A parsed `hf://` name: the repository, a revision, and a file or a quantization."""

    text: str
    repo: str
    revision: str
    filename: str | None
    quant: str | None


@dataclass(frozen=True)
class HubFile:
    path: str  # in the repository
    size: int
    sha256: str | None  # the LFS object id; None for a file not in LFS


@dataclass(frozen=True)
class CachedModel:
    """A GGUF file in the hub cache: `ref` names it, `path` is its snapshot path."""

    ref: str
    path: Path
    size: int


def is_hub_ref(model: object) -> bool:
    return isinstance(model, str) and model.startswith(SCHEME)


def parse(ref: str) -> HubRef:
    """`ref` parsed; `InvalidArgumentError` ("model") where it is not one of the two forms."""
    m = _REF_RE.match(ref)
    if m is None or (m["file"] and (".." in m["file"].split("/") or m["file"].endswith("/"))):
        raise InvalidArgumentError("model", ref, RULE)
    return HubRef(ref, m["repo"], m["rev"] or "main", m["file"], m["quant"])


# --- the environment, read when called -----------------------------------------------------


def hub_cache_dir() -> Path:
    """huggingface_hub's cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
    ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home).expanduser() / "hub"


def in_hub_cache(path: Path) -> bool:
    """Whether `path` is a file of the hub's cache."""
    try:
        return path.absolute().is_relative_to(hub_cache_dir().absolute())
    except OSError:
        return False


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _endpoint() -> str | None:
    return (os.environ.get("HF_ENDPOINT") or "").rstrip("/") or None


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None  # None: huggingface_hub's stored login, if any


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise MissingExtraError("a model named hf://...", "hub", "huggingface_hub") from None
    return huggingface_hub


# --- fetching ------------------------------------------------------------------------------


def fetch(
    text: str, *, progress: models.Progress | None = None, max_bytes: int | None = None
) -> Path:
    """The local path of the model `text` names, downloaded (or resumed) if it is not cached,
    and checked against the hub's sha256. `HubError` with its reason where it cannot be had;
    `ModelTooLargeError`, before any download, where its files alone pass `max_bytes` (the
    free memory: the weights could never load)."""
    ref = parse(text)
    with _mapped(ref):
        if offline():
            return _from_cache(ref)
        files = choose(ref, _listing(ref))
        _weights_fit(ref, files, max_bytes)
        paths = [_download(ref, f, progress) for f in files]
    return paths[0]


def _weights_fit(ref: HubRef, files: list[HubFile], max_bytes: int | None) -> None:
    size = sum(f.size for f in files)
    if max_bytes is None or size <= max_bytes or cached(ref.text) is not None:
        return
    gib = 1 << 30
    raise ModelTooLargeError(
        f"{ref.text}: its weights alone are {size / gib:.2f} GiB and {max_bytes / gib:.2f} GiB "
        "is free: not downloaded; choose a smaller quantization or model",
        path=_repo_dir(ref.repo),
        need_bytes=size,
        available_bytes=max_bytes,
        weights_bytes=size,
        kv_bytes=0,
        n_ctx=0,
    )


def cached(text: str) -> Path | None:
    """The verified cached file of `text`, without the network (None: not cached)."""
    ref = parse(text)
    with contextlib.suppress(HubError, MissingExtraError):
        with _mapped(ref):
            return _from_cache(ref)
    return None


def _listing(ref: HubRef) -> list[HubFile]:
    api = _hub().HfApi(endpoint=_endpoint(), token=_token())
    entries = api.list_repo_tree(ref.repo, revision=ref.revision, recursive=True)
    return [
        HubFile(e.path, int(e.size), e.lfs.sha256 if getattr(e, "lfs", None) else None)
        for e in entries
        if hasattr(e, "size")
    ]


def choose(ref: HubRef, files: list[HubFile]) -> list[HubFile]:
    """The files to fetch: the named one (with its sibling shards), or the quantization's."""
    if ref.filename is not None:
        if not ref.filename.lower().endswith(".gguf"):
            raise HubError("not a GGUF file: name a .gguf file", ref=ref.text, reason="not_gguf")
        named = [f for f in files if f.path == ref.filename]
        if not named:
            raise HubError(
                f"{ref.repo} has no file {ref.filename!r} (its GGUF files: {_names(files)})",
                ref=ref.text,
                reason="file_not_found",
            )
        return _with_shards(named[0], files)
    groups = _quant_groups(ref.quant or "", files)
    if not groups:
        raise HubError(
            f"{ref.repo} has no GGUF file of quantization {ref.quant} (its GGUF files: "
            f"{_names(files)}): name one as hf://{ref.repo}/FILE.gguf",
            ref=ref.text,
            reason="file_not_found",
        )
    if len(groups) > 1:
        raise HubError(
            f"several GGUF files of {ref.quant} in {ref.repo}: "
            f"{', '.join(sorted(g[0].path for g in groups))}: name one as hf://{ref.repo}/FILE.gguf",
            ref=ref.text,
            reason="ambiguous",
        )
    return groups[0]


def _ggufs(files: list[HubFile]) -> list[HubFile]:
    return [
        f
        for f in files
        if f.path.lower().endswith(".gguf") and not Path(f.path).name.startswith("mmproj")
    ]


def _names(files: list[HubFile]) -> str:
    names = [f.path for f in _ggufs(files)]
    return ", ".join(sorted(names)[:12]) + (" ..." if len(names) > 12 else "") or "none"


def _quant_groups(quant: str, files: list[HubFile]) -> list[list[HubFile]]:
    """The matching GGUF files, one group per model (a split model's shards in one group)."""
    pattern = re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)
    groups: dict[str, list[HubFile]] = {}
    for f in _ggufs(files):
        if pattern.search(Path(f.path).name):
            groups.setdefault(_SHARD_RE.sub("", f.path), []).append(f)
    return [sorted(g, key=lambda f: f.path) for g in groups.values()]


def _with_shards(first: HubFile, files: list[HubFile]) -> list[HubFile]:
    m = _SHARD_RE.search(first.path)
    if m is None:
        return [first]
    stem = first.path[: m.start()]
    shards = [f for f in files if f.path.startswith(stem) and _SHARD_RE.search(f.path)]
    return sorted(shards, key=lambda f: f.path)


def _download(ref: HubRef, file: HubFile, progress: models.Progress | None) -> Path:
    """The file into the hub cache: an LFS file served over plain HTTP is fetched into its blob
    by `_fetch_blob` (resumable across runs); huggingface_hub then links it into the snapshot,
    or, for a file it fetches through Xet, downloads it itself."""
    hub = _hub()
    if file.sha256 is not None and not _through_xet(ref, file):
        _fetch_blob(ref, file, _repo_dir(ref.repo) / "blobs" / file.sha256, progress)
    path = Path(
        hub.hf_hub_download(
            ref.repo,
            file.path,
            revision=ref.revision,
            cache_dir=hub_cache_dir(),
            endpoint=_endpoint(),
            token=_token(),
            tqdm_class=_reporter(progress) if progress is not None else None,
        )
    )
    _verify(ref, path, file.sha256)
    return path


def _url(ref: HubRef, file: HubFile) -> str:
    return str(_hub().hf_hub_url(ref.repo, file.path, revision=ref.revision, endpoint=_endpoint()))


def _through_xet(ref: HubRef, file: HubFile) -> bool:
    """Whether huggingface_hub would fetch the file through Xet (its own chunk store), which it
    does where the hub says the file is in Xet storage and `hf_xet` is installed."""
    hub = _hub()
    disabled = os.environ.get("HF_HUB_DISABLE_XET", "").strip().lower() in ("1", "true", "yes")
    if disabled or importlib.util.find_spec("hf_xet") is None:
        return False
    meta = hub.get_hf_file_metadata(_url(ref, file), token=_token(), endpoint=_endpoint())
    return meta.xet_file_data is not None


def _fetch_blob(
    ref: HubRef, file: HubFile, blob: Path, progress: models.Progress | None, attempts: int = 4
) -> None:
    """The LFS file into `blob` (huggingface_hub's cache layout: `blobs/<sha256>`), through
    `<blob>.partial`, which a later pull resumes with a `Range` request where this one broke
    off (huggingface_hub 2.x deletes its own partial file on any failure). A dropped
    connection is resumed at once, `attempts` times while bytes keep coming. The bytes are
    checked against the sha256 before the blob is named."""
    if blob.is_file():
        return
    blob.parent.mkdir(parents=True, exist_ok=True)
    partial = blob.with_name(blob.name + ".partial")
    locks = hub_cache_dir() / ".locks" / blob.parent.parent.name  # where huggingface_hub's are
    locks.mkdir(parents=True, exist_ok=True)
    with models.file_lock(locks / f"{blob.name}.partial.lock"):
        if blob.is_file():  # another process finished it meanwhile
            return
        for attempt in range(attempts):
            before = partial.stat().st_size if partial.exists() else 0
            try:
                _get_range(ref, file, partial, progress)
                break
            except Exception as exc:
                now = partial.stat().st_size if partial.exists() else 0
                if attempt == attempts - 1 or now == before or not _transport_error(exc):
                    raise
        if sha256_file(partial) != file.sha256:
            partial.unlink(missing_ok=True)
            raise HubError(
                f"the downloaded bytes are not the hub's sha256 {file.sha256}: removed; pull "
                "again (a mirror or proxy may be serving other bytes)",
                ref=ref.text,
                reason="checksum",
            )
        os.replace(partial, blob)
        with contextlib.suppress(OSError):  # hashed once: `_verify` trusts the marker
            models.write_marker(blob, file.sha256, marker=_marker(file.sha256))


def _get_range(ref: HubRef, file: HubFile, partial: Path, progress: models.Progress | None) -> None:
    """One GET of what `partial` lacks (all of it where it is empty), appended as it comes."""
    import httpx2

    hf_utils: Any = importlib.import_module("huggingface_hub.utils")
    done = partial.stat().st_size if partial.exists() else 0
    if done > file.size:
        partial.unlink()
        done = 0
    headers = hf_utils.build_hf_headers(token=_token())
    headers["Accept-Encoding"] = "identity"
    if done:
        headers["Range"] = f"bytes={done}-"
    timeout = httpx2.Timeout(30.0, connect=10.0)
    url = _url(ref, file)
    with httpx2.stream(
        "GET", url, headers=headers, follow_redirects=True, timeout=timeout
    ) as response:
        if response.status_code >= 400:
            response.read()
            hf_utils.hf_raise_for_status(response)
        if done and response.status_code != 206:  # the server sent it all again
            done = 0
        with partial.open("ab" if done else "wb") as fh:
            if progress is not None:
                progress("download", done, file.size)
            for chunk in response.iter_bytes(_CHUNK):
                fh.write(chunk)
                done += len(chunk)
                if progress is not None:
                    progress("download", done, file.size)
    if done != file.size:
        raise HubError(
            f"the hub sent {done} of {file.size} bytes; pull again: it resumes",
            ref=ref.text,
            reason="network",
        )


def _transport_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("httpx2", "httpx", "httpcore")


def _verify(ref: HubRef, path: Path, sha256: str | None) -> None:
    """The file's bytes are the hub's (else it is removed: `HubError` "checksum") and a GGUF
    (else `HubError` "not_gguf")."""
    blob = path.resolve()
    expected = sha256 or (blob.name if _SHA_RE.match(blob.name) else None)
    marker = _marker(expected) if expected else None
    if expected and marker and not models.marker_ok(blob, expected, marker=marker):
        actual = sha256_file(blob)
        if actual != expected:
            _remove(path, blob)
            raise HubError(
                f"the downloaded file's sha256 is {actual}, the hub's {expected}: it was "
                "removed; pull it again (a mirror or proxy may be serving other bytes)",
                ref=ref.text,
                reason="checksum",
            )
        with contextlib.suppress(OSError):
            models.write_marker(blob, expected, marker=marker)
    try:
        read_header(blob)
    except ModelCorruptError as exc:
        if exc.reason == "bad_magic":
            raise HubError(
                f"{path.name} is not a GGUF model", ref=ref.text, reason="not_gguf"
            ) from None
        raise


def _marker(sha256: str) -> Path:
    directory = models.cache_dir() / "hub-verified"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{sha256}.sha256"


def _remove(link: Path, blob: Path) -> None:
    for p in (link, blob):
        with contextlib.suppress(OSError):
            p.unlink()


def _repo_dir(repo: str) -> Path:
    return hub_cache_dir() / f"models--{repo.replace('/', '--')}"


def _from_cache(ref: HubRef) -> Path:
    """The cached file(s) of `ref` (the revision's snapshot), verified; `HubError`
    "offline_missing" where the cache lacks them."""
    repo_dir = _repo_dir(ref.repo)
    revision = ref.revision
    with contextlib.suppress(OSError):
        revision = (repo_dir / "refs" / ref.revision).read_text().strip()
    snapshot = repo_dir / "snapshots" / revision
    files = [HubFile(str(p.relative_to(snapshot)), p.stat().st_size, None) for p in _walk(snapshot)]
    try:
        chosen = choose(ref, files)
    except HubError as exc:
        raise HubError(
            f"not in the cache {hub_cache_dir()} ({exc}); pull it while online: "
            f"hybridllm models pull {ref.text}",
            ref=ref.text,
            reason="offline_missing",
        ) from None
    for f in chosen:
        _verify(ref, snapshot / f.path, None)
    return snapshot / chosen[0].path


def _walk(directory: Path) -> Iterator[Path]:
    if directory.is_dir():
        yield from (p for p in directory.rglob("*") if p.is_file())


def list_cached() -> list[CachedModel]:
    """Every GGUF file in the hub cache, by repository, with its `hf://` name."""
    out: list[CachedModel] = []
    root = hub_cache_dir()
    for repo_dir in sorted(root.glob("models--*")) if root.is_dir() else []:
        repo = repo_dir.name.removeprefix("models--").replace("--", "/", 1)
        for snapshot in sorted((repo_dir / "snapshots").glob("*")):
            for p in sorted(_walk(snapshot)):
                if p.name.lower().endswith(".gguf"):
                    rel = p.relative_to(snapshot).as_posix()
                    out.append(CachedModel(f"{SCHEME}{repo}/{rel}", p, p.stat().st_size))
    return out


# --- errors and progress -------------------------------------------------------------------


@contextlib.contextmanager
def _mapped(ref: HubRef) -> Iterator[None]:
    """huggingface_hub's errors (and the network's) as `HubError`s with a reason."""
    _hub()
    from huggingface_hub import errors

    try:
        yield
    except errors.GatedRepoError:
        raise HubError(
            f"{ref.repo} is gated: accept its terms on the hub, then set HF_TOKEN to a token "
            "of that account (or run `hf auth login`)",
            ref=ref.text,
            reason="gated",
        ) from None
    except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError):
        raise HubError(
            f"no repository {ref.repo} (revision {ref.revision}) on {_endpoint() or 'the hub'}; "
            "check the name (a private one needs HF_TOKEN)",
            ref=ref.text,
            reason="repo_not_found",
        ) from None
    except errors.LocalEntryNotFoundError as exc:  # online: the hub did not answer
        raise HubError(
            f"the hub could not be reached ({exc}); run the pull again",
            ref=ref.text,
            reason="network",
        ) from exc
    except errors.EntryNotFoundError:
        raise HubError(
            f"{ref.repo} has no such file", ref=ref.text, reason="file_not_found"
        ) from None
    except (errors.HfHubHTTPError, errors.OfflineModeIsEnabled, OSError) as exc:
        raise HubError(
            f"the hub could not be reached or broke off ({exc}); run the pull again: a "
            "partial download resumes",
            ref=ref.text,
            reason="network",
        ) from exc
    except Exception as exc:  # httpx2's transport errors are not OSErrors
        if _transport_error(exc):
            raise HubError(
                f"the hub could not be reached ({exc}); run the pull again",
                ref=ref.text,
                reason="network",
            ) from exc
        raise


def _reporter(progress: models.Progress) -> type:
    """A tqdm class for huggingface_hub that reports bytes to `progress` and draws nothing."""
    from tqdm import tqdm  # type: ignore[import-untyped]

    class Report(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            kwargs.pop("name", None)
            super().__init__(*args, **kwargs)
            self._done = int(kwargs.get("initial") or 0)
            self._of = int(kwargs.get("total") or 0)
            progress("download", self._done, self._of)

        def update(self, n: float | None = 1) -> bool | None:
            self._done += int(n or 0)
            progress("download", self._done, self._of)
            return None

    return Report
