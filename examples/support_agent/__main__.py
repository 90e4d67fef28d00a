"""``python -m support_agent``: the simulated customer (see simulate.py)."""

import sys

from support_agent.simulate import main

sys.exit(main())
