"""Running the collector as a service: the consume loop, the HTTP server, signals, logs."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from spanmill import topic as span_topic
from spanmill.collector.app import Health, create_app
from spanmill.collector.consumers import ConsumerProcesses, MergedMetrics, Supervised
from spanmill.collector.loop import Collector, CollectorError
from spanmill.collector.receiver import OtlpReceiver
from spanmill.collector.sizing import settled, sized, topic_partitions
from spanmill.collector.tuning import tune_process
from spanmill.config import CollectorSettings, load_settings
from spanmill.errors import SpanmillError
from spanmill.logs import configure_logging

log = logging.getLogger(__name__)
# How long the receiver's spans may wait for Kafka before its reply says 503.
_RECEIVER_DELIVERY_S = 30.0


def _receiver_producer(collector: Collector, settings: CollectorSettings) -> Any:
    """The OTLP receiver's own span producer (spanmill.topic), or None when it is off."""
    if not settings.receiver_enabled:
        return None
    from kafka.errors import KafkaError

    try:
        return span_topic.span_producer(
            settings.kafka,
            f"spanmill-receiver-{collector.collector_id}",
            delivery_timeout_s=_RECEIVER_DELIVERY_S,
        )
    except KafkaError as exc:
        raise CollectorError(
            f"the OTLP receiver cannot reach Kafka at {settings.kafka.bootstrap_servers}: {exc}"
        ) from None


def _start_http(
    collector: Collector,
    settings: CollectorSettings,
    health: Health,
    metrics: Any,
    producer: Any,
) -> Any:
    import uvicorn

    receiver = (
        OtlpReceiver(
            producer,
            settings.kafka.spans_topic,
            collector.metrics,
            settings.kafka.max_message_bytes,
        )
        if producer is not None
        else None
    )
    from spanmill.keys import KeyRing

    keys = KeyRing(settings.receiver_keys_file) if settings.receiver_keys_file else None
    admin = KeyRing(admin_key=settings.admin_api_key) if settings.admin_api_key else None
    app = create_app(
        health, collector.metrics, receiver, exposition=metrics, keys=keys, admin=admin,
        store=(settings.store_url, settings.storage_options),
    )  # fmt: skip
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.http_host,
            port=settings.http_port,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_keep_alive=settings.http_keep_alive_s,
        )
    )
    thread = threading.Thread(target=server.run, name="collector-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not server.started:
        raise CollectorError(
            f"the collector's HTTP server could not listen on {settings.http_host}:"
            f"{settings.http_port}; free the port or set SPANMILL_COLLECTOR_HTTP_PORT"
        )
    return server, thread


def run_collector(settings: CollectorSettings) -> None:
    """Run until SIGTERM or SIGINT, then write what is held, commit and exit.

    With ``processes`` above 1, the other consumer processes start first and stop
    with this one; see :mod:`spanmill.collector.consumers`.
    """
    if "auto" in (settings.processes, settings.workers):
        settings = sized(settings, topic_partitions(settings))
    processes = settled(settings).processes
    children = ConsumerProcesses(settings, processes - 1) if processes > 1 else None
    tune_process()
    collector = Collector(settings)
    failure: list[str] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: writing what is held, then stopping", signum)
        collector.stop()
        if children is not None:
            children.stop()

    # Handled before connecting: a stop asked for while the collector starts (a pod
    # deleted as it comes up) ends it cleanly once started, not by the default action.
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _serve(collector, children, settings, failure)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure:
        raise CollectorError(failure[0])


def _serve(
    collector: Collector,
    children: ConsumerProcesses | None,
    settings: CollectorSettings,
    failure: list[str],
) -> None:
    collector.start()
    health: Health = collector
    metrics: Any = collector.metrics.registry
    if children is not None:
        if not collector.stopped:
            children.start()
        health = Supervised(collector, children)
        metrics = MergedMetrics(collector.metrics.registry, children)

    def watch(children: ConsumerProcesses) -> None:
        while not collector.stopped:
            reason = children.failed()
            if reason is not None:
                log.error("%s; stopping the collector", reason)
                failure.append(reason)
                collector.stop()
                children.stop()
                return
            time.sleep(0.5)

    producer = None
    try:
        producer = _receiver_producer(collector, settings)
        server, thread = _start_http(collector, settings, health, metrics, producer)
        if children is not None:
            threading.Thread(target=watch, args=(children,), daemon=True).start()
        try:
            collector.run()
        finally:
            server.should_exit = True
            thread.join(timeout=5)
    finally:
        if producer is not None:
            producer.close(timeout=5)
        if children is not None:
            children.join(timeout=settings.shutdown_timeout_s + 10)


def main() -> None:
    """The collector service's entry point: settings from the environment only."""
    configure_logging()
    try:
        run_collector(load_settings(CollectorSettings))
    except SpanmillError as exc:
        log.error("%s", exc)
        sys.exit(1)
