"""More than one consumer process in one collector: the Kafka client's work, spread over cores.

kafka-python parses every record in Python, so one consumer takes one core for
that alone. With ``processes`` above 1 the collector starts that many consumer
processes in all: itself and ``processes - 1`` children, each a whole
:class:`~spanmill.collector.loop.Collector` with its own consumer in the group,
so the partitions are shared among them the way the group shares them among pods.
The first process serves HTTP for all of them: the receiver, health and readiness
(every consumer's), and metrics summed over every consumer.

Each child sends its state and metrics to the first process ten times a second.
A child that exits while the collector is running stops the whole collector with
an error, and a child whose parent is gone stops itself (writing what it holds):
the pod restarts whole, never half.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from spanmill.config import CollectorSettings
from spanmill.errors import SpanmillError

log = logging.getLogger(__name__)

_REPORT_EVERY_S = 0.1
# A child not heard from for this long counts as stuck.
_SILENT_S = 30.0

# One metric family as plain data: name, type, help, and its samples (name, labels, value).
Family = tuple[str, str, str, list[tuple[str, dict[str, str], float]]]


def snapshot(registry: CollectorRegistry) -> list[Family]:
    return [
        (
            family.name,
            family.type,
            family.documentation,
            [(s.name, dict(s.labels), s.value) for s in family.samples],
        )
        for family in registry.collect()
    ]


def merge(snapshots: Iterable[list[Family]]) -> list[Metric]:
    """Families of the same name summed sample by sample; creation times keep the earliest."""
    merged: dict[str, tuple[Metric, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for families in snapshots:
        for name, kind, documentation, samples in families:
            if name not in merged:
                merged[name] = (Metric(name, documentation, kind), {})
            values = merged[name][1]
            for sample, labels, value in samples:
                key = (sample, tuple(sorted(labels.items())))
                if key not in values:
                    values[key] = value
                elif sample.endswith("_created"):
                    values[key] = min(values[key], value)
                else:
                    values[key] += value
    out = []
    for metric, values in merged.values():
        for (sample, pairs), value in values.items():
            metric.add_sample(sample, dict(pairs), value)
        out.append(metric)
    return out


@dataclass
class _Report:
    alive: bool = True
    ready: bool = False
    families: list[Family] | None = None
    at: float = 0.0


class ConsumerProcesses:
    """The collector's other consumer processes: started, heard from, and stopped by the first."""

    def __init__(self, settings: CollectorSettings, count: int) -> None:
        context = get_context("spawn")
        self._stopping = threading.Event()
        self._reports = [_Report() for _ in range(count)]
        self._processes: list[BaseProcess] = []
        self._readers: list[threading.Thread] = []
        self._pipes: list[Connection] = []
        self._started = False
        for index in range(count):
            receive, send = context.Pipe(duplex=False)
            process = context.Process(
                target=_child,
                args=(settings, send, os.getpid()),
                name=f"spanmill-collector-{index + 1}",
            )
            self._processes.append(process)
            self._readers.append(
                threading.Thread(target=self._listen, args=(index, receive), daemon=True)
            )
            self._pipes.append(send)

    def start(self) -> None:
        self._started = True
        for process in self._processes:
            process.start()
        for pipe in self._pipes:
            pipe.close()  # the children hold the sending ends now
        for reader in self._readers:
            reader.start()

    def _listen(self, index: int, receive: Connection) -> None:
        report = self._reports[index]
        while True:
            try:
                alive, ready, families = receive.recv()
            except (EOFError, OSError):
                return
            report.alive, report.ready, report.families = alive, ready, families
            report.at = time.monotonic()

    def failed(self) -> str | None:
        """Why a child is gone while the collector runs; None while all are well."""
        if self._stopping.is_set():
            return None
        for process in self._processes:
            if process.exitcode is not None:
                return f"consumer process {process.name} exited with code {process.exitcode}"
        return None

    @property
    def alive(self) -> bool:
        now = time.monotonic()
        return self.failed() is None and all(
            report.alive and (not report.at or now - report.at < _SILENT_S)
            for report in self._reports
        )

    @property
    def ready(self) -> bool:
        return all(report.ready for report in self._reports) and self.failed() is None

    def families(self) -> list[list[Family]]:
        return [report.families for report in self._reports if report.families is not None]

    def stop(self) -> None:
        """Ask every child to write what it holds and stop (SIGTERM); returns at once."""
        self._stopping.set()
        for process in self._processes:
            if process.exitcode is None and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)

    def join(self, timeout: float) -> None:
        self.stop()
        if not self._started:
            return  # stopped before they were needed
        deadline = time.monotonic() + timeout
        for process in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                log.error("consumer process %s did not stop in time; killing it", process.name)
                process.kill()
                process.join(5)
        for reader in self._readers:
            reader.join(timeout=1)


class MergedMetrics:
    """What /metrics shows with several consumer processes: every process's metrics summed."""

    def __init__(self, registry: CollectorRegistry, children: ConsumerProcesses) -> None:
        self.registry = registry
        self.children = children

    def collect(self) -> list[Metric]:
        return merge([snapshot(self.registry), *self.children.families()])


class Supervised:
    """Health and readiness of the first process's collector and of every child."""

    def __init__(self, collector: Any, children: ConsumerProcesses) -> None:
        self.collector = collector
        self.children = children

    @property
    def alive(self) -> bool:
        return bool(self.collector.alive) and self.children.alive

    @property
    def ready(self) -> bool:
        return bool(self.collector.ready) and self.children.ready


def _child(settings: CollectorSettings, send: Connection, parent: int) -> None:
    from spanmill.collector.loop import Collector
    from spanmill.collector.tuning import tune_process
    from spanmill.logs import configure_logging, stacks_on_sigusr1

    configure_logging()
    stacks_on_sigusr1()  # as the first process: a signal asks, it does not end it
    tune_process()
    try:
        _consume(send, parent, Collector(settings))
    except SpanmillError as exc:
        log.error("%s", exc)
        sys.exit(1)


def _consume(send: Connection, parent: int, collector: Any) -> None:
    def stop(_signum: int, _frame: FrameType | None) -> None:
        collector.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    done = threading.Event()

    def report() -> None:
        while not done.wait(_REPORT_EVERY_S):
            if os.getppid() != parent:
                log.error("the collector's first process is gone; stopping")
                collector.stop()
                return
            try:
                send.send((collector.alive, collector.ready, snapshot(collector.metrics.registry)))
            except OSError:
                collector.stop()
                return

    reporter = threading.Thread(target=report, name="collector-report", daemon=True)
    try:
        collector.start()
        reporter.start()
        collector.run()
    finally:
        done.set()
        if reporter.is_alive():
            reporter.join(timeout=1)
        with contextlib.suppress(OSError):
            send.send((False, False, snapshot(collector.metrics.registry)))
        send.close()
