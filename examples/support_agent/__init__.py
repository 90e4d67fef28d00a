"""An Orbit Notes support agent that knows nothing of spanmill (see README.md)."""
