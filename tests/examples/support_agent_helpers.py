"""Helpers for the support agent's tests: importing it, and undoing its instrumentation."""

from __future__ import annotations

import sys
from pathlib import Path

AGENT_DIR = Path(__file__).resolve().parents[2] / "examples" / "support_agent"
# The agent is a folder of its own, not an installed package: import it from there.
if str(AGENT_DIR.parent) not in sys.path:
    sys.path.insert(0, str(AGENT_DIR.parent))


def uninstrument_openai() -> None:
    """Undo ``setup_telemetry`` so that the next test can instrument afresh.

    OpenLLMetry 0.62's ``uninstrument()`` leaves ``Completions.create`` wrapped:
    it names the methods by dotted paths that opentelemetry-instrumentation 0.66's
    ``unwrap`` no longer resolves. Left there, the next instrumentation wraps the
    old wrapper, and the gateway gets the ``traceparent`` of an unexported span.
    """
    from openai.resources.chat.completions import AsyncCompletions, Completions
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.instrumentation.utils import unwrap

    OpenAIInstrumentor().uninstrument()
    for cls in (Completions, AsyncCompletions):
        unwrap(cls, "create")
