"""Container entry point of the rollout controller: settings from SPANMILL_* variables."""

import logging

from spanmill.config import RolloutSettings, load_settings
from spanmill.rollout.service import run

if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run(load_settings(RolloutSettings))
