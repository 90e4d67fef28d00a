"""Version health from the gateway's Prometheus metrics and from the span store."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from prometheus_client import generate_latest

from spanmill import semconv as sc
from spanmill.gateway.metrics import GatewayMetrics
from spanmill.rollout.signals import (
    GatewayMetricsSignals,
    SignalError,
    SpanStoreSignals,
    histogram_quantile,
)
from spanmill.spans import Span
from spanmill.store import BatchId, StoreWriter
from spanmill.store.rows import HourlyColumns, SpanParts


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = {"0.1": 50.0, "0.5": 90.0, "1.0": 100.0, "+Inf": 100.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.75)
    assert histogram_quantile(0.95, {"+Inf": 0.0}) is None
    assert histogram_quantile(0.99, {"0.1": 1.0, "+Inf": 10.0}) == pytest.approx(0.1)


class Gateway:
    """A gateway's metrics endpoint, its counters those of the gateway's own GatewayMetrics;
    :meth:`restart` gives it fresh ones, as a restarted gateway process has."""

    def __init__(self) -> None:
        self.metrics = GatewayMetrics()
        self.app = FastAPI()

        @self.app.get("/metrics")
        async def scrape() -> PlainTextResponse:
            return PlainTextResponse(generate_latest(self.metrics.registry).decode())

    def restart(self) -> None:
        self.metrics = GatewayMetrics()

    def served(self, version: str, status: str, n: int, seconds: float = 0.02) -> None:
        for _ in range(n):
            self.metrics.requests.labels("calc", version, status).inc()
            if status == "200":
                self.metrics.latency.labels("calc", version).observe(seconds)


def test_gateway_metrics_count_only_what_happened_since_the_snapshot(serve_app) -> None:  # type: ignore[no-untyped-def]
    a, b = Gateway(), Gateway()
    for gateway in (a, b):
        gateway.served("1", "200", 40)
        gateway.served("2", "200", 5)
        gateway.served("7", "200", 3)  # a version retired long ago, still counted
    with serve_app(a.app) as url_a, serve_app(b.app) as url_b:
        signals = GatewayMetricsSignals([url_a, url_b, url_a])  # one named twice counts once
        baseline = signals.snapshot("calc", [1, 2])
        # Kept in the controller's state: the canary's versions alone, not every version
        # a gateway served since it started.
        kept = baseline["targets"][url_a]
        assert sorted(kept["requests"]) == ["1", "2"] and sorted(kept["buckets"]) == ["1", "2"]
        for gateway in (a, b):  # two replicas: their counts add up
            gateway.served("2", "200", 10, seconds=0.3)
            gateway.served("2", "502", 2)
            gateway.served("2", "400", 3)  # a client's bad request: not the model's error
            gateway.served("2", "429", 4)  # Triton's queue full: judged on its own
            gateway.metrics.requests.labels("other", "2", "502").inc()  # another route
        health = signals.health("calc", 2, since=0.0, baseline=baseline)
        assert (health.requests, health.errors, health.queue_full) == (2 * 19, 2 * 2, 2 * 4)
        assert (health.answered, health.refused) == (2 * 10, 2 * 3)
        assert health.p95_latency_s is not None and 0.25 < health.p95_latency_s <= 0.5
        # Without a baseline, everything since the gateways started counts.
        assert signals.health("calc", 1, since=0.0, baseline=None).requests == 80
        # A step begun under a controller that summed the gateways keeps its baseline: the
        # sum is compared with it (here as a restart, the sum being lower).
        legacy = {"requests": {"2": {"200": 10_000.0}}, "buckets": {}}
        assert signals.health("calc", 2, since=0.0, baseline=legacy).requests == 2 * 24
    with pytest.raises(SignalError, match="cannot read the gateway's metrics"):
        GatewayMetricsSignals([url_a]).health("calc", 2, since=0.0, baseline=None)


def test_one_gateways_restart_hides_no_other_gateways_errors(serve_app) -> None:  # type: ignore[no-untyped-def]
    """Counters compared per gateway, as Prometheus' increase() does per target: B's
    restart resets B's counters alone, and what A counted meanwhile is all there."""
    a, b = Gateway(), Gateway()
    a.served("2", "200", 30)
    b.served("2", "200", 30)
    b.served("2", "502", 10, seconds=0.2)
    with serve_app(a.app) as url_a, serve_app(b.app) as url_b:
        signals = GatewayMetricsSignals([url_a, url_b])
        baseline = signals.snapshot("calc", [2])
        a.served("2", "502", 12)
        b.restart()
        b.served("2", "502", 3)
        b.served("2", "200", 5, seconds=0.3)
        health = signals.health("calc", 2, since=0.0, baseline=baseline)
        # Summed over both before the difference, the 502s were 15 against 10 before:
        # 5 counted, and the 200s (35 against 60) went negative or were counted whole.
        assert (health.requests, health.errors) == (12 + 3 + 5, 12 + 3)
        assert health.p95_latency_s is not None and 0.25 < health.p95_latency_s <= 0.5
        # A restart is seen in a counter that went down or is gone, whichever it was:
        # B's 200s (5 now, 30 before) and its 502s (3 now, 10 before) both count from 0.
        b.restart()
        b.served("2", "200", 40)
        after = signals.health("calc", 2, since=0.0, baseline=baseline)
        assert (after.requests, after.errors) == (12 + 40, 12)


def test_every_gateway_pod_behind_the_service_is_read(  # type: ignore[no-untyped-def]
    serve_app, kube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's pods from its Service's EndpointSlices at each read (kmock's API):
    two replicas add up, one the autoscaler adds after the step began counts from its
    start, one listed that does not answer is left out of a read while others answer."""
    from urllib.parse import urlsplit

    from kubernetes import client

    from spanmill.rollout.fleet import SERVICE_NAME_LABEL, ServicePods

    discovery = client.DiscoveryV1Api(kube.api_client())

    def list_pod(name: str, url: str, service: str = "gateway") -> None:
        discovery.create_namespaced_endpoint_slice("ns", {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service}-{name}", "labels": {SERVICE_NAME_LABEL: service}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": urlsplit(url).port, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True},
                           "targetRef": {"kind": "Pod", "name": name, "namespace": "ns"}}],
        })  # fmt: skip

    a, b, c = Gateway(), Gateway(), Gateway()
    for gateway in (a, b):
        gateway.served("2", "502", 7)  # before the step: not the step's
    pods = ServicePods("ns", "gateway", api_client=kube.api_client())
    signals = GatewayMetricsSignals(pods=pods)
    list_pod("triton-0", "http://127.0.0.1:8000", service="triton")  # another Service's
    with pytest.raises(SignalError, match="no gateway pod is listed among the pods of Service"):
        signals.snapshot("calc", [2])
    with serve_app(a.app) as url_a, serve_app(b.app) as url_b, serve_app(c.app) as url_c:
        list_pod("gateway-a", url_a)
        list_pod("gateway-b", url_b)
        baseline = signals.snapshot("calc", [2])
        assert sorted(baseline["targets"]) == sorted([url_a, url_b])
        a.served("2", "200", 10)
        b.served("2", "502", 2)
        c.served("2", "200", 5)  # a new replica, listed once it runs
        list_pod("gateway-c", url_c)
        health = signals.health("calc", 2, since=0.0, baseline=baseline)
        assert (health.requests, health.errors) == (10 + 2 + 5, 2)
        # A listed pod that does not answer (starting, going): the others are read.
        silent = Gateway()
        with serve_app(silent.app) as url_gone:
            list_pod("gateway-d", url_gone)
        assert signals.health("calc", 2, since=0.0, baseline=baseline).requests == 17
    with pytest.raises(SignalError, match="no gateway pod answers /metrics"):
        signals.health("calc", 2, since=0.0, baseline=baseline)
    # What the chart sets (SPANMILL_ROLLOUT_GATEWAY_SERVICE) makes these signals.
    from spanmill.config import RolloutSettings
    from spanmill.rollout.service import signals_of

    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "kubeconfig", "ns")))
    made = signals_of(RolloutSettings(signals="gateway", gateway_service="gw", namespace="ns"))
    assert isinstance(made, GatewayMetricsSignals) and made.pods is not None
    assert made.pods.describe() == "the pods of Service ns/gw"


def _call(
    i: int,
    version: str,
    *,
    start: int,
    error: bool = False,
    seconds: float = 0.1,
    training: bool = False,
) -> Span:
    extra = {sc.SPANMILL_TRAFFIC: sc.TRAFFIC_TRAINING} if training else {}
    return Span(
        trace_id=f"{i + 1:032x}",
        span_id=f"{i + 1:016x}",
        name="chat calc",
        kind="client",
        start_time_unix_nano=start,
        end_time_unix_nano=start + int(seconds * 1e9),
        status_code="error" if error else "unset",
        attributes={
            sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
            sc.GEN_AI_REQUEST_MODEL: "calc",
            sc.GEN_AI_AGENT_NAME: "calc",
            sc.SPANMILL_MODEL_VERSION: version,
            sc.GEN_AI_RESPONSE_ID: f"resp-{i}",
            **extra,
        },
        resource_attributes={sc.SERVICE_NAME: "spanmill-gateway"},
    )


def _reward(
    i: int, trace: int, value: float, *, start: int, linked: bool, producer: str | None = None
) -> Span:
    attributes: dict[str, object] = {
        sc.GEN_AI_EVALUATION_NAME: "correct",
        sc.GEN_AI_EVALUATION_SCORE_VALUE: value,
        sc.SPANMILL_REWARD_PRIMARY: True,
    }
    if linked:
        attributes[sc.GEN_AI_RESPONSE_ID] = f"resp-{trace}"
    return Span(
        trace_id=f"{trace + 1:032x}",
        span_id=f"{1000 + i:016x}",
        name="reward",
        start_time_unix_nano=start,
        end_time_unix_nano=start,
        attributes=attributes,
        resource_attributes={sc.SERVICE_NAME: "calc-agent"}
        | ({sc.SPANMILL_PRODUCER: producer} if producer else {}),
    )


def test_span_store_health_joins_rewards_to_the_version_that_answered(tmp_path: Path) -> None:
    now = time.time_ns()
    old = now - 3600 * 10**9
    spans = [_call(0, "2", start=old, error=True)]  # before the window
    spans += [_call(i, "1", start=now + i) for i in range(1, 11)]
    spans += [_call(i, "2", start=now + i, error=i <= 12, seconds=0.1 * (i - 10))
              for i in range(11, 21)]  # fmt: skip
    # Linked rewards for version 2's calls 13..16, an episode reward for call 17, and
    # version 1's rewards, which must not count for version 2.
    spans += [_reward(i, i, 0.5, start=now + 100, linked=True) for i in range(13, 17)]
    spans += [_reward(17, 17, 1.0, start=now + 100, linked=False)]
    spans += [_reward(i, i, 0.0, start=now + 100, linked=True) for i in range(1, 5)]
    # Rewards a keyed producer sent count; those through an endpoint that asked no key do not.
    spans += [_reward(18, 18, 1.0, start=now + 100, linked=True, producer="support-agent")]
    spans += [_reward(i, i, 0.0, start=now + 200, linked=True, producer="anonymous")
              for i in range(11, 21)]  # fmt: skip
    # RL rollouts of a policy numbered 2 too, errors and all: not the served version's health.
    spans += [_call(i, "2", start=now + i, error=True, training=True) for i in range(30, 35)]
    hourly = HourlyColumns()
    for offset, span in enumerate(spans):
        hourly.append(SpanParts.from_span(span), "spans", 0, offset, 0, 1)
    StoreWriter(str(tmp_path)).write_batch(
        BatchId("spans", 0, 0, len(spans) - 1, "00000000000000ab"), hourly.tables()
    )
    signals = SpanStoreSignals(str(tmp_path))
    since = (now - 10**9) / 1e9
    health = signals.health("calc", 2, since=since, baseline=None)
    assert (health.requests, health.errors) == (10, 2)
    assert health.rewards == 6 and health.mean_reward == pytest.approx((4 * 0.5 + 2 * 1.0) / 6)
    assert health.p95_latency_s is not None and 0.9 < health.p95_latency_s <= 1.0
    champion = signals.health("calc", 1, since=since, baseline=None)
    assert (champion.requests, champion.errors, champion.rewards) == (10, 0, 4)
    assert champion.mean_reward == 0.0
    assert signals.health("other", 2, since=since, baseline=None).requests == 0


def test_span_store_health_judges_the_calls_that_ended_in_the_step(tmp_path: Path) -> None:
    """A call's span is stored when it ends: read by start time, a step never saw its
    slow calls (they began before it), and a version failing by timeouts was judged on
    its fast answers alone, and promoted."""
    now = time.time_ns()
    step = now - 60 * 10**9
    slow = [_call(i, "2", start=step - 290 * 10**9, error=True, seconds=300.0)
            for i in range(5)]  # began before the step, timed out in it  # fmt: skip
    fast = [_call(i, "2", start=step + i * 10**9) for i in range(5, 10)]
    gone = [_call(10, "2", start=step - 400 * 10**9, seconds=1.0)]  # ended before the step
    hourly = HourlyColumns()
    for offset, span in enumerate(slow + fast + gone):
        hourly.append(SpanParts.from_span(span), "spans", 0, offset, 0, 1)
    StoreWriter(str(tmp_path)).write_batch(
        BatchId("spans", 0, 0, 10, "00000000000000ad"), hourly.tables()
    )
    health = SpanStoreSignals(str(tmp_path)).health("calc", 2, since=step / 1e9, baseline=None)
    assert (health.requests, health.errors) == (10, 5)


def test_span_store_errors_are_the_models_as_the_gateways_counts_are(tmp_path: Path) -> None:
    """A failed call's span carries the status it was answered with (error.type): a
    client's bad request or departure is not the version's error, a full queue is its
    own signal, a server fault (or a span that names no status) is an error."""
    from spanmill.gateway.llm_span import build_llm_span

    now = time.time_ns()

    def failed(i: int, status: str | None) -> Span:
        return build_llm_span(
            trace_id=f"{i + 1:032x}", parent_span_id=None, span_id=f"{i + 1:016x}",
            start_ns=now + i, end_ns=now + i + 10**6, requested_model="calc",
            triton_model="calc", version="4", response_id=None,
            request_messages=[{"role": "user", "content": "hi"}], params={}, metadata=None,
            error="failed", error_type=status,
        )  # fmt: skip

    statuses = ["400", "499", "429", "429", "502", "500", None]
    spans = [failed(i, status) for i, status in enumerate(statuses)]
    spans += [_call(i, "4", start=now + i) for i in range(10, 13)]
    hourly = HourlyColumns()
    for offset, span in enumerate(spans):
        hourly.append(SpanParts.from_span(span), "spans", 0, offset, 0, 1)
    StoreWriter(str(tmp_path)).write_batch(
        BatchId("spans", 0, 0, len(spans) - 1, "00000000000000ac"), hourly.tables()
    )
    health = SpanStoreSignals(str(tmp_path)).health("calc", 4, since=(now - 10**9) / 1e9,
                                                    baseline=None)  # fmt: skip
    assert (health.requests, health.errors, health.queue_full) == (10, 3, 2)
    # Three answered; the 400 and the 499 neither answered nor the model's error.
    assert (health.answered, health.served, health.refused) == (3, 6, 2)
