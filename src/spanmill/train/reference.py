"""A dataset of a task's own reference solutions, in the layout the trainers read.

It stands in for traffic where there is none yet: a first model for a new agent,
tests and benchmarks. Each solved instance gives one sample per assistant turn,
stored with the zero-shot prompt, exactly as the dataset builder stores the
LLM calls of real episodes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from spanmill.contracts import EVAL_FILE, TRAIN_FILE, DatasetCard
from spanmill.dataset.build import histogram
from spanmill.dataset.output import SCHEMAS
from spanmill.messages import to_model_messages
from spanmill.tasks.base import PromptStyle, Task, TaskInstance

REFERENCE_MODEL = "reference"


def reference_rows(
    task: Task, instances: Sequence[TaskInstance], prompt_style: PromptStyle = "zero_shot"
) -> list[dict[str, Any]]:
    """One sft row per assistant turn of each instance's reference solution.

    The solutions are the task's own (:meth:`Task.reference_transcript`); a task
    without them raises TaskError.
    """
    rows = []
    for instance in instances:
        transcript = task.reference_transcript(instance)
        opening = task.messages(instance, prompt_style)[:-1]
        episode_id = hashlib.sha256(instance.id.encode()).hexdigest()[:16]
        for turn, message in enumerate(transcript):
            if message["role"] != "assistant":
                continue
            rows.append(
                {
                    "prompt": to_model_messages([*opening, *transcript[:turn]]),
                    "completion": to_model_messages([message]),
                    "weight": 1.0,
                    "reward": 1.0,
                    "sample_id": f"{episode_id}-{turn}",
                    "task_id": instance.id,
                    "episode_id": episode_id,
                    "trace_id": "",
                    "response_id": "",
                    "agent": task.agent_name,
                    "model": REFERENCE_MODEL,
                    "model_version": "",
                    "request": None,
                }
            )
    return rows


def write_reference_dataset(
    task: Task,
    folder: Path,
    *,
    n_train: int,
    n_eval: int,
    seed: int = 0,
    prompt_style: PromptStyle = "zero_shot",
) -> Path:
    """Write train/eval splits of reference solutions and their card into ``folder``.

    Train instances come from the task's train split, eval instances from its
    held-out split, so no task id is in both.
    """
    folder.mkdir(parents=True, exist_ok=True)
    splits = {
        TRAIN_FILE: reference_rows(task, task.instances("train", n_train, seed), prompt_style),
        EVAL_FILE: reference_rows(task, task.instances("heldout", n_eval, seed), prompt_style),
    }
    digest = hashlib.sha256()
    for name, rows in splits.items():
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMAS["sft"]), folder / name)
        digest.update(name.encode())
        digest.update((folder / name).read_bytes())
    # The builder's card, with what a build from spans has and this one lacks left out.
    DatasetCard(
        name=f"{task.name}-reference",
        mode="sft",
        source="reference solutions",
        agent=task.agent_name,
        prompt_style=prompt_style,
        counts={"train": len(splits[TRAIN_FILE]), "eval": len(splits[EVAL_FILE])},
        reward="reference",
        reward_histogram=histogram([1.0] * (len(splits[TRAIN_FILE]) + len(splits[EVAL_FILE]))),
        content_hash=digest.hexdigest(),
    ).write(folder)
    return folder
