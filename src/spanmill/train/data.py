"""Read a dataset folder (:mod:`spanmill.dataset.layout`) and check it before any compute.

Everything a trainer would trip over later, an hour into a GPU job, is refused
here with the file, the row and what to do: a missing folder or file, an empty
split, missing columns, a message list that is not a chat.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spanmill.contracts import EVAL_FILE, TRAIN_FILE, ContractError, DatasetCard
from spanmill.dataset.layout import MODES, REQUIRED_COLUMNS, Mode
from spanmill.train.errors import DatasetError, EmptyDatasetError, MissingColumnsError

# The message columns each mode's trainer reads, and the columns passed on to it.
MESSAGE_COLUMNS: dict[str, tuple[str, ...]] = {
    "sft": ("prompt", "completion"),
    "preference": ("prompt", "chosen", "rejected"),
    "rl": ("prompt", "completion"),
}
TRAINER_COLUMNS: dict[str, tuple[str, ...]] = {
    "sft": ("prompt", "completion", "weight"),
    "preference": ("prompt", "chosen", "rejected"),
    "rl": ("prompt", "completion", "reward"),
}
_ROLES = frozenset({"system", "user", "assistant", "tool"})
# The tools each call was offered, as JSON text (null for none), taken from its
# ``request``: TRL renders a row's ``tools`` into its prompt with the chat template, as
# serving renders a call's (spanmill.serving.generation.render_prompt). Without them a
# template that writes tools into the prompt (Qwen's, Llama's) trains on prompts the
# model is never served.
TOOLS_COLUMN = "tools"


@dataclass(frozen=True)
class Split:
    """One split's rows, as a pyarrow table with the trainer's columns, and as written
    (``full``: rewards and lineage too, which evaluation reads)."""

    name: str
    table: pa.Table
    task_ids: frozenset[str] = field(default_factory=frozenset)
    agents: frozenset[str] = field(default_factory=frozenset)
    full: pa.Table | None = None

    @property
    def rows(self) -> int:
        return int(self.table.num_rows)


@dataclass(frozen=True)
class TrainingData:
    """A checked dataset folder: its mode, splits, card and content digest."""

    folder: Path
    mode: Mode
    train: Split
    eval: Split | None
    card: DatasetCard | None  # None where the folder has none
    digest: str
    weighted: bool

    @property
    def name(self) -> str:
        return (self.card.name if self.card else None) or self.folder.name


def load_training_data(folder: Path) -> TrainingData:
    """Read and check ``folder``; raises a DatasetError naming what is wrong."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DatasetError(
            f"dataset folder {folder} does not exist; build one with the dataset builder "
            f"or pass the folder that holds {TRAIN_FILE}"
        )
    train_path = folder / TRAIN_FILE
    if not train_path.is_file():
        raise DatasetError(f"dataset folder {folder} has no {TRAIN_FILE}; is it a dataset folder?")
    card = _read_card(folder)
    train_table = _read_table(train_path)
    mode = _mode(card, train_table, train_path)
    train = _checked_split("train", train_table, train_path, mode)
    eval_split = None
    eval_path = folder / EVAL_FILE
    if eval_path.is_file():
        eval_table = _read_table(eval_path)
        if eval_table.num_rows:
            eval_split = _checked_split("eval", eval_table, eval_path, mode)
    weighted = False
    if mode == "sft":
        weights = train.table.column("weight").to_pylist()
        weighted = len(set(weights)) > 1
        if weighted:
            train = _mean_weight_one(train)
    return TrainingData(
        folder=folder,
        mode=mode,
        train=train,
        eval=eval_split,
        card=card,
        digest=_digest(folder, card),
        weighted=weighted,
    )


def _read_card(folder: Path) -> DatasetCard | None:
    try:
        return DatasetCard.read_if_present(folder)
    except ContractError as exc:
        raise DatasetError(str(exc)) from None


def _read_table(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"{path} is not a readable Parquet file: {exc}") from None


def _mode(card: DatasetCard | None, table: pa.Table, path: Path) -> Mode:
    declared = card.mode if card else None
    if declared is not None:
        if declared not in MODES:
            raise DatasetError(
                f"dataset card of {path.parent} declares mode {declared!r}; "
                f"known modes: {', '.join(MODES)}"
            )
        return cast(Mode, declared)
    present = set(table.column_names)
    for mode in MODES:
        if set(REQUIRED_COLUMNS[mode]) <= present:
            return mode
    # Without a card, name what the closest mode lacks: that is what the user must fix.
    closest = min(MODES, key=lambda m: len(set(REQUIRED_COLUMNS[m]) - present))
    raise _missing(path, closest, present)


def _missing(path: Path, mode: str, present: set[str]) -> MissingColumnsError:
    missing = [c for c in REQUIRED_COLUMNS[mode] if c not in present]
    return MissingColumnsError(
        f"{path} lacks column{'s' if len(missing) > 1 else ''} {', '.join(missing)} that a "
        f"{mode} dataset needs (it has: {', '.join(sorted(present)) or 'no columns'}); "
        "rebuild the dataset with the current builder"
    )


def _checked_split(name: str, table: pa.Table, path: Path, mode: Mode) -> Split:
    present = set(table.column_names)
    if not set(REQUIRED_COLUMNS[mode]) <= present:
        raise _missing(path, mode, present)
    if table.num_rows == 0:
        raise EmptyDatasetError(
            f"{path} has no rows: the dataset's filters kept no samples; widen the span "
            "window or loosen the reward filter, then build it again"
        )
    for column in MESSAGE_COLUMNS[mode]:
        for row, messages in enumerate(table.column(column).to_pylist()):
            problem = _chat_problem(messages, final_assistant=column != "prompt")
            if problem:
                raise DatasetError(f"{path}, row {row}, column {column}: {problem}")
    if mode == "sft":
        weights = table.column("weight").to_pylist()
        for row, weight in enumerate(weights):
            if weight is None or not math.isfinite(weight) or weight < 0:
                raise DatasetError(
                    f"{path}, row {row}: weight must be a finite number >= 0, got {weight!r}"
                )
        if not any(weights):
            raise EmptyDatasetError(
                f"{path}: every sample has weight 0, so nothing would be learnt"
            )
    return Split(
        name,
        table.select(list(TRAINER_COLUMNS[mode])).append_column(
            TOOLS_COLUMN, pa.array(_offered_tools(table, path), pa.string())
        ),
        task_ids=_distinct(table, "task_id"),
        agents=_distinct(table, "agent"),
        full=table,
    )


def _mean_weight_one(split: Split) -> Split:
    """The split with its weights scaled to a mean of 1: a weight says how much a sample
    counts against the others, and the learning rate means the same whatever the scale
    of the reward the weights came from (rewards of 0 to 100 took steps a hundred times
    those of 0 to 1, and 0.2 on average a fifth)."""
    column = split.table.column("weight")
    scaled = pc.multiply(column, split.table.num_rows / pc.sum(column).as_py())
    table = split.table.set_column(split.table.column_names.index("weight"), "weight", scaled)
    return replace(split, table=table)


def _offered_tools(table: pa.Table, path: Path) -> list[str | None]:
    """Each row's offered tools as JSON text, from its ``request`` column (absent in a
    dataset written by hand: no tools)."""
    if "request" not in table.column_names:
        return [None] * table.num_rows
    offered: list[str | None] = []
    for row, request in enumerate(table.column("request").to_pylist()):
        tools = None
        if request:
            try:
                tools = json.loads(request).get("tools")
            except (ValueError, AttributeError):
                raise DatasetError(
                    f"{path}, row {row}, column request: not a JSON object: {request[:200]!r}"
                ) from None
        if tools is not None and not isinstance(tools, list):
            raise DatasetError(
                f"{path}, row {row}, column request: tools must be a list, "
                f"got {type(tools).__name__}"
            )
        # An empty list is no tools: some templates write their tool preamble for [].
        offered.append(json.dumps(tools) if tools else None)
    return offered


def _distinct(table: pa.Table, column: str) -> frozenset[str]:
    if column not in table.column_names:
        return frozenset()
    return frozenset(str(v) for v in table.column(column).unique().to_pylist() if v)


def _chat_problem(messages: Any, *, final_assistant: bool) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "expected a non-empty list of messages"
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"message {index} is not an object"
        if message.get("role") not in _ROLES:
            return f"message {index} has role {message.get('role')!r}"
        if not isinstance(message.get("content"), str):
            return f"message {index} has no string content"
    if final_assistant and messages[-1]["role"] != "assistant":
        return "the completion must end with an assistant message"
    return None


def _digest(folder: Path, card: DatasetCard | None) -> str:
    if card and card.content_hash:
        return card.content_hash
    return files_digest(folder, (TRAIN_FILE, EVAL_FILE))


def files_digest(folder: Path, names: Iterable[str]) -> str:
    """A hash of the named files in ``folder`` (those present), names and contents."""
    digest = hashlib.sha256()
    for name in names:
        path = folder / name
        if path.is_file():
            digest.update(name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()
