"""What each training process runs under torchrun: ``python -m spanmill.train.worker DATASET OUT``.

The settings come from the ``SPANMILL_TRAIN_*`` and ``SPANMILL_MLFLOW_*``
environment (:func:`spanmill.train.launch.settings_env` writes it), the rank and
world from torchrun's. Only rank 0 logs progress; an error a user can act on is
printed as one line, naming the rank, and ends the process with status 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from spanmill.config import load_settings
from spanmill.errors import SpanmillError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spanmill.train.worker")
    parser.add_argument("dataset", type=Path, help="Dataset folder.")
    parser.add_argument("output", type=Path, help="Adapter folder.")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s",
    )
    from spanmill.train import TrainSettings, train

    try:
        train(args.dataset, args.output, load_settings(TrainSettings))
    except SpanmillError as exc:
        print(f"rank {rank}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
