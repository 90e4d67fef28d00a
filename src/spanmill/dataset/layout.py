"""The on-disk contract of a spanmill dataset, shared by the builder and the trainers.

A dataset is a folder::

    train.parquet   the training split
    eval.parquet    the held-out split (no task id appears in both)
    card.json       the dataset card: counts per filter step, reward histogram,
                    span window, filters, mode and the content hash

Messages are stored in the form the model saw them: ``{"role", "content"}`` with
string content, tool calls rendered as the model writes them (see
:func:`spanmill.messages.to_model_messages`). That is TRL's conversational
prompt-completion format, so trainers take the files as they are, and the loss
falls on the completion only.

Columns by mode:

``sft``
    prompt, completion (lists of messages), weight (float, 1.0 unless weighted by
    reward), reward, plus the lineage columns.
``preference``
    prompt, chosen, rejected (lists of messages), chosen_reward,
    rejected_reward, plus the lineage columns (of the chosen attempt).
``rl``
    prompt, completion, reward, group_id (the task id: attempts at one task form
    a group for GRPO-style advantages), plus the lineage columns.

Lineage columns: sample_id, task_id, episode_id, trace_id, response_id, agent,
model, model_version, and request: the call's stop sequences, token limit and
offered tools as JSON (null when its record has none), so that evaluation can
replay the call as it was made, and training renders the tools into the prompt
(:data:`spanmill.train.data.TOOLS_COLUMN`).
"""

from __future__ import annotations

from typing import Final, Literal

from spanmill import contracts

Mode = Literal["sft", "preference", "rl"]
MODES: Final = ("sft", "preference", "rl")

# The dataset folder's files, named in spanmill.contracts.
TRAIN_FILE: Final = contracts.TRAIN_FILE
EVAL_FILE: Final = contracts.EVAL_FILE
CARD_FILE: Final = contracts.CARD_FILE

LINEAGE_COLUMNS: Final = (
    "sample_id",
    "task_id",
    "episode_id",
    "trace_id",
    "response_id",
    "agent",
    "model",
    "model_version",
    "request",
)
REQUIRED_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "sft": ("prompt", "completion", "weight", "reward"),
    "preference": ("prompt", "chosen", "rejected", "chosen_reward", "rejected_reward"),
    "rl": ("prompt", "completion", "reward", "group_id"),
}
