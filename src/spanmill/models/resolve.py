"""Turn what a user wrote for ``--model`` into something ``from_pretrained`` accepts."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from spanmill.errors import ModelError
from spanmill.models.catalog import CATALOG, catalog_names
from spanmill.models.pull import Progress, exclusive, pull_model
from spanmill.paths import models_dir

# Hub ids start and end with a letter or digit on both sides of the slash and never
# hold ".." or "--"; this keeps "./x" and "../x" out, which are paths by intent.
_HF_ID = re.compile(r"^[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?/[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?$")


def looks_like_hf_id(ref: str) -> bool:
    return bool(_HF_ID.match(ref)) and ".." not in ref and "--" not in ref


def resolve_model(
    ref: str, cache_dir: Path | None = None, *, progress: Progress | None = None
) -> str:
    """Resolve ``ref`` in this order: an object store folder (``s3://bucket/path``,
    downloaded once into ``cache_dir``), an existing local folder or file, a catalog name
    (pulled into ``cache_dir`` if missing), a Hugging Face id ``org/name`` (returned
    unchanged). Anything else raises ModelError.

    On a cluster only the first and the last are the same in every pod; the others
    name one machine's files.
    """
    ref = ref.strip()
    if not ref:
        raise ModelError(f"no model given; use a local folder, an org/name id or one of {_known()}")
    if "://" in ref:
        return str(
            download_model(
                ref, cache_dir if cache_dir is not None else models_dir(), progress=progress
            )
        )
    local = Path(ref).expanduser()
    if local.exists():
        return str(local.resolve())
    if ref in CATALOG:
        return str(
            pull_model(ref, cache_dir if cache_dir is not None else models_dir(), progress=progress)
        )
    if looks_like_hf_id(ref):
        return ref
    raise ModelError(
        f"model {ref!r} is neither an existing path, a catalog name nor an org/name id; "
        f"catalog names: {_known()}"
    )


def _known() -> str:
    return ", ".join(catalog_names())


def download_model(url: str, cache_dir: Path, *, progress: Progress | None = None) -> Path:
    """The model folder at ``url`` (any fsspec URL; S3 credentials, endpoint and region
    from the ``AWS_*`` environment), copied once into ``cache_dir``.

    The copy lands under a temporary name and is renamed when whole, so a process
    killed mid-download leaves nothing that a later call would take for the model.
    Processes sharing ``cache_dir`` (the nodes of one TrainJob on one machine, or pods
    mounting one volume) take turns under a file lock: the first downloads, the others
    find the folder whole and use it.
    """
    import fsspec

    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    target = cache_dir / "remote" / digest
    if (target / "config.json").is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with exclusive(target.parent / f".{digest}.lock", progress or (lambda _message: None)):
            if (target / "config.json").is_file():
                return target
            fs, root = fsspec.core.url_to_fs(url)
            if not fs.exists(f"{root.rstrip('/')}/config.json"):
                raise ModelError(f"{url} holds no config.json: give the folder of a saved model")
            with tempfile.TemporaryDirectory(prefix=f".{digest}-", dir=target.parent) as scratch:
                fs.get(f"{root.rstrip('/')}/", f"{scratch}/model/", recursive=True)
                # Under the lock, a folder without config.json is no model anyone uses.
                shutil.rmtree(target, ignore_errors=True)
                os.replace(f"{scratch}/model", target)
    except ModelError:
        raise
    except Exception as exc:  # credentials, network, missing bucket, unknown protocol
        raise ModelError(f"cannot download model {url}: {type(exc).__name__}: {exc}") from None
    return target
