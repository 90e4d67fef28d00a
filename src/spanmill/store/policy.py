"""A store's own policy, kept in the store (``_policy.json``) so every reader knows it.

``spanmill store compact`` writes it from its settings (``SPANMILL_STORE_*``, the
chart's ``store.*`` values) at each run; readers refuse a time window that reaches
past the retention period, whose spans the same job deletes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from pydantic import BaseModel, Field

from spanmill.store.erasure import DEFAULT_USER_ID_ATTRIBUTE
from spanmill.store.writer import put_file

POLICY_FILE: Final = "_policy.json"


class StorePolicy(BaseModel):
    retention_days: float | None = Field(
        None, gt=0, description="Hours older than this are deleted; None keeps every span."
    )
    user_id_attribute: str = DEFAULT_USER_ID_ATTRIBUTE

    def horizon(self, now: datetime | None = None) -> datetime | None:
        """The oldest moment whose spans are kept; None when nothing expires."""
        if self.retention_days is None:
            return None
        return (now or datetime.now(UTC)) - timedelta(days=self.retention_days)


def _path(root: str) -> str:
    return f"{root}/{POLICY_FILE}" if root else POLICY_FILE


def read_policy(fs: Any, root: str) -> StorePolicy:
    """The policy a store was given; the default (keep everything) if none was."""
    try:
        return StorePolicy.model_validate_json(fs.cat_file(_path(root)))
    except FileNotFoundError:
        return StorePolicy()


def write_policy(fs: Any, root: str, policy: StorePolicy) -> None:
    if read_policy(fs, root) != policy:
        put_file(fs, _path(root), policy.model_dump_json(indent=2).encode())
