"""The rollout controller as a service: settings in, the reconcile loop, /metrics and health.

``/healthz`` answers while the process runs and its pass is not stuck: a pass that
has not moved on for ``stall_after_s`` (a call that never returns) fails it, so that
the kubelet restarts the controller, and the log says where the pass is stuck.
``/readyz`` answers once a reconcile pass has completed recently (within three
intervals), so an orchestrator notices a controller that can no longer reach MLflow,
Triton or its backend.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from spanmill.config import RolloutSettings
from spanmill.errors import ConfigError
from spanmill.registry.bounds import bounded
from spanmill.registry.client import ModelRegistry
from spanmill.rollout.backend import RolloutBackend
from spanmill.rollout.deployer import Deployer
from spanmill.rollout.fleet import TritonFleet, fleet_of
from spanmill.rollout.leader import LeaderElector
from spanmill.rollout.materialize import ModelRepository, ServingOptions
from spanmill.rollout.metrics import RolloutMetrics
from spanmill.rollout.reconciler import Reconciler
from spanmill.rollout.schemas import RolloutPolicy
from spanmill.rollout.signals import GatewayMetricsSignals, Signals, SpanStoreSignals

log = logging.getLogger(__name__)


def policy_of(settings: RolloutSettings) -> RolloutPolicy:
    return RolloutPolicy(
        steps=settings.steps,
        bake_s=settings.bake_s,
        min_requests=settings.min_requests,
        max_error_rate=settings.max_error_rate,
        max_queue_full_rate=settings.max_queue_full_rate,
        max_p95_latency_s=settings.max_p95_latency_s,
        max_latency_ratio=settings.max_latency_ratio,
        min_mean_reward=settings.min_mean_reward,
        max_reward_drop=settings.max_reward_drop,
        min_rewards=settings.min_rewards,
        grace_s=settings.grace_s,
        drain_s=settings.drain_s,
    )


def backend_of(settings: RolloutSettings) -> RolloutBackend:
    if settings.backend == "kubernetes":
        from spanmill.rollout.k8s_backend import KubernetesBackend

        return KubernetesBackend(
            settings.namespace, settings.configmap, initial=settings.initial_routes
        )
    from spanmill.rollout.local_backend import LocalBackend

    key = settings.gateway_admin_key.get_secret_value() if settings.gateway_admin_key else None
    if settings.gateway_admin_url:
        return LocalBackend(settings.state_file, gateway_url=settings.gateway_admin_url,
                            api_key=key)  # fmt: skip
    return LocalBackend(settings.state_file, routing_file=settings.routing_file)


def signals_of(settings: RolloutSettings) -> Signals:
    if settings.signals == "spans":
        return SpanStoreSignals(
            settings.store_url,
            storage_options=settings.store_options,
            reward_name=settings.reward_name,
        )
    if settings.gateway_service:
        from spanmill.rollout.fleet import ServicePods

        pods = ServicePods(settings.namespace, settings.gateway_service,
                           port_name=settings.gateway_port_name)  # fmt: skip
        return GatewayMetricsSignals(pods=pods)
    return GatewayMetricsSignals(settings.gateway_urls)


def bounded_mlflow(settings: RolloutSettings) -> contextlib.AbstractContextManager[None]:
    """MLflow calls bounded as the controller's settings ask, while it runs; what the
    process had before is restored after (the client reads them at each call)."""
    return bounded(settings.mlflow_timeout_s, settings.mlflow_retries)


def build_reconciler(
    settings: RolloutSettings,
    *,
    backend: RolloutBackend | None = None,
    signals: Signals | None = None,
    fleet: TritonFleet | None = None,
    metrics: RolloutMetrics | None = None,
    clock: Callable[[], float] = time.time,
) -> Reconciler:
    """Every part of the controller from its settings; ``backend``, ``signals`` and ``fleet``
    may be given."""
    registry = ModelRegistry(settings.mlflow.tracking_uri)
    options = ServingOptions.from_settings(settings.serving, settings.triton)
    deployer = Deployer(
        registry,
        fleet or fleet_of(settings.triton, load_timeout_s=settings.load_timeout_s),
        ModelRepository.from_settings(settings.triton),
        options,
        smoke_timeout_s=settings.smoke_timeout_s,
    )
    return Reconciler(
        registry,
        deployer,
        signals or signals_of(settings),
        backend or backend_of(settings),
        policy_of(settings),
        agents=settings.agents,
        metrics=metrics,
        clock=clock,
        retry_after_s=settings.retry_after_s,
        deploy_wait_s=settings.deploy_wait_s,
    )


class StallWatch:
    """Whether the controller is alive: not while its pass has been stuck for longer than
    ``after_s``. A stall is logged once, with where the pass's thread is."""

    def __init__(self, reconciler: Reconciler, after_s: float) -> None:
        self.reconciler = reconciler
        self.after_s = after_s
        self._told: float | None = None
        self._lock = threading.Lock()

    def healthy(self) -> bool:
        stall = self.reconciler.stalled(self.after_s)
        if stall is None:
            return True
        with self._lock:
            if self._told != stall.since:
                self._told = stall.since
                log.error(
                    "the reconcile pass has not moved on for %.0fs (over "
                    "SPANMILL_ROLLOUT_STALL_AFTER_S=%g), at %s: /healthz fails until it does, "
                    "so that the controller is restarted. Its thread is at:\n%s",
                    stall.idle_s(), self.after_s, stall.what, stall.stack or "(gone)",
                )  # fmt: skip
        return False

    def run(self, stop: threading.Event) -> None:
        """Look every quarter of ``after_s`` (30 s at most): a stall is logged even where
        nothing probes /healthz."""
        while not stop.wait(min(30.0, self.after_s / 4)):
            self.healthy()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would drown the decisions in the log."""


def serve_http(
    metrics: RolloutMetrics,
    host: str,
    port: int,
    ready: Callable[[], bool],
    healthy: Callable[[], bool] = lambda: True,
) -> WSGIServer:
    """Serve /metrics, /healthz and /readyz from a daemon thread; returns the server."""

    def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            start("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
            return [generate_latest(metrics.registry)]
        if path == "/healthz":
            ok = healthy()
            start(
                "200 OK" if ok else "503 Service Unavailable",
                [("Content-Type", "application/json")],
            )
            return [b'{"status": "ok"}' if ok else b'{"status": "the pass is stuck"}']
        if path == "/readyz":
            ok = ready()
            start(
                "200 OK" if ok else "503 Service Unavailable",
                [("Content-Type", "application/json")],
            )
            return [b'{"status": "ready"}' if ok else b'{"status": "no recent reconcile"}']
        start("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found"]

    try:
        server = make_server(host, port, app, handler_class=_QuietHandler)
    except OSError as exc:
        raise ConfigError(
            f"the controller cannot serve its probes and metrics on {host}:{port}: "
            f"{exc.strerror or exc}; free the port or set SPANMILL_ROLLOUT_HTTP_PORT"
        ) from None
    threading.Thread(target=server.serve_forever, name="rollout-http", daemon=True).start()
    return server


def run(settings: RolloutSettings, stop: threading.Event | None = None) -> None:
    """Run the controller until SIGTERM/SIGINT (or ``stop``).

    With ``settings.leader_election`` several replicas run and only the holder of the Lease
    (:mod:`spanmill.rollout.leader`) reconciles; /metrics says which (``spanmill_rollout_leader``)
    and /readyz answers ready for a standby that can read the Lease.
    """
    stop = stop or threading.Event()
    metrics = RolloutMetrics()
    reconciler = build_reconciler(settings, metrics=metrics)
    # With leader election only the holder of the Lease reconciles. The Lease is released
    # after the last pass has ended, so a standby never starts while that pass still writes.
    elector = LeaderElector.from_settings(settings) if settings.leader_election else None

    def ready() -> bool:
        # A standby is healthy while it can read the Lease; the leader while it reconciles.
        if elector is not None and not elector.is_leader():
            return elector.in_touch()
        last = reconciler.last_tick_at
        return last is not None and time.time() - last < 3 * settings.interval_s + 30

    watch = StallWatch(reconciler, settings.stall_after_s)
    # The port first: a replica that cannot serve its probes exits before it takes the Lease.
    server = serve_http(metrics, settings.http_host, settings.http_port, ready, watch.healthy)
    watch_stop, lease_stop = threading.Event(), threading.Event()
    threading.Thread(
        target=watch.run, args=(watch_stop,), name="rollout-watch", daemon=True
    ).start()
    lease_thread = None
    if elector is not None:
        metrics.leader.set_function(lambda: float(elector.is_leader()))
        lease_thread = threading.Thread(
            target=elector.run, args=(lease_stop,), name="rollout-lease", daemon=True
        )
        lease_thread.start()
    else:
        metrics.leader.set(1)
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    try:
        with bounded_mlflow(settings):
            try:
                reconciler.run(
                    stop,
                    settings.interval_s,
                    active=elector.is_leader if elector is not None else None,
                    standby_poll_s=settings.retry_period_s,
                )
            finally:
                # The deployments under way end (their MLflow calls bounded as the pass's
                # are) before the Lease goes: a successor never finds one half written.
                reconciler.close()
    finally:
        watch_stop.set()
        lease_stop.set()
        if lease_thread is not None:
            lease_thread.join(timeout=settings.renew_deadline_s + 5)
        server.shutdown()
        log.info("rollout controller stopped")
