"""Turn what a user wrote for ``--model`` into something ``from_pretrained`` accepts."""

from __future__ import annotations

import re
from pathlib import Path

from spanmill.errors import ModelError
from spanmill.models.catalog import CATALOG, catalog_names
from spanmill.models.pull import Progress, pull_model
from spanmill.paths import models_dir

# Hub ids start and end with a letter or digit on both sides of the slash and never
# hold ".." or "--"; this keeps "./x" and "../x" out, which are paths by intent.
_HF_ID = re.compile(r"^[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?/[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?$")


def looks_like_hf_id(ref: str) -> bool:
    return bool(_HF_ID.match(ref)) and ".." not in ref and "--" not in ref


def resolve_model(
    ref: str, cache_dir: Path | None = None, *, progress: Progress | None = None
) -> str:
    """Resolve ``ref`` in this order: an existing local folder or file, a catalog name
    (pulled into ``cache_dir`` if missing), a Hugging Face id ``org/name`` (returned
    unchanged). Anything else raises ModelError.
    """
    ref = ref.strip()
    if not ref:
        raise ModelError(f"no model given; use a local folder, an org/name id or one of {_known()}")
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
