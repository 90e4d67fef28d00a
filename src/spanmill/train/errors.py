"""What can stop a training run before it spends any compute, each naming its input."""

from __future__ import annotations

from spanmill.errors import SpanmillError


class TrainError(SpanmillError):
    """A training run cannot start or cannot go on."""


class DatasetError(TrainError):
    """A dataset folder is missing, empty, or lacks what its mode needs."""


class EmptyDatasetError(DatasetError):
    """A split has no rows (or only rows without a trainable completion)."""


class MissingColumnsError(DatasetError):
    """A split lacks columns its mode needs; the message names them."""


class CheckpointMismatchError(TrainError):
    """Checkpoints in the output folder come from another dataset or other settings."""


class RewardError(TrainError):
    """An episode lacks a reward the run weighs, or a reward or weight is not a finite number."""
