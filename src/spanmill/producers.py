"""Who wrote a span, and whose spans a dataset (or a canary's reward signal) trusts.

Every write path records its writer in the span's resource, as ``spanmill.producer``:

- the collector's OTLP receiver and its ``/v1/feedback``: the id of the producer key
  presented, over anything the request said; ``anonymous`` where no key is asked;
- the gateway: its own name (``spanmill-gateway``) on the calls it records, which it
  observed itself, and the caller's key id (``anonymous`` when it asks none) on feedback;
- a writer that puts spans on the Kafka topic itself (the SDK's exporter) is admitted by
  the topic's ACLs; a span that names no producer is read as :data:`DIRECT` (``kafka``).

By default every producer but ``anonymous`` is trusted: what came in through an
endpoint that asked for no key is stored and counted, never trained on. A
:class:`Trust` that names producers trusts those alone; ``*`` trusts every span.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from spanmill import semconv as sc
from spanmill.keys import ANONYMOUS

if TYPE_CHECKING:  # the gateway stamps producers and has no pyarrow
    import pyarrow as pa

ANY: Final = "*"
DIRECT: Final = "kafka"
GATEWAY: Final = "spanmill-gateway"


def producer_of(resource_json: str | None) -> str:
    """The producer a stored span's ``resource_attributes`` (JSON or null) names."""
    if not resource_json:
        return DIRECT
    try:
        value = json.loads(resource_json).get(sc.SPANMILL_PRODUCER)
    except (ValueError, AttributeError):
        return DIRECT
    return value if isinstance(value, str) and value else DIRECT


@dataclass(frozen=True)
class Trust:
    """Which producers' spans count. ``producers`` empty: all but ``anonymous``."""

    producers: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str | Iterable[str] | None) -> Trust:
        """From a comma-separated list (or the names themselves); empty: the default."""
        names = text.split(",") if isinstance(text, str) else list(text or ())
        return cls(tuple(sorted({n.strip() for n in names if n.strip()})))

    @property
    def everyone(self) -> bool:
        return ANY in self.producers

    def trusts(self, producer: str) -> bool:
        if self.everyone:
            return True
        if self.producers:
            return producer in self.producers
        return producer != ANONYMOUS

    def mask(self, resource_attributes: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray:
        """True for each row whose producer is trusted. The column holds few distinct
        values (one per service and producer), so each is parsed once."""
        import pyarrow as pa
        import pyarrow.compute as pc

        column = resource_attributes
        if pa.types.is_dictionary(column.type):
            column = pc.cast(column, pa.string())
        if self.everyone:
            return pc.is_valid(pc.fill_null(column, ""))
        distinct = [v for v in pc.unique(column).to_pylist() if v is not None]
        trusted = pa.array([v for v in distinct if self.trusts(producer_of(v))], pa.string())
        return pc.if_else(pc.is_null(column), self.trusts(DIRECT), pc.is_in(column, trusted))

    def sql(self, column: str = "resource_attributes") -> str:
        """The same rule as a DuckDB predicate over the stored JSON ``column``."""
        if self.everyone:
            return "TRUE"
        producer = (
            f"coalesce(nullif(json_extract_string({column}, '$.\"{sc.SPANMILL_PRODUCER}\"'), ''), "
            f"'{DIRECT}')"
        )
        if self.producers:
            names = ", ".join("'" + p.replace("'", "''") + "'" for p in self.producers)
            return f"{producer} IN ({names})"
        return f"{producer} <> '{ANONYMOUS}'"

    def __str__(self) -> str:
        if self.everyone:
            return "every producer"
        if self.producers:
            return "producers " + ", ".join(self.producers)
        return f"every producer but {ANONYMOUS}"
