"""Training's folders on any fsspec URL (an object store, or ``file://``): the TrainJob's
staging (:mod:`spanmill.train.trainjob`) and the checkpoints' copy
(:mod:`spanmill.train.mirror`), and the name a run keeps across its tries."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

log = logging.getLogger(__name__)


def run_digest(output_dir: Path, key: str = "") -> str:
    """A hash naming a run across its tries: of ``key`` (a pipeline's run id and task
    name, the same for every try), else of the output folder."""
    source = key or str(Path(output_dir).resolve())
    return hashlib.sha256(source.encode()).hexdigest()


def open_url(url: str) -> tuple[Any, str]:
    """The filesystem of ``url`` and the folder's path on it (no trailing slash)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    return fs, root.rstrip("/")


def put_file(fs: Any, local: Path, target: str) -> None:
    """Copy one file to ``target``; a local folder (file://) gets its parents made, where
    object stores have no folders to make."""
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem):
        fs.makedirs(str(PurePosixPath(target).parent), exist_ok=True)
    fs.put_file(str(local), target)


def get_files(fs: Any, root: str, relative: Iterable[PurePosixPath], local: Path) -> None:
    """Copy the files at ``relative`` paths under ``root`` into the folder ``local``."""
    for path in relative:
        target = local / Path(*path.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(f"{root}/{path.as_posix()}", str(target))


def remove(url: str) -> None:
    """Remove the folder at ``url`` where there is one; a failure is logged, not raised."""
    fs, root = open_url(url)
    try:
        if fs.exists(root):
            fs.rm(root, recursive=True)
    except OSError as exc:
        log.warning("could not remove %s: %s", url, exc)
