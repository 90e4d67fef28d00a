"""Erasure on request: what was asked to be forgotten, and what was.

A request names one subject: a user (the value of the span attribute that carries
user ids, ``enduser.id`` by default), a conversation (``gen_ai.conversation.id``)
or a trace. It is resolved to the traces that hold the subject, since the LLM calls
and tool calls of a user's turn are spans of the same trace without the user's id
on each of them: every span of those traces goes.

The record lives at ``_erasures/<id>.json`` in the store. From the moment it is
written, readers (:class:`~spanmill.store.SpanStore`, so the dataset builder and
the rollout signals) leave its traces out. The next compaction
(:mod:`spanmill.store.compact`) resolves the subject again (spans that arrived
since count too), rewrites every file that holds one of its spans, and marks the
record applied with how many spans it removed; the subject's value is then
replaced by its SHA-256, by which compactions for a while after find the subject's
spans that arrive late. Once that while is over the hash goes too: a SHA-256 of a
user id (an email, a number) is undone by hashing candidates until one matches. The
record keeps what, when, by whom and how many, never the erased content.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, Field

from spanmill import semconv as sc
from spanmill.store.writer import put_file

ERASURE_DIR: Final = "_erasures"
DEFAULT_USER_ID_ATTRIBUTE: Final = "enduser.id"

Subject = Literal["user_id", "conversation_id", "trace_id"]


class Erasure(BaseModel):
    """One erasure request and what came of it."""

    id: str
    subject: Subject
    value: str | None = Field(None, description="The subject's value; None once applied.")
    value_sha256: str | None = Field(
        None,
        description="The value's SHA-256, for late spans; None once they are no longer looked for.",
    )
    attribute: str | None = Field(None, description="The attribute read for a user id.")
    requested_at: datetime
    requested_by: str
    reason: str = ""
    status: Literal["pending", "applied"] = "pending"
    trace_ids: list[str] = Field(default_factory=list)
    spans_erased: int = 0
    applied_at: datetime | None = None
    first_span_at: datetime | None = Field(
        None, description="Start time of the earliest span erased: which datasets may hold it."
    )
    last_span_at: datetime | None = None

    @classmethod
    def request(
        cls,
        subject: Subject,
        value: str,
        *,
        requested_by: str,
        reason: str = "",
        attribute: str = DEFAULT_USER_ID_ATTRIBUTE,
    ) -> Erasure:
        if not value:
            raise ValueError(f"an erasure needs a {subject} to erase")
        if subject == "trace_id":
            value = value.lower()
        return cls(
            id=f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}",
            subject=subject,
            value=value,
            value_sha256=hashlib.sha256(value.encode()).hexdigest(),
            attribute=attribute if subject == "user_id" else None,
            requested_at=datetime.now(UTC),
            requested_by=requested_by,
            reason=reason,
        )

    def applied(self, spans: int, trace_ids: Iterable[str], first: Any, last: Any) -> Erasure:
        """This record once compaction has removed its spans: the value is forgotten."""
        return self.model_copy(
            update={
                "status": "applied",
                "value": None,
                "trace_ids": sorted(set(self.trace_ids) | set(trace_ids)),
                "spans_erased": self.spans_erased + spans,
                "applied_at": datetime.now(UTC),
                "first_span_at": earliest(self.first_span_at, first),
                "last_span_at": latest(self.last_span_at, last),
            }
        )

    def without_hash(self) -> Erasure:
        """This record once its subject's late spans are no longer looked for."""
        return self.model_copy(update={"value_sha256": None})

    def hash_sql(self) -> tuple[str, list[Any]]:
        """A DuckDB condition for spans that hold the subject, by its hash alone: what an
        applied record (its value forgotten) still matches, for spans that arrive late."""
        digest = self.value_sha256
        if digest is None:
            raise ValueError(f"erasure {self.id} no longer holds its subject's hash")
        if self.subject == "trace_id":
            return "sha256(trace_id) = ?", [digest]
        if self.subject == "conversation_id":
            path = json_path(sc.GEN_AI_CONVERSATION_ID)
            return (
                "(sha256(conversation_id) = ? OR sha256(json_extract_string(attributes, ?)) = ?)",
                [digest, path, digest],
            )
        path = json_path(self.attribute or DEFAULT_USER_ID_ATTRIBUTE)
        return (
            "(sha256(json_extract_string(attributes, ?)) = ? "
            "OR sha256(json_extract_string(resource_attributes, ?)) = ?)",
            [path, digest, path, digest],
        )

    def match_sql(self) -> tuple[str, list[Any]]:
        """A DuckDB condition on the ``spans`` view for spans that hold the subject."""
        if self.value is None:
            raise ValueError(f"erasure {self.id} is applied: its value is forgotten")
        if self.subject == "trace_id":
            return "trace_id = ?", [self.value]
        if self.subject == "conversation_id":
            # The column holds string ids; one sent as a number stays in the attributes.
            path = json_path(sc.GEN_AI_CONVERSATION_ID)
            return (
                "(conversation_id = ? OR json_extract_string(attributes, ?) = ?)",
                [self.value, path, self.value],
            )
        path = json_path(self.attribute or DEFAULT_USER_ID_ATTRIBUTE)
        return (
            "(json_extract_string(attributes, ?) = ? "
            "OR json_extract_string(resource_attributes, ?) = ?)",
            [path, self.value, path, self.value],
        )


def json_path(key: str) -> str:
    """A JSON path to one top-level key, dots and quotes in it included."""
    return "$." + json.dumps(key)


def earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    return min((x for x in (a, b) if x is not None), default=None)


def latest(a: datetime | None, b: datetime | None) -> datetime | None:
    return max((x for x in (a, b) if x is not None), default=None)


def record_path(root: str, erasure_id: str) -> str:
    return f"{root}/{ERASURE_DIR}/{erasure_id}.json" if root else f"{ERASURE_DIR}/{erasure_id}.json"


def write_erasure(fs: Any, root: str, erasure: Erasure) -> str:
    """Write (or replace) a record whole; returns its path."""
    path = record_path(root, erasure.id)
    put_file(fs, path, erasure.model_dump_json(indent=2).encode())
    return path


def read_erasures(fs: Any, root: str) -> list[Erasure]:
    """Every erasure record of a store, oldest first.

    Every read of the store reads them all, and they accumulate for as long as the store
    lives: fetched as one batch (an object store's filesystem sends the GETs at once),
    not one after another (thousands of round trips a read after a few years of requests).
    A record removed between the listing and the fetch is not there.
    """
    folder = f"{root}/{ERASURE_DIR}" if root else ERASURE_DIR
    try:
        names = sorted(fs.ls(folder, detail=False))
    except FileNotFoundError:
        return []
    paths = [
        name
        for name in names
        if name.endswith(".json") and not name.rsplit("/", 1)[-1].startswith(".")
    ]
    if not paths:
        return []
    fetched = fs.cat(paths, on_error="return")
    found = []
    for path in sorted(fetched):
        content = fetched[path]
        if isinstance(content, FileNotFoundError):
            continue
        if isinstance(content, BaseException):
            raise content
        found.append(Erasure.model_validate_json(content))
    return found
