"""The files the flywheel's steps hand each other, each named in this one place.

- a dataset folder (``build_dataset``): :data:`TRAIN_FILE`, :data:`EVAL_FILE` and the
  dataset card :data:`CARD_FILE` (:mod:`spanmill.dataset.layout` says what is in them);
- a trained model folder (``train_lora``, ``train_rl``): the adapter and the training
  manifest :data:`TRAIN_MANIFEST_FILE` (base model, dataset digest and lineage, the
  MLflow run), which the registry reads when it registers the version;
- an evaluation folder (``evaluate``): :data:`METRICS_FILE` (metrics and the gate's
  decision) and :data:`OUTCOMES_FILE` (each replayed call's outcome).

Only names live here, so that any step may import it without the others' libraries.
"""

from __future__ import annotations

from typing import Final

TRAIN_FILE: Final = "train.parquet"
EVAL_FILE: Final = "eval.parquet"
CARD_FILE: Final = "card.json"
TRAIN_MANIFEST_FILE: Final = "spanmill-train.json"
METRICS_FILE: Final = "metrics.json"
OUTCOMES_FILE: Final = "outcomes.jsonl"
