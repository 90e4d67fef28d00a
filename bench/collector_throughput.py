"""Collector throughput: spans/s from the topic to durable Parquet, next to a raw consume.

Everything real: a tansu broker, topics of 3 partitions filled with ~1 KB LLM
spans (OTLP protobuf, keyed by trace id) in two shapes, each measured in the same run:
one span a record, and 100 spans of one trace a record (about 122 KiB, as the
OpenTelemetry SDK's batch processor and the Collector's Kafka exporter send them).
For each shape:

- raw consume: kafka-python reading every record with the collector's consumer
  settings and doing nothing with them, in a fresh process set up as the
  collector's are (:mod:`spanmill.collector.tuning`);
- the collector as its own process (``python -m spanmill.collector``), from the
  moment it is ready and has taken its first record to its last span durably
  written and counted, for each
  set-up: consumer processes (``processes``) times decode-and-write workers.

The figure is the ratio of the two rates (raw records/s times spans a record); the
raw rate is the median of three runs (before, between and after the collector's).
Peak RSS covers the collector and all its processes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psutil

from spanmill import semconv as sc
from spanmill.collector.decode import FAST_PATH
from spanmill.collector.loop import fetch_options
from spanmill.collector.sizing import layout
from spanmill.collector.tuning import tune_process
from spanmill.config import CollectorSettings
from spanmill.cpus import available_cpus
from spanmill.spans import Span, encode_otlp_protobuf
from spanmill.stack.ports import free_port
from spanmill.stack.services import KafkaBroker

# Enough for about ten seconds of steady state at 100,000 spans/s. In shorter runs the
# partitions' uneven ends weigh on the figure: each partition's last, partial batch is
# written only once it is BATCH_MAX_SECONDS old, idle time that is not throughput
# (300,000 spans left 2-3 s of steady state, of which that wait was a fifth).
SPANS = int(os.environ.get("SPANMILL_BENCH_SPANS", "1000000"))
BATCH_MAX_SECONDS = 0.5
# Collector set-ups, PROCESSES x WORKERS: consumer processes, and decode-and-write
# worker processes for each (0: a thread of the consumer's); "auto" is the default,
# the layout spanmill.collector.sizing works out for this machine and the topic.
SETUPS = os.environ.get("SPANMILL_BENCH_SETUPS", "auto,1x0,1x1,1x2,2x0").split(",")
PARTITIONS = 3
# Spans a record, one shape each; SPANMILL_BENCH_SHAPES="1" measures one shape alone.
SHAPES = [int(n) for n in os.environ.get("SPANMILL_BENCH_SHAPES", "1,100").split(",")]
SESSION_TIMEOUT_MS = 6000


def payloads(count: int, per_record: int = 1) -> list[tuple[bytes, bytes]]:
    """``count`` distinct ~1 KB LLM spans, ``per_record`` of one trace a record."""
    template = Span(
        trace_id="5b8efff798038103d269b633813fc60c",
        span_id="eee19b7ec3c1b174",
        parent_span_id="1111111111111111",
        name="chat smollm2",
        kind="client",
        start_time_unix_nano=1_750_000_000_000_000_000,
        end_time_unix_nano=1_750_000_000_400_000_000,
        status_code="ok",
        attributes={
            sc.GEN_AI_OPERATION_NAME: "chat",
            sc.GEN_AI_REQUEST_MODEL: "smollm2",
            sc.GEN_AI_RESPONSE_MODEL: "smollm2-135m",
            sc.SPANMILL_MODEL_VERSION: "3",
            sc.GEN_AI_RESPONSE_ID: "chatcmpl-0",
            sc.GEN_AI_AGENT_NAME: "calculator",
            sc.GEN_AI_USAGE_INPUT_TOKENS: 120,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: 16,
            sc.GEN_AI_INPUT_MESSAGES: json.dumps(
                [
                    {
                        "role": "system",
                        "parts": [
                            {
                                "type": "text",
                                "content": "You are a "
                                "calculator agent. Answer with one JSON tool call.",
                            }
                        ],
                    },
                    {
                        "role": "user",
                        "parts": [
                            {
                                "type": "text",
                                "content": "What is 12 times 7 plus 3, divided by two? " * 4,
                            }
                        ],
                    },
                ]
            ),
            sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(
                [
                    {
                        "role": "assistant",
                        "parts": [
                            {
                                "type": "text",
                                "content": '{"tool": "calculator", "expression": "(12*7+3)/2"}',
                            }
                        ],
                    }
                ]
            ),
            sc.SPANMILL_COMPLETION_TOKEN_IDS: list(range(100, 116)),
            sc.SPANMILL_COMPLETION_LOGPROBS: [-0.125] * 16,
            sc.SPANMILL_TASK_ID: "task-1",
        },
        resource_attributes={sc.SERVICE_NAME: "calculator-agent"},
        scope_name="spanmill.sdk",
        scope_version="0.1.0",
    )
    out = []
    for first in range(0, count, per_record):
        trace_id = f"{first + 1:032x}"
        spans = [
            template.model_copy(
                update={
                    "trace_id": trace_id,
                    "span_id": f"{i + 1:016x}",
                    "start_time_unix_nano": template.start_time_unix_nano + i * 1000,
                    "end_time_unix_nano": template.end_time_unix_nano + i * 1000,
                }
            )
            for i in range(first, min(first + per_record, count))
        ]
        out.append((trace_id.encode(), encode_otlp_protobuf(spans)))
    return out


def consumer_options() -> dict[str, object]:
    """The collector's consumer settings (see spanmill.collector.loop), for a fair baseline."""
    return {
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "heartbeat_interval_ms": SESSION_TIMEOUT_MS // 3,
        # The collector's own fetch settings, as its default configuration sets them.
        **fetch_options(CollectorSettings()),
    }


def raw_consume(bootstrap: str, topic: str, count: int, *, tuned: bool = True) -> float:
    """kafka-python's rate over ``count`` records, in a process of its own.

    The process is set up as each collector process is (fresh, with
    :func:`~spanmill.collector.tuning.tune_process`): what those settings do for the
    client alone is in the baseline too, and the ratio measures the collector's work.
    ``tuned=False``: a process with the interpreter's and C library's defaults.
    """
    flag = "--raw" if tuned else "--raw-default"
    done = subprocess.run(
        [sys.executable, "-m", "bench.collector_throughput", flag, bootstrap, topic, str(count)],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the raw consumer failed: {done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def _raw_consume_here(bootstrap: str, topic: str, count: int, tuned: bool) -> float:
    from kafka import KafkaConsumer

    if tuned:
        tune_process()
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=[bootstrap],
        group_id=f"raw-{uuid.uuid4().hex[:8]}",
        **consumer_options(),
    )
    taken, started = 0, 0.0
    while taken < count:
        for records in consumer.poll(timeout_ms=1000).values():
            if not started:
                started = time.perf_counter()
            taken += len(records)
    elapsed = time.perf_counter() - started
    consumer.close()
    return count / elapsed


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def collector_run(bootstrap: str, topic: str, count: int, setup: str) -> tuple[float, float, float]:
    """Spans/s in steady state, peak RSS in MiB, and the share of the spans measured.

    The rate counts the spans written from the moment the collector is ready (every
    consumer process has joined the group and holds its partitions) and has taken
    its first record, to the last span written. Several consumers joining one group
    rebalance it a few times as they arrive; that start-up is not throughput.
    """
    port = free_port()
    store = tempfile.mkdtemp(prefix="spanmill-bench-store-")
    env = dict(os.environ)
    env.update(
        {
            "SPANMILL_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "SPANMILL_KAFKA_SPANS_TOPIC": topic,
            "SPANMILL_COLLECTOR_GROUP_ID": f"bench-{uuid.uuid4().hex[:8]}",
            "SPANMILL_COLLECTOR_STORE_URL": store,
            "SPANMILL_COLLECTOR_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
            "SPANMILL_COLLECTOR_HTTP_PORT": str(port),
            "SPANMILL_COLLECTOR_RECEIVER_ENABLED": "false",
            # A finite run ends with partial batches; the default 5 s age limit would
            # add that much idle tail to the timing.
            "SPANMILL_COLLECTOR_BATCH_MAX_SECONDS": str(BATCH_MAX_SECONDS),
        }
    )
    for name in ("PROCESSES", "WORKERS", "CPUS"):
        env.pop(f"SPANMILL_COLLECTOR_{name}", None)
    if setup != "auto":
        processes, workers = setup.split("x")
        env["SPANMILL_COLLECTOR_PROCESSES"], env["SPANMILL_COLLECTOR_WORKERS"] = processes, workers
    process = subprocess.Popen(
        [sys.executable, "-m", "spanmill.collector"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    root = psutil.Process(process.pid)
    peak = 0
    started = finished = 0.0
    written_before = 0.0
    url = f"http://127.0.0.1:{port}/metrics"
    ready_url = f"http://127.0.0.1:{port}/readyz"
    deadline = time.monotonic() + 600
    # One client, polled every 100 ms: the watching must not take the collector's CPU.
    client = httpx.Client(timeout=2)
    try:
        while time.monotonic() < deadline:
            try:
                rss = root.memory_info().rss + sum(
                    child.memory_info().rss for child in root.children(recursive=True)
                )
                peak = max(peak, rss)
            except psutil.Error:
                pass
            try:
                text = client.get(url).text
            except httpx.HTTPError:
                time.sleep(0.1)
                continue
            now = time.perf_counter()
            written = _metric(text, "spanmill_collector_spans_written_total")
            if (
                not started
                and _metric(text, "spanmill_collector_records_consumed_total") > 0
                and client.get(ready_url).status_code == 200
            ):
                started, written_before = now, written
            if written >= count:
                finished = now
                break
            time.sleep(0.1)
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=60)
    if not finished:
        raise RuntimeError("the collector did not write every span in time")
    measured = count - written_before
    return measured / (finished - started), peak / 2**20, measured / count


def measure_shape(bootstrap: str, broker: KafkaBroker, per_record: int) -> None:
    """Fill a topic with SPANS spans, ``per_record`` a record, and print each set-up's
    rate against raw consume of the same topic."""
    from kafka import KafkaProducer

    topic = f"bench-spans-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, PARTITIONS)
    records = payloads(SPANS, per_record)
    size = sum(len(value) for _, value in records) / len(records)
    count = len(records)
    producer = KafkaProducer(
        bootstrap_servers=[bootstrap],
        linger_ms=20,
        batch_size=512 * 1024,
        acks=1,
        max_request_size=max(1 << 20, int(size) * 4),
    )
    for key, value in records:
        producer.send(topic, key=key, value=value)
    producer.flush()
    producer.close()
    del records
    print(
        f"\n{SPANS} spans, {per_record} a record ({count} records of {size:,.0f} bytes, "
        f"OTLP protobuf), {PARTITIONS} partitions, {os.cpu_count()} CPUs, {FAST_PATH} decoding"
    )
    # The raw rate moves from run to run on a shared machine: it is measured before,
    # between and after the collector runs, and the ratios use the median.
    default = raw_consume(bootstrap, topic, count, tuned=False) * per_record
    raws = [raw_consume(bootstrap, topic, count) * per_record]
    print(
        f"raw consume (kafka-python, same settings, same process set-up): {raws[0]:,.0f} "
        f"spans/s; in a process left at the defaults: {default:,.0f} spans/s"
    )
    rates = []
    for index, setup in enumerate(SETUPS):
        rate, peak, share = collector_run(bootstrap, topic, SPANS, setup)
        rates.append((setup, rate, peak, share))
        if index == len(SETUPS) // 2 - 1:
            raws.append(raw_consume(bootstrap, topic, count) * per_record)
    raws.append(raw_consume(bootstrap, topic, count) * per_record)
    raw = statistics.median(raws)
    print(
        f"raw consume, {len(raws)} runs: "
        + ", ".join(f"{r:,.0f}" for r in raws)
        + f" spans/s; median {raw:,.0f}"
    )
    auto = layout(available_cpus(), PARTITIONS)
    for setup, rate, peak, share in rates:
        if setup == "auto":
            setup = f"default (auto: {auto.processes}x{auto.workers})"
        print(
            f"collector {setup} (processes x workers): {rate:,.0f} spans/s to "
            f"durable Parquet ({share:.0%} of the spans in steady state), "
            f"ratio {rate / raw:.2f}, peak RSS {peak:,.0f} MiB"
        )


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="spanmill-bench-"))
    broker = KafkaBroker("127.0.0.1", free_port(), work / "kafka", partitions=PARTITIONS)
    running = broker.start()
    try:
        for per_record in SHAPES:
            measure_shape(running.url, broker, per_record)
    finally:
        running.stop()


if __name__ == "__main__":
    if sys.argv[1:2] in (["--raw"], ["--raw-default"]):
        tuned = sys.argv[1] == "--raw"
        print(_raw_consume_here(sys.argv[2], sys.argv[3], int(sys.argv[4]), tuned))
    else:
        main()
