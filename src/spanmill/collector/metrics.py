"""The collector's Prometheus metrics, on a registry of its own so instances never clash."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class CollectorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.records_consumed = Counter(
            "spanmill_collector_records_consumed",
            "Kafka records taken from the span topic.",
            ["partition"],
            registry=r,
        )
        self.spans_written = Counter(
            "spanmill_collector_spans_written",
            "Spans written durably to the store.",
            registry=r,
        )
        self.files_written = Counter(
            "spanmill_collector_files_written", "Parquet files written to the store.", registry=r
        )
        self.dead_letters = Counter(
            "spanmill_collector_dead_letters",
            "Records sent to the dead-letter topic, by reason.",
            ["reason"],
            registry=r,
        )
        self.dead_letters_stored = Counter(
            "spanmill_collector_dead_letters_stored",
            "Dead letters the dead-letter topic refused, kept in the store's _dead_letters.",
            registry=r,
        )
        self.lag = Gauge(
            "spanmill_collector_lag",
            "Records in the partition not yet consumed (high watermark minus position).",
            ["partition"],
            registry=r,
        )
        self.batch_seconds = Histogram(
            "spanmill_collector_batch_seconds",
            "Time from a batch's first record taken to its offsets committed.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.write_seconds = Histogram(
            "spanmill_collector_write_seconds",
            "Time to decode, redact and durably write one batch.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_records = Histogram(
            "spanmill_collector_batch_records",
            "Records per batch.",
            buckets=(1, 10, 100, 500, 1000, 2500, 5000, 10000, 50000),
            registry=r,
        )
        self.commits_failed = Counter(
            "spanmill_collector_commits_failed",
            "Offset commits that failed (retried, or dropped when the partition moved).",
            registry=r,
        )
        self.redactions = Counter(
            "spanmill_collector_redactions",
            "Values redacted, by rule ('attribute' counts attributes dropped by name).",
            ["rule"],
            registry=r,
        )
        self.translated = Counter(
            "spanmill_collector_translated_spans",
            "Spans translated from a foreign convention, by convention.",
            ["convention"],
            registry=r,
        )
        self.receiver_spans = Counter(
            "spanmill_collector_receiver_spans",
            "Spans received over OTLP/HTTP, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.receiver_requests = Counter(
            "spanmill_collector_receiver_requests",
            "OTLP/HTTP export requests, by HTTP status.",
            ["status"],
            registry=r,
        )
        self.assigned_partitions = Gauge(
            "spanmill_collector_assigned_partitions",
            "Partitions of the span topic this collector owns.",
            registry=r,
        )
