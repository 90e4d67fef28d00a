"""Prometheus metrics of the rollout controller, on a registry of its own."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass
class RolloutMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.decisions = Counter(
            "spanmill_rollout_decisions",
            "Decisions taken, by agent and action (canary, advance, promote, rollback, ...).",
            ["agent", "action"],
            registry=r,
        )
        self.challenger_weight = Gauge(
            "spanmill_rollout_challenger_weight_percent",
            "Percent of an agent's traffic the challenger takes.",
            ["agent"],
            registry=r,
        )
        self.champion = Gauge(
            "spanmill_rollout_champion_version", "Version in service, by agent.", ["agent"],
            registry=r,
        )  # fmt: skip
        self.challenger = Gauge(
            "spanmill_rollout_challenger_version",
            "Version in its canary by agent (0: none).",
            ["agent"],
            registry=r,
        )
        self.deploy_seconds = Gauge(
            "spanmill_rollout_deploy_seconds",
            "Time the last deployment took (write, load, smoke check), by agent.",
            ["agent"],
            registry=r,
        )
        self.errors = Counter(
            "spanmill_rollout_reconcile_errors",
            "Reconcile passes that failed, by agent.",
            ["agent"],
            registry=r,
        )
        self.last_reconcile = Gauge(
            "spanmill_rollout_last_reconcile_timestamp_seconds",
            "When the last reconcile pass ended.",
            registry=r,
        )
        self.pass_idle = Gauge(
            "spanmill_rollout_pass_idle_seconds",
            "Seconds since the pass under way last moved on (began, or began an agent's "
            "step); 0 between passes. Over SPANMILL_ROLLOUT_STALL_AFTER_S, /healthz fails.",
            registry=r,
        )
        self.leader = Gauge(
            "spanmill_rollout_leader",
            "1 while this replica leads (holds the Lease, or runs alone) and reconciles; "
            "0 while it stands by.",
            registry=r,
        )
