"""Base models: a catalog of offline-fetchable models, pulling them, resolving model references."""

from spanmill.models.catalog import CATALOG, CatalogEntry, catalog_names, get_entry
from spanmill.models.pull import (
    DOWNLOADS_DIRNAME,
    MANIFEST_NAME,
    is_complete,
    model_dir,
    pull_model,
    read_manifest,
)
from spanmill.models.resolve import looks_like_hf_id, resolve_model

__all__ = [
    "CATALOG",
    "DOWNLOADS_DIRNAME",
    "MANIFEST_NAME",
    "CatalogEntry",
    "catalog_names",
    "get_entry",
    "is_complete",
    "looks_like_hf_id",
    "model_dir",
    "pull_model",
    "read_manifest",
    "resolve_model",
]
