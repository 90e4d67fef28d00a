"""How many consumer processes and decode-and-write workers a collector runs on ``auto``.

The Kafka client parses every record in Python, on the core of its consumer's
process, and each consumer waits on its fetches part of the time (the broker builds
the answer, the client reads it). So a collector is fastest with a consumer process
per core and one more, to fill the waits, and its batches decoded and written on a
thread of each consumer's process (``workers=0``). Measured on a 2-core machine with
a topic of 3 partitions (``bench/collector_throughput.py``): 3 processes reached 0.73
of the raw consume rate at 100 spans a record and about 1.0 at one span a record,
one process with one worker 0.51 and 0.82.

A consumer beyond the topic's partitions has nothing to read, so the processes are
at most the partitions (where the topic exists yet), shared among the collectors
of the consumer group (``SPANMILL_COLLECTOR_INSTANCES``, the most that run at once:
the Helm chart sets it from its replicas or its autoscaler's maximum): each takes at
most its share, at least one. Where there are more collectors than that, more of
them run (the autoscaler adds pods) rather than more consumers in each. Cores left
over when the consumers are fewer than the cores go to worker processes behind
each consumer.
The cores are what this process may run on: its CPU affinity, the cgroup's CPU
quota, or ``SPANMILL_COLLECTOR_CPUS`` (the Helm chart sets it from the pod's CPU
request).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from spanmill.cpus import available_cpus

if TYPE_CHECKING:
    from spanmill.config import CollectorSettings

log = logging.getLogger(__name__)

# Worker processes a consumer gets at most from spare cores: past two, the consumer's
# own parsing is the limit.
MAX_AUTO_WORKERS: Final = 2


@dataclass(frozen=True)
class Layout:
    """Consumer processes, and decode-and-write worker processes behind each."""

    processes: int
    workers: int


def layout(cpus: float, partitions: int | None, instances: int = 1) -> Layout:
    """The auto layout for ``cpus`` CPUs and a topic of ``partitions`` (None: not known)
    read by at most ``instances`` collectors in one consumer group."""
    cores = max(1, math.floor(cpus))
    processes = cores + 1
    if partitions is not None and partitions > 0:
        processes = min(processes, max(1, partitions // max(1, instances)))
    spare = cores - processes
    workers = min(MAX_AUTO_WORKERS, spare // processes) if spare > 0 else 0
    return Layout(processes, workers)


def sized(settings: CollectorSettings, partitions: int | None = None) -> CollectorSettings:
    """``settings`` with ``processes`` and ``workers`` as numbers, ``auto`` worked out.

    A set number stands; where only ``workers`` is ``auto``, it is worked out for
    the processes set.
    """
    if settings.processes != "auto" and settings.workers != "auto":
        return settings
    cpus = settings.cpus or available_cpus()  # 0: not said (a pod without a CPU request)
    auto = layout(cpus, partitions, settings.instances)
    processes = auto.processes if settings.processes == "auto" else settings.processes
    # The spare cores of the processes run, set or worked out (for the latter the same
    # as auto.workers).
    workers = layout(cpus, processes).workers if settings.workers == "auto" else settings.workers
    log.info(
        "collector layout: %d consumer process(es), %d worker(s) each "
        "(%.1f CPUs, %s partitions, at most %d collector(s) in the group)",
        processes,
        workers,
        cpus,
        partitions if partitions is not None else "unknown",
        settings.instances,
    )
    return settings.model_copy(update={"processes": processes, "workers": workers})


def settled(settings: CollectorSettings) -> Layout:
    """The layout of settings that :func:`sized` has worked out."""
    processes, workers = settings.processes, settings.workers
    if processes == "auto" or workers == "auto":
        raise ValueError("the collector's processes and workers are not worked out yet: sized()")
    return Layout(processes, workers)


def topic_partitions(settings: CollectorSettings, timeout_s: float = 15.0) -> int | None:
    """How many partitions the span topic has, or None where Kafka cannot say within
    ``timeout_s`` (the collector is then sized by its cores alone)."""
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    from spanmill.topic import partitions_of

    topic = settings.kafka.spans_topic
    try:
        consumer = KafkaConsumer(
            **settings.kafka.client_options(),
            client_id="spanmill-collector-sizing",
            request_timeout_ms=10_000,
            bootstrap_timeout_ms=10_000,
        )
    except KafkaError as exc:
        log.warning("could not ask Kafka for the span topic's partitions: %s", exc)
        return None
    try:
        found = partitions_of(consumer, topic, timeout_s)
    except KafkaError as exc:
        log.warning("could not ask Kafka for the span topic's partitions: %s", exc)
        found = set()
    if found is None:
        log.warning("Kafka did not say within %.0fs how many partitions %s has", timeout_s, topic)
        return None  # the client is left to its thread, which ends with the process
    consumer.close()
    return len(found) or None
