"""The collector's auto layout: consumer processes and workers from the CPUs and partitions."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from spanmill.collector.loop import Collector
from spanmill.collector.sizing import Layout, layout, settled, sized
from spanmill.config import CollectorSettings, load_settings
from spanmill.cpus import available_cpus
from spanmill.errors import ConfigError


@pytest.mark.parametrize(
    ("cpus", "partitions", "expected"),
    [
        (2, 3, Layout(3, 0)),  # a consumer per core and one more, each on a thread
        (2, None, Layout(3, 0)),  # the topic not there yet: the cores decide
        (2, 1, Layout(1, 1)),  # one partition: the spare core decodes and writes
        (1, 6, Layout(2, 0)),
        (0.25, 6, Layout(2, 0)),  # a fraction of a core counts as one
        (2.5, 6, Layout(3, 0)),
        (8, 6, Layout(6, 0)),  # never more consumers than partitions
        (8, 2, Layout(2, 2)),  # spare cores shared out as workers, at most two each
        (64, 6, Layout(6, 2)),
    ],
)
def test_the_layout_follows_the_cores_and_the_partitions(
    cpus: float, partitions: int | None, expected: Layout
) -> None:
    assert layout(cpus, partitions) == expected


@pytest.mark.parametrize(
    ("cpus", "partitions", "instances", "expected"),
    [
        (1, 6, 6, Layout(1, 0)),  # six pods on six partitions: one consumer each
        (2, 6, 6, Layout(1, 1)),  # the pod's other core decodes and writes
        (1, 6, 2, Layout(2, 0)),  # two pods: each may take three, its cores decide
        (8, 12, 3, Layout(4, 1)),  # its share of twelve: four, the spare cores as workers
        (1, 6, 12, Layout(1, 0)),  # more pods than partitions: still one consumer
        (2, None, 6, Layout(3, 0)),  # the topic not there yet: the cores decide
    ],
)
def test_each_collector_in_the_group_takes_at_most_its_share_of_the_partitions(
    cpus: float, partitions: int | None, instances: int, expected: Layout
) -> None:
    assert layout(cpus, partitions, instances) == expected


def test_set_numbers_stand_and_auto_workers_follow_the_set_processes(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    set_both = CollectorSettings(processes=2, workers=3, cpus=8, store_url=store)
    assert sized(set_both, 6) is set_both
    assert settled(sized(CollectorSettings(processes=2, cpus=8, store_url=store), 6)) == Layout(
        2, 2
    )
    assert settled(sized(CollectorSettings(workers=1, cpus=2, store_url=store), 3)) == Layout(3, 1)
    assert settled(sized(CollectorSettings(cpus=2, store_url=store), 3)) == Layout(3, 0)
    shared = CollectorSettings(cpus=2, instances=3, store_url=store)
    assert settled(sized(shared, 3)) == Layout(1, 1)
    # 0, as the chart's CPU request gives where the pod has none: this process's CPUs.
    mine = layout(available_cpus(), 3)
    assert settled(sized(CollectorSettings(cpus=0, store_url=store), 3)) == mine
    with pytest.raises(ValueError, match="not worked out"):
        settled(CollectorSettings(store_url=store))


def test_a_lone_collector_is_one_consume_loop_with_the_spare_cores_as_workers(
    tmp_path: Path,
) -> None:
    collector = Collector(CollectorSettings(cpus=2, store_url=str(tmp_path / "store")))
    assert settled(collector.settings) == Layout(1, 1)
    assert collector.workers == 1


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PROCESSES", "0", "from 1 to 64, or auto"),
        ("PROCESSES", "2.5", "whole number from 1 to 64, or auto"),
        ("WORKERS", "-1", "from 0 to 64, or auto"),
        ("WORKERS", "many", "whole number from 0 to 64, or auto"),
        ("CPUS", "-1", "greater than or equal to 0"),
        ("INSTANCES", "0", "greater than or equal to 1"),
    ],
)
def test_a_bad_count_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(f"SPANMILL_COLLECTOR_{name}", value)
    with pytest.raises(ConfigError, match=f"SPANMILL_COLLECTOR_{name}.*{message}"):
        load_settings(CollectorSettings)


def test_auto_and_numbers_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPANMILL_COLLECTOR_PROCESSES", "Auto")
    monkeypatch.setenv("SPANMILL_COLLECTOR_WORKERS", "0")
    settings = load_settings(CollectorSettings)
    assert (settings.processes, settings.workers) == ("auto", 0)


@pytest.mark.services
def test_kafka_says_how_many_partitions_the_topic_has(topics: Any, kafka: Any) -> None:
    """Asked of a real broker: before, an option this client does not take made every
    question fail, and every collector was sized as if the topic were not there."""
    from spanmill.collector.sizing import topic_partitions
    from spanmill.config import KafkaSettings

    five = kafka.create_topic(f"sizing-{uuid.uuid4().hex[:8]}", partitions=5)
    settings = CollectorSettings(
        kafka=KafkaSettings(bootstrap_servers=topics.bootstrap, spans_topic=five),
        store_url="unused", cpus=8, processes="auto", workers="auto",
    )  # fmt: skip
    partitions = topic_partitions(settings)
    assert partitions == 5
    assert settled(sized(settings, partitions)) == Layout(5, 0)


def test_a_broker_that_never_answers_leaves_the_partitions_unknown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The broker takes connections and never answers: the question gives up (the
    client's first contact within 10 s, the topic's metadata within ``timeout_s``), and
    the collector is sized by its cores."""
    import socket

    from spanmill.collector.sizing import topic_partitions
    from spanmill.config import KafkaSettings

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        settings = CollectorSettings(
            kafka=KafkaSettings(bootstrap_servers=f"127.0.0.1:{silent.getsockname()[1]}"),
            store_url="unused",
        )  # fmt: skip
        assert topic_partitions(settings, timeout_s=3) is None
    assert "partitions" in caplog.text
