"""How each version is doing: requests, errors, latency p95 and mean reward since a moment.

Two sources, one interface:

* :class:`GatewayMetricsSignals` scrapes the gateways' Prometheus endpoints: the URLs
  it is given, or every pod behind the gateway's Service, found from its
  EndpointSlices at each read (replicas come and go with an autoscaler; a Service's
  one address answers from one pod at a time, whose counters are not another's). The
  counters are cumulative, so a step keeps a snapshot from its start (the rollout
  state persists it) and judges the difference. Immediate, but rewards are not there.
* :class:`SpanStoreSignals` reads the span store: the LLM spans the gateway
  emitted, and the rewards that came back for them (linked by response id, or
  by episode). Sees every replica and the rewards, but only once the collector
  has written them (seconds).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

import httpx

from spanmill.errors import SpanmillError
from spanmill.rollout.fleet import ServicePods, ServiceUnlisted
from spanmill.rollout.schemas import Health

log = logging.getLogger(__name__)

REQUESTS_METRIC = "spanmill_gateway_requests"
LATENCY_METRIC = "spanmill_gateway_request_seconds"
# What the gateway answers when the version's queue in Triton is full.
QUEUE_FULL_STATUS = "429"


class SignalError(SpanmillError):
    """The signal source could not be read."""


class Signals(Protocol):
    def snapshot(self, route: str, versions: Collection[int]) -> dict[str, Any] | None:
        """Whatever :meth:`health` needs later to count only what happened after now, for
        ``versions`` (it is kept in the controller's state: of those alone)."""

    def health(
        self, route: str, version: int, since: float, baseline: Mapping[str, Any] | None
    ) -> Health:
        """The version's health on ``route`` since ``since`` (epoch seconds)."""


# -- gateway metrics -----------------------------------------------------------------


class GatewayMetricsSignals:
    def __init__(
        self, urls: Sequence[str] = (), *, pods: ServicePods | None = None, timeout_s: float = 5.0
    ) -> None:
        """``urls``: every gateway; or ``pods``: the gateway's Service, whose pods are
        listed at each read."""
        if not urls and pods is None:
            raise SignalError(
                "name every gateway (SPANMILL_ROLLOUT_GATEWAY_URLS) or the gateway's Service "
                "(SPANMILL_ROLLOUT_GATEWAY_SERVICE)"
            )
        # Each gateway's counters are kept by its URL: one named twice would count twice.
        self.urls = list(dict.fromkeys(u.rstrip("/") for u in urls))
        self.pods = pods
        self.timeout_s = timeout_s

    def _targets(self) -> list[str]:
        if self.pods is None:
            return self.urls
        try:
            endpoints = self.pods.endpoints()
        except ServiceUnlisted as exc:
            raise SignalError(str(exc)) from None
        if not endpoints:
            raise SignalError(f"no gateway pod is listed among {self.pods.describe()}")
        return [f"http://{endpoint.url}" for endpoint in endpoints]

    def _scrape(self, route: str) -> dict[str, Any]:
        """Each gateway's counters for ``route``, kept apart: a counter is only comparable
        with its own earlier value, since one gateway's restart resets its counters alone.

        A listed pod that does not answer (starting, or going) is left out of this read,
        so long as another answers: its counts are there again at the next read that
        reaches it. A gateway named by URL must answer."""
        from prometheus_client.parser import text_string_to_metric_families

        targets: dict[str, dict[str, Any]] = {}
        silent = []
        for url in self._targets():
            try:
                response = httpx.get(f"{url}/metrics", timeout=self.timeout_s)
                response.raise_for_status()
            except httpx.HTTPError as exc:
                if self.pods is None:
                    raise SignalError(
                        f"cannot read the gateway's metrics at {url}/metrics: {exc}"
                    ) from None
                silent.append(f"{url} ({exc})")
                continue
            requests: dict[str, dict[str, float]] = {}
            buckets: dict[str, dict[str, float]] = {}
            for family in text_string_to_metric_families(response.text):
                for sample in family.samples:
                    labels = sample.labels
                    if labels.get("model") != route:
                        continue
                    version = labels.get("version", "")
                    if sample.name == f"{REQUESTS_METRIC}_total":
                        by_status = requests.setdefault(version, {})
                        status = labels.get("status", "")
                        by_status[status] = by_status.get(status, 0.0) + sample.value
                    elif sample.name == f"{LATENCY_METRIC}_bucket":
                        by_le = buckets.setdefault(version, {})
                        le = labels.get("le", "+Inf")
                        by_le[le] = by_le.get(le, 0.0) + sample.value
            targets[url] = {"requests": requests, "buckets": buckets}
        if silent:
            if not targets:
                raise SignalError(f"no gateway pod answers /metrics: {'; '.join(silent)}")
            log.warning("gateway pods left out of this read of their metrics: %s",
                        "; ".join(silent))  # fmt: skip
        return {"targets": targets}

    def snapshot(self, route: str, versions: Collection[int]) -> dict[str, Any] | None:
        # A gateway counts every version it ever served until it restarts: all of them
        # in the state would grow it past what a ConfigMap holds.
        wanted = {str(v) for v in versions}
        targets = self._scrape(route)["targets"]
        return {"targets": {
            url: {kind: {v: c for v, c in counters[kind].items() if v in wanted}
                  for kind in ("requests", "buckets")}
            for url, counters in targets.items()
        }}  # fmt: skip

    def health(
        self, route: str, version: int, since: float, baseline: Mapping[str, Any] | None
    ) -> Health:
        now = self._scrape(route)["targets"]
        key = str(version)
        statuses: dict[str, float] = {}
        latency: dict[str, float] = {}
        if baseline is not None and "targets" not in baseline:
            # A baseline from a controller that summed the gateways before comparing:
            # compared the same way until the step ends.
            statuses = _delta(
                _summed(now, "requests", key), baseline.get("requests", {}).get(key, {})
            )
            latency = _delta(_summed(now, "buckets", key), baseline.get("buckets", {}).get(key, {}))
        else:
            before = (baseline or {}).get("targets", {})
            for url, counters in now.items():
                previous = before.get(url, {})
                restarted = _went_down(counters, previous)
                for kind, into in (("requests", statuses), ("buckets", latency)):
                    mine = counters[kind].get(key, {})
                    earlier = {} if restarted else previous.get(kind, {}).get(key, {})
                    for label, n in _delta(mine, earlier).items():
                        into[label] = into.get(label, 0.0) + n
        requests = sum(statuses.values())
        # Triton's full queue (429) is judged on its own (RolloutPolicy.max_queue_full_rate);
        # a client's bad request is not the model's fault; a server error is.
        queue_full = statuses.get(QUEUE_FULL_STATUS, 0.0)
        errors = sum(
            n for status, n in statuses.items() if not status.startswith("4") and status != "200"
        )
        return Health(
            requests=int(requests),
            errors=int(errors),
            queue_full=int(queue_full),
            answered=int(sum(n for status, n in statuses.items() if status.startswith("2"))),
            p95_latency_s=histogram_quantile(0.95, latency),
        )


def _summed(targets: Mapping[str, Any], kind: str, version: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for counters in targets.values():
        for label, value in counters[kind].get(version, {}).items():
            out[label] = out.get(label, 0.0) + value
    return out


def _went_down(now: Mapping[str, Any], before: Mapping[str, Any]) -> bool:
    """Whether any of one gateway's counters is below its earlier value, or gone: the
    gateway restarted, and all its counters (not only those lower now) began again at 0."""
    for kind in ("requests", "buckets"):
        current = now.get(kind, {})
        for version, values in before.get(kind, {}).items():
            mine = current.get(version, {})
            if any(mine.get(label, 0.0) < value for label, value in values.items()):
                return True
    return False


def _delta(now: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    """Counter increase per label; a counter that went down was reset (gateway restart)."""
    out = {}
    for label, value in now.items():
        previous = before.get(label, 0.0)
        out[label] = value - previous if value >= previous else value
    return out


def histogram_quantile(q: float, buckets: Mapping[str, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative ``le`` buckets (linear within a bucket)."""
    bounds = sorted(
        ((math.inf if le == "+Inf" else float(le)), count) for le, count in buckets.items()
    )
    if not bounds or bounds[-1][1] <= 0:
        return None
    total = bounds[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in bounds:
        if count >= rank:
            if math.isinf(upper):
                return lower  # beyond the last finite bucket: its bound is the best guess
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = upper, count
    return lower


# -- span store ----------------------------------------------------------------------


# How long before a step a call it judges may have started: longer than a call may take.
CALL_LOOKBACK_S = 900.0


class SpanStoreSignals:
    def __init__(
        self,
        store_url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        reward_name: str | None = None,
    ) -> None:
        from spanmill.store.reader import SpanStore

        self.store = SpanStore(store_url, storage_options)
        self.reward_name = reward_name

    def snapshot(self, route: str, versions: Collection[int]) -> dict[str, Any] | None:
        return None

    def health(
        self, route: str, version: int, since: float, baseline: Mapping[str, Any] | None
    ) -> Health:
        from spanmill import semconv as sc
        from spanmill.producers import Trust
        from spanmill.store.reader import StoreError

        # Names were checked (agent names are Triton model names); versions are ints.
        # llm_calls() and linked_rewards(): the store's macros (spanmill.store.queries).
        reward_filter = (
            f"r.name = '{self.reward_name.replace(chr(39), chr(39) * 2)}'"
            if self.reward_name
            else 'r."primary"'
        )
        sql = f"""
            WITH calls AS (
                SELECT episode_id, response_id, model_version, status_code, attributes,
                       date_diff('microsecond', start_time, end_time) / 1e6 AS seconds
                FROM llm_calls()
                WHERE request_model = '{route}' AND model_version IS NOT NULL
                  AND epoch_ns(end_time) >= {int(since * 1e9)}
                  -- RL rollouts (spanmill.traffic=training) say nothing of a served version.
                  AND coalesce(attributes, '') NOT LIKE '%"{sc.SPANMILL_TRAFFIC}":"training"%'
            ),
            mine AS (SELECT * FROM calls WHERE model_version = '{version}'),
            single AS (
                SELECT episode_id FROM calls GROUP BY episode_id
                HAVING min(model_version) = '{version}' AND max(model_version) = '{version}'
            ),
            rewards AS (
                -- Only trusted producers' rewards judge a version (spanmill.producers);
                -- what each judges is spanmill.rewards' rule (linked_rewards()).
                SELECT * FROM linked_rewards() WHERE {Trust().sql("resource_attributes")}
            ),
            mine_rewards AS (
                SELECT r.value AS value FROM rewards r
                WHERE {reward_filter} AND (
                    r.call_response_id IN (
                        SELECT response_id FROM mine WHERE response_id IS NOT NULL)
                    OR (r.call_response_id IS NULL
                        AND r.episode_id IN (SELECT episode_id FROM single))
                )
            )
            SELECT
                (SELECT count(*) FROM mine) AS requests,
                -- As the gateway's own counts: a client's fault (4xx) is not the model's,
                -- Triton's full queue (429) is judged on its own.
                (SELECT count(*) FROM mine WHERE status_code = 'error'
                    AND coalesce(attributes, '') NOT LIKE '%"{sc.ERROR_TYPE}":"4%') AS errors,
                (SELECT count(*) FROM mine WHERE status_code = 'error'
                    AND attributes LIKE '%"{sc.ERROR_TYPE}":"{QUEUE_FULL_STATUS}"%')
                    AS queue_full,
                (SELECT count(*) FROM mine WHERE status_code <> 'error') AS answered,
                (SELECT quantile_cont(seconds, 0.95) FROM mine WHERE status_code <> 'error') AS p95,
                (SELECT avg(value) FROM mine_rewards) AS mean_reward,
                (SELECT count(*) FROM mine_rewards) AS rewards
        """
        try:
            # A call's span is stored when it ends: the calls that ended since, whenever
            # they started (a step's slowest calls began before it, and read by their
            # start they were never judged at all: a version failing by timeouts passed).
            start = int((since - CALL_LOOKBACK_S) * 1e9)
            row = self.store.query(sql, start=start).to_pylist()[0]
        except StoreError as exc:
            raise SignalError(str(exc)) from None
        return Health(
            requests=int(row["requests"] or 0),
            errors=int(row["errors"] or 0),
            queue_full=int(row["queue_full"] or 0),
            answered=int(row["answered"] or 0),
            p95_latency_s=row["p95"],
            mean_reward=row["mean_reward"],
            rewards=int(row["rewards"] or 0),
        )
