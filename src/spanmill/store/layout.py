"""Where each span lands in the store, and how a file's name says what it holds.

The store is a tree of Parquet files under ``dt=YYYY-MM-DD/hour=HH/`` (UTC, by the
span's start time). The collector writes one file per hour for each batch it takes
from one Kafka partition, named after that batch::

    dt=2024-05-01/hour=13/spanmill.spans.v1-p2-00000000000000004096-00000000000000008191-9f86d081884c7d65.parquet

that is ``<topic>-p<partition>-<first offset>-<last offset>-<fingerprint>.parquet``,
offsets zero-padded to 20 digits so names sort by offset. The fingerprint is a hash
of the batch's first Kafka record: it tells apart two logs that reuse the same
offsets (a topic deleted and created again, a broker that lost its storage), so a
batch of a new log never overwrites a file of an old one.

Next to the data, ``_ledger/<topic>/p<partition>/<first offset>-<fingerprint>.json``
records where each batch ends (see :mod:`spanmill.store.writer` for why).
Readers skip names starting with ``_`` or ``.``, which also hides files that are
still being written.

Compaction (:mod:`spanmill.store.compact`) rewrites an hour's files as one
*generation* of a few large ones, ``compacted-<generation>-<part>-of-<parts>.parquet``,
each holding in its Parquet metadata the names of every file the generation
replaces. A generation counts once all its parts are in the folder; from then on
the files it names are never read, whether they are still there, gone, or written
again by a collector that replays a batch (which gives the same rows).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

LEDGER_DIR: Final = "_ledger"
DEAD_LETTER_DIR: Final = "_dead_letters"
SUFFIX: Final = ".parquet"
_OFFSET_DIGITS: Final = 20
_NAME = re.compile(
    r"^(?P<topic>.+)-p(?P<partition>\d+)-(?P<first>\d{20})-(?P<last>\d{20})"
    r"-(?P<fingerprint>[0-9a-f]{16})\.parquet$"
)
_COMPACTED = re.compile(
    r"^compacted-(?P<generation>[0-9a-f]{16})-(?P<part>\d{4})-of-(?P<parts>\d{4})\.parquet$"
)
COMPACTED_PREFIX: Final = "compacted-"
# Parquet key-value metadata of a compacted part: the names it replaces, and when.
REPLACES_KEY: Final = b"spanmill.replaces"
COMPACTED_AT_KEY: Final = b"spanmill.compacted_at"
_HOUR_DIR = re.compile(r"^dt=(?P<dt>\d{4}-\d{2}-\d{2})$|^hour=(?P<hour>\d{2})$")
_NS_PER_HOUR: Final = 3600 * 10**9


@dataclass(frozen=True, order=True)
class BatchId:
    """One batch of consecutive records of one Kafka partition, as the store names it."""

    topic: str
    partition: int
    first: int
    last: int
    fingerprint: str

    def file_name(self) -> str:
        return (
            f"{self.topic}-p{self.partition}-{self.first:0{_OFFSET_DIGITS}d}-"
            f"{self.last:0{_OFFSET_DIGITS}d}-{self.fingerprint}{SUFFIX}"
        )

    def overlaps(self, other: BatchId) -> bool:
        return (
            self.topic == other.topic
            and self.partition == other.partition
            and self.first <= other.last
            and other.first <= self.last
        )


def parse_file_name(name: str) -> BatchId | None:
    """The batch a data file belongs to; None for a name the collector does not write."""
    match = _NAME.match(name.rsplit("/", 1)[-1])
    if match is None:
        return None
    return BatchId(
        topic=match["topic"],
        partition=int(match["partition"]),
        first=int(match["first"]),
        last=int(match["last"]),
        fingerprint=match["fingerprint"],
    )


@dataclass(frozen=True, order=True)
class PartName:
    """One part of a compacted generation, as its file name says."""

    generation: str
    part: int
    parts: int

    def file_name(self) -> str:
        return f"{COMPACTED_PREFIX}{self.generation}-{self.part:04d}-of-{self.parts:04d}{SUFFIX}"


def parse_part_name(name: str) -> PartName | None:
    """The compacted generation a data file is part of; None for any other name."""
    match = _COMPACTED.match(name.rsplit("/", 1)[-1])
    if match is None:
        return None
    part, parts = int(match["part"]), int(match["parts"])
    if not 0 <= part < parts:
        return None
    return PartName(match["generation"], part, parts)


def encode_replaced(names: Iterable[str]) -> bytes:
    """File names for a part's metadata: sorted, JSON, deflated (they share long prefixes)."""
    return base64.b64encode(zlib.compress(json.dumps(sorted(set(names))).encode(), 6))


def decode_replaced(value: bytes) -> frozenset[str]:
    return frozenset(json.loads(zlib.decompress(base64.b64decode(value))))


def fingerprint(timestamp_ms: int, key: bytes | None, value: bytes | None) -> str:
    """A short hash that tells one Kafka record from any other at the same offset."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(timestamp_ms.to_bytes(8, "big", signed=True))
    for part in (key, value):
        if part is None:
            digest.update(b"\x00")
        else:
            digest.update(b"\x01" + len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


def hour_key(start_time_unix_nano: int) -> int:
    """Hours since the Unix epoch: the partition folder a span's start time falls in."""
    return start_time_unix_nano // _NS_PER_HOUR


def hour_dir(hour: int) -> str:
    moment = datetime.fromtimestamp(hour * 3600, tz=UTC)
    return f"dt={moment:%Y-%m-%d}/hour={moment:%H}"


def hour_of_dir(dt: str, hour: str) -> int:
    moment = datetime.strptime(f"{dt} {hour}", "%Y-%m-%d %H").replace(tzinfo=UTC)
    return int(moment.timestamp()) // 3600


def is_date_dir(name: str) -> str | None:
    match = _HOUR_DIR.match(name)
    return match["dt"] if match else None


def is_hour_dir(name: str) -> str | None:
    match = _HOUR_DIR.match(name)
    return match["hour"] if match else None


def ledger_dir(topic: str, partition: int) -> str:
    return f"{LEDGER_DIR}/{topic}/p{partition}"


def record_name(offset: int, fingerprint_: str) -> str:
    """What names one Kafka record in the store: its offset, then its fingerprint."""
    return f"{offset:0{_OFFSET_DIGITS}d}-{fingerprint_}"


def ledger_name(first: int, fingerprint_: str) -> str:
    return record_name(first, fingerprint_) + ".json"
