"""Triton's repository API as the controller uses it: what is loaded, load, check it answers.

Triton loads every version present in a model's folder (the configs spanmill
writes use ``version_policy: all``), so "load version 3" means "write version 3
into the folder, then load the model", and "unload version 2" means "remove it
from the folder, then load the model again". Triton swaps versions in without
dropping requests to the ones that stay.

One TritonControl talks to one server. It is also the simplest
:class:`~spanmill.rollout.fleet.TritonFleet`, a fleet of one (the local stack);
on Kubernetes the fleet is every pod of Triton's headless Service.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import httpx

from spanmill.errors import SpanmillError
from spanmill.serving import protocol


class TritonError(SpanmillError):
    """Triton refused or failed a repository or inference request."""


class TritonUnreachable(TritonError):
    """Triton could not be asked at all (connection refused or reset, no pod answering, the
    pods not listed): nothing is said about any model."""


class TritonControl:
    """One Triton server; ``pod`` names it when it is one of several (a Kubernetes pod)."""

    def __init__(self, url: str, *, load_timeout_s: float = 600.0, pod: str | None = None) -> None:
        import tritonclient.http as triton_http

        self.url = url
        self.pod = pod
        self.load_timeout_s = load_timeout_s
        self._http = triton_http
        # A client for each thread: the controller's pass asks what is loaded while its
        # deploy threads load, and tritonclient's HTTP client is not safe across threads.
        self._local = threading.local()
        self._clients: list[Any] = []
        self._clients_lock = threading.Lock()

    @property
    def _client(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._http.InferenceServerClient(
                self.url, connection_timeout=30.0, network_timeout=self.load_timeout_s
            )
            with self._clients_lock:
                self._clients.append(client)
        return client

    def describe(self) -> str:
        return f"Triton pod {self.pod} at {self.url}" if self.pod else f"Triton at {self.url}"

    def members(self) -> list[TritonControl]:
        """A fleet of one: what a version is loaded on when there is a single server."""
        return [self]

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from tritonclient.utils import InferenceServerException

        try:
            return fn(*args, **kwargs)
        except InferenceServerException as exc:
            raise TritonError(f"{self.describe()}: {what}: {exc.message() or exc}") from None
        except Exception as exc:  # connection refused, reset, timeout
            hint = (
                "check that the pod runs"
                if self.pod
                else "check that it runs and SPANMILL_TRITON_HTTP_URL points at it"
            )
            # A connection never made or cut says nothing of the request; a timeout may.
            unreachable = isinstance(exc, ConnectionError | socket.gaierror)
            raise (TritonUnreachable if unreachable else TritonError)(
                f"cannot reach {self.describe()} ({what}): {type(exc).__name__}: {exc}; {hint}"
            ) from None

    def live(self, timeout_s: float = 5.0) -> bool:
        """Whether the server answers at all (it may still be starting, or have nothing loaded).

        A short timeout of its own: a pod that accepts connections and never answers must
        not hold the controller's pass for a load's length.
        """
        import httpx

        try:
            response = httpx.get(f"http://{self.url}/v2/health/live", timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def versions(self, model: str) -> dict[int, str]:
        """Version -> state (READY, LOADING, UNAVAILABLE, ...) of one model, from the index."""
        index = self._call("reading the repository index", self._client.get_model_repository_index)
        found: dict[int, str] = {}
        for entry in index:
            if entry.get("name") == model and str(entry.get("version", "")).isdigit():
                found[int(entry["version"])] = str(entry.get("state", ""))
        return found

    def reasons(self, model: str) -> dict[int, str]:
        index = self._call("reading the repository index", self._client.get_model_repository_index)
        return {
            int(e["version"]): str(e.get("reason", ""))
            for e in index
            if e.get("name") == model and str(e.get("version", "")).isdigit()
        }

    def load(self, model: str) -> None:
        """Load (or reload) a model with the versions its folder holds now."""
        self._call(f"loading {model}", self._client.load_model, model)

    def unload(self, model: str) -> None:
        self._call(f"unloading {model}", self._client.unload_model, model)

    def ready(self, model: str, version: int) -> bool:
        try:
            return bool(self._client.is_model_ready(model, str(version)))
        except Exception:
            return False

    def smoke(self, model: str, version: int, *, flavour: str = "python", lora: str | None = None,
              timeout_s: float = 120.0) -> str:  # fmt: skip
        """Send one short request to exactly this version; return the answer's text.

        Raises TritonError when the version does not answer, answers with an error,
        or says it is another version.
        """
        deadline = time.monotonic() + timeout_s
        while not self.ready(model, version):
            if time.monotonic() > deadline:
                raise TritonError(
                    f"{model} version {version} did not become ready in {timeout_s:.0f}s"
                )
            time.sleep(0.2)
        if flavour == "vllm":
            sampling: dict[str, Any] = {"max_tokens": 2, "temperature": 0}
            if lora:
                sampling["lora_name"] = lora
            answer = self._generate(model, version, {
                "text_input": "Say OK.", "stream": False, "exclude_input_in_output": True,
                "sampling_parameters": json.dumps(sampling),
            })  # fmt: skip
            if "text_output" not in answer:
                raise TritonError(f"{model} version {version} answered without text_output")
            return str(answer["text_output"])
        messages = [{"role": "user", "content": "Say OK."}]
        answer = self._generate(
            model,
            version,
            protocol.generate_body(messages, protocol.GenerationParams(max_tokens=2)),
        )
        try:
            decoded = protocol.decode_final(answer)
        except (KeyError, ValueError) as exc:
            raise TritonError(
                f"{model} version {version} answered out of protocol ({exc}): {answer}"
            ) from None
        if decoded.model_version and decoded.model_version != str(version):
            raise TritonError(
                f"{model} version {version} answered as version {decoded.model_version}: the "
                "version folder holds another version's files"
            )
        return decoded.choices[0].text if decoded.choices else ""

    def _generate(self, model: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
        """The last response of one request to exactly this version, on the generate
        extension's stream: a model may answer in several responses (a slow answer's
        Python-flavour model sends an empty one each second it runs), which the plain
        ``generate`` endpoint refuses."""
        url = f"http://{self.url}/v2/models/{model}/versions/{version}/generate_stream"
        what = f"smoke check of {model} version {version}"
        last: dict[str, Any] = {}
        try:
            with httpx.stream("POST", url, json=body, timeout=self.load_timeout_s) as response:
                if response.status_code != 200:
                    response.read()
                    try:
                        failure = response.json()
                    except ValueError:
                        failure = {"error": response.text[:500]}
                    raise TritonError(f"{self.describe()}: {what}: {failure.get('error', failure)}")
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    event = json.loads(line[5:])
                    if "error" in event:
                        raise TritonError(f"{self.describe()}: {what}: {event['error']}")
                    last = event
        except httpx.HTTPError as exc:
            raise TritonError(f"{self.describe()}: {what}: {type(exc).__name__}: {exc}") from None
        except ValueError as exc:
            raise TritonError(
                f"{self.describe()}: {what}: an answer out of protocol: {exc}"
            ) from None
        if not last:
            raise TritonError(f"{self.describe()}: {what}: no answer")
        return last

    def close(self) -> None:
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
