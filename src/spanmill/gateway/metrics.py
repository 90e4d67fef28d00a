"""Prometheus metrics of the gateway, on a registry of its own (one per app)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass
class GatewayMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            "spanmill_gateway_requests",
            "Chat completion requests by route, version and HTTP status.",
            ["model", "version", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "spanmill_gateway_request_seconds",
            "Time to answer a chat completion, end to end.",
            ["model", "version"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=r,
        )
        self.completion_tokens = Counter(
            "spanmill_gateway_completion_tokens",
            "Completion tokens served.",
            ["model", "version"],
            registry=r,
        )
        self.retries = Counter(
            "spanmill_gateway_upstream_retries",
            "Calls tried again on a fresh connection: the Triton reached first lacked the version, "
            "or the connection broke before an answer.",
            registry=r,
        )
        self.spans_reduced = Counter(
            "spanmill_gateway_spans_reduced",
            "LLM spans over Kafka's record limit sent without their token ids (and, where "
            "still over, their prompt's messages): spanmill.span.reduced names what is left off.",
            registry=r,
        )
        self.spans_emitted = Counter(
            "spanmill_gateway_spans_emitted",
            "Spans delivered to Kafka: calls and feedback.",
            registry=r,
        )
        self.spans_dropped = Counter(
            "spanmill_gateway_spans_dropped",
            "LLM spans lost, by reason: the queue was full, Kafka refused them, the "
            "gateway stopped before Kafka was reached, or the call held a value no span "
            "can carry (unbuildable).",
            ["reason"],
            registry=r,
        )
        self.feedback = Counter(
            "spanmill_gateway_feedback",
            "Feedback items by outcome: accepted (on Kafka), rejected (a bad body, or over the "
            "caller's limits), "
            "unavailable (not taken or not acknowledged: the caller retries).",
            ["outcome"],
            registry=r,
        )
        self.span_queue = Gauge(
            "spanmill_gateway_span_queue_depth", "LLM spans waiting for Kafka.", registry=r
        )
        self.routing_revision = Gauge(
            "spanmill_gateway_routing_revision", "Revision of the routing table in use.", registry=r
        )
