"""The collector service's entry point: settings from ``SPANMILL_*`` environment variables.

All the logic lives in :mod:`spanmill.collector`; this file is what the image runs.
"""

from spanmill.collector.run import main

# The collector spawns worker processes, which import this module again.
if __name__ == "__main__":
    main()
