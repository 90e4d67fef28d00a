"""The agent SDK: trace agent episodes with OpenTelemetry and send them to spanmill.

A minimal agent::

    from spanmill import sdk

    sdk.configure("billing-agent", agent_name="billing")
    client = openai.OpenAI(base_url=gateway_url, http_client=sdk.traced_http_client())
    with sdk.episode(task_id=ticket.id):
        reply = client.chat.completions.create(...)   # the gateway's span joins the trace
        with sdk.tool_call("lookup_invoice", call_id, arguments) as call:
            call.set_result(lookup(...))
        sdk.emit_reward("resolved", 1.0, primary=True)
    sdk.shutdown()
"""

from spanmill.sdk.episode import Episode, current_episode, emit_reward, episode, tool_call
from spanmill.sdk.exporter import KafkaSpanExporter
from spanmill.sdk.propagation import traced_async_http_client, traced_http_client
from spanmill.sdk.tracing import configure, force_flush, shutdown

__all__ = [
    "Episode",
    "KafkaSpanExporter",
    "configure",
    "current_episode",
    "emit_reward",
    "episode",
    "force_flush",
    "shutdown",
    "tool_call",
    "traced_async_http_client",
    "traced_http_client",
]
