"""Dataset build speed: an SFT dataset from a span store of 100k and of 1M synthetic spans.

The store is written straight in the span store's Parquet layout (ten spans an
episode: the agent span with its rewards, two LLM calls, two tool calls and five
other spans), then each size is built in a fresh process so its peak RSS is its
own. Prints spans/s, the time ratio between the sizes (10x the spans should
take about 10x the time) and peak RSS. Targets: 1M spans in under 30 s, RSS
under 4 GB.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spanmill import semconv as sc
from spanmill.messages import openai_to_genai
from spanmill.store.layout import BatchId, hour_dir, hour_key
from spanmill.store.schema import SPAN_SCHEMA

SPANS_PER_EPISODE = 10
EPISODES_PER_FILE = 10_000
HOUR_NS = 3600 * 10**9
START_NS = 1_780_000_000 * 10**9
SYSTEM = "You are a calculator agent. Call the calculator tool with a JSON object, then answer."


def _episode_columns(first_episode: int, episodes: int, rng: random.Random) -> dict[str, list]:
    cols: dict[str, list] = {name: [] for name in SPAN_SCHEMA.names}

    def add(**values: object) -> None:
        for name in SPAN_SCHEMA.names:
            cols[name].append(values.get(name))

    for e in range(first_episode, first_episode + episodes):
        trace = f"{e:032x}"
        task = f"calculator/t{rng.randrange(5000)}"
        t0 = START_NS + e * 200_000_000
        a, b = rng.randrange(2, 99), rng.randrange(2, 99)
        question = f"A shop sells {a} boxes of {b} pens each. How many pens in total? (#{e})"
        call = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "calculator",
                        "arguments": json.dumps({"expression": f"{a}*{b}"}),
                    },
                }
            ],
        }
        turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        turn2 = [*turn1, call, {"role": "tool", "tool_call_id": "c1", "content": str(a * b)}]
        success = float(rng.random() < 0.6)
        common = {
            "trace_id": trace,
            "kind": "internal",
            "status_code": "unset",
            "status_message": "",
            "episode_id": trace,
            "scope_name": "bench",
            "scope_version": "",
            "task_id": task,
            "agent_name": "calculator",
            "kafka_topic": "spanmill.spans.v1",
            "kafka_partition": 0,
            "kafka_offset": e,
            "kafka_index": 0,
            "kafka_timestamp": t0 // 10**6,
        }
        add(
            **common,
            span_id=f"{e:012x}0001",
            name="invoke_agent calculator",
            start_time=t0,
            end_time=t0 + 10**8,
            service_name="agent",
            operation_name=sc.OPERATION_INVOKE_AGENT,
            rewards=[
                {
                    "name": "success",
                    "value": success,
                    "response_id": None,
                    "primary": True,
                    "label": None,
                },
                {
                    "name": "valid_call",
                    "value": 1.0,
                    "response_id": f"r{e}a",
                    "primary": False,
                    "label": None,
                },
            ],
        )
        for i, (prompt, answer) in enumerate(
            ((turn1, call), (turn2, {"role": "assistant", "content": str(a * b)}))
        ):
            add(
                **common,
                span_id=f"{e:012x}01{i:02x}",
                name="chat calculator",
                parent_span_id=f"{e:012x}0001",
                start_time=t0 + (i + 1) * 10**7,
                end_time=t0 + (i + 1) * 10**7 + 5 * 10**6,
                service_name="spanmill-gateway",
                operation_name=sc.OPERATION_CHAT,
                model="calculator",
                response_model="calculator",
                model_version="1",
                response_id=f"r{e}{'ab'[i]}",
                input_messages=json.dumps(openai_to_genai(prompt)),
                output_messages=json.dumps(openai_to_genai([answer])),
                input_tokens=60 + 30 * i,
                output_tokens=14 - 10 * i,
                completion_token_ids=list(range(14 - 10 * i)),
            )
        for i in range(2):
            add(
                **common,
                span_id=f"{e:012x}02{i:02x}",
                name="execute_tool calculator",
                start_time=t0 + 15_000_000 + i,
                end_time=t0 + 16_000_000,
                operation_name=sc.OPERATION_EXECUTE_TOOL,
                service_name="agent",
            )
        for i in range(SPANS_PER_EPISODE - 5):
            add(
                **common,
                span_id=f"{e:012x}03{i:02x}",
                name="http GET",
                start_time=t0 + 2 * 10**6 + i,
                end_time=t0 + 3 * 10**6,
                service_name="agent",
                attributes=json.dumps({"http.method": "GET", "http.route": "/lookup"}),
            )
    cols["start_time"] = [
        pa.scalar(v, pa.timestamp("ns", tz="UTC")).value for v in cols["start_time"]
    ]
    return cols


def write_store(root: Path, episodes: int) -> int:
    rng = random.Random(7)
    spans = 0
    for first in range(0, episodes, EPISODES_PER_FILE):
        count = min(EPISODES_PER_FILE, episodes - first)
        cols = _episode_columns(first, count, rng)
        table = pa.table(
            {n: pa.array(cols[n], SPAN_SCHEMA.field(n).type) for n in SPAN_SCHEMA.names},
            schema=SPAN_SCHEMA,
        )
        hour = hour_key(START_NS + first * 200_000_000)
        folder = root / hour_dir(hour)
        folder.mkdir(parents=True, exist_ok=True)
        batch = BatchId("spanmill.spans.v1", 0, first, first + count - 1, f"{first:016x}")
        pq.write_table(table, folder / batch.file_name(), compression="zstd")
        spans += table.num_rows
    return spans


def _measure(store: str, out: str) -> None:
    """Child process: build once, print one JSON line with seconds and peak RSS."""
    import resource

    from spanmill.dataset.output import build_dataset
    from spanmill.dataset.spec import DatasetSpec

    started = time.perf_counter()
    card = build_dataset(
        store, Path(out), DatasetSpec(mode="sft", agent="calculator", min_reward=1.0)
    )
    seconds = time.perf_counter() - started
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "rss_mb": rss_mb, "counts": card["counts"]}))


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-dataset-"))
    results = {}
    for episodes in (10_000, 100_000):
        store = work / f"store-{episodes}"
        t = time.perf_counter()
        spans = write_store(store, episodes)
        print(f"wrote {spans:,} spans in {time.perf_counter() - t:.1f}s", flush=True)
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from bench.dataset_build import _measure; "
                "_measure(sys.argv[1], sys.argv[2])",
                str(store),
                str(work / f"out-{episodes}"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(child.stdout.strip().splitlines()[-1])
        results[spans] = result
        counts = result["counts"]
        print(
            f"{spans:>9,} spans: {result['seconds']:6.2f} s  {spans / result['seconds']:>10,.0f} "
            f"spans/s  peak RSS {result['rss_mb']:,.0f} MB  -> {counts['llm_calls']:,} LLM calls, "
            f"{counts['train']:,} train + {counts['eval']:,} eval rows",
            flush=True,
        )
    small, large = sorted(results)
    ratio = results[large]["seconds"] / results[small]["seconds"]
    print(
        f"time ratio {large:,} / {small:,} spans: {ratio:.1f}x for {large / small:.0f}x the spans "
        f"(linear: {large / small:.0f}x); targets: 1M spans < 30 s, RSS < 4096 MB"
    )


if __name__ == "__main__":
    main()
