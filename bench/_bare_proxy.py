"""The floor of a Python proxy in front of Triton, for ``bench/gateway_overhead.py``.

``python -m bench._bare_proxy TRITON_URL PORT`` serves a bare ASGI app on the server
the gateway runs on (uvicorn with uvloop and httptools): a POST's JSON body (``model``,
``messages``, ``max_tokens``) goes to the model's ``generate_stream`` as the gateway
sends it, on aiohttp as the gateway does, and the final answer's text comes back.
No routing table, validation, keys, limits, metrics or spans: what it adds over calling
Triton directly is what any Python proxy of the request adds on this machine, so the
gateway's overhead can be read against it in the same run.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import aiohttp
import uvicorn

from spanmill.serving import protocol
from spanmill.serving.protocol import GenerationParams


class BareProxy:
    def __init__(self, triton_url: str) -> None:
        self.triton_url = triton_url
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if self.session is not None:
                await self.session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["method"] != "POST":  # a readiness probe
            await self._answer(send, b"{}")
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body)
        if self.session is None:
            self.session = aiohttp.ClientSession(f"http://{self.triton_url}")
        payload = protocol.generate_body(
            request["messages"], GenerationParams(max_tokens=request["max_tokens"])
        )
        path = f"/v2/models/{request['model']}/versions/1/generate_stream"
        text = ""
        async with self.session.post(path, json=payload) as response:
            async for line in response.content:
                if line.startswith(b"data:"):
                    event = json.loads(line[5:])
                    if protocol.is_final(event):
                        text = protocol.decode_final(event).choices[0].text
        await self._answer(send, json.dumps({"text": text}).encode())

    @staticmethod
    async def _answer(send: Any, body: bytes) -> None:
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":
    triton_url, port = sys.argv[1], int(sys.argv[2])
    uvicorn.run(
        BareProxy(triton_url), host="127.0.0.1", port=port, log_level="warning", access_log=False
    )
