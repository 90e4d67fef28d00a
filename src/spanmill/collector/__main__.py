"""``python -m spanmill.collector``: the collector service, configured from the environment."""

from spanmill.collector.run import main

# Worker processes are spawned, and re-import this module under another name.
if __name__ == "__main__":
    main()
