"""Fine-tuning: LoRA through PEFT with TRL's trainers (SFT, DPO), tracked in MLflow.

``train(dataset_dir, output_dir, settings)`` is the entry point; see
:mod:`spanmill.train.trainer` for what it writes and how it resumes.
TRL, PEFT and the models load when training starts.
"""

from spanmill.train.data import TrainingData, load_training_data
from spanmill.train.errors import (
    CheckpointMismatchError,
    DatasetError,
    EmptyDatasetError,
    MissingColumnsError,
    TrainError,
)
from spanmill.train.reference import write_reference_dataset
from spanmill.train.settings import TrainSettings
from spanmill.train.trainer import MANIFEST_FILE, TrainResult, train

__all__ = [
    "MANIFEST_FILE",
    "CheckpointMismatchError",
    "DatasetError",
    "EmptyDatasetError",
    "MissingColumnsError",
    "TrainError",
    "TrainResult",
    "TrainSettings",
    "TrainingData",
    "load_training_data",
    "train",
    "write_reference_dataset",
]
