"""kmock's in-memory Kubernetes API, taught what the real API server does with versions.

kmock 0.8 keeps no ``metadata.resourceVersion``, accepts any write, and answers PUT on an
object 404. The real API server (see the Kubernetes API concepts on resource versions and
optimistic concurrency):

- gives every object a ``metadata.resourceVersion`` and changes it on every write;
- answers 409 Conflict to an update (PUT) or patch whose body carries a
  ``metadata.resourceVersion`` other than the object's current one; without one the write
  is unconditional;
- replaces the whole object on PUT (fields the body leaves out are gone).

Writes are taken one at a time, as the real server orders them, so a version check and
the write it guards cannot interleave with another write.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock import action, method

_WRITES = {method.POST, method.PATCH, method.PUT, method.DELETE}


@attrs.define(kw_only=True)
class VersionedEmulator(kmock.KubernetesEmulator):
    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    _writes: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        if request.resource is None or request.method not in _WRITES:
            return await super()._handle(request)
        async with self._writes:
            if request.method == method.PUT and request.name is not None:
                return await self._replace(request)
            body = request.data if isinstance(request.data, dict) else None
            if request.action == action.UPDATE and body is not None:
                self._check_version(request, body)
            if request.action in (action.CREATE, action.UPDATE) and body is not None:
                body.setdefault("metadata", {})["resourceVersion"] = self._next_version()
            return await super()._handle(request)

    async def _replace(self, request: Any) -> aiohttp.web.StreamResponse:
        body = request.data
        if not isinstance(body, dict):
            raise kmock.KubernetesError(status=400, reason="BadRequest", message="no object")
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                raise kmock.KubernetesError(status=404, reason="NotFound",
                                            message=f"{request.name!r} not found")  # fmt: skip
            self._check_version(request, body)
            replaced = copy.deepcopy(body)
            replaced.setdefault("metadata", {})["resourceVersion"] = self._next_version()
            self._objects[key].history.append(replaced)
            raw = self._objects[key].raw
            await self._buses[request.resource].put({"type": "MODIFIED", "object": raw})
        return aiohttp.web.json_response(raw)

    def _check_version(self, request: Any, body: dict[str, Any]) -> None:
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        key = (request.resource, request.namespace, request.name)
        if not wanted or key not in self._objects or self._objects[key].deleted:
            return
        current = (self._objects[key].get("metadata") or {}).get("resourceVersion")
        if wanted != current:
            resource = request.resource
            kind = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
            raise kmock.KubernetesError(
                status=409,
                reason="Conflict",
                message=(
                    f'Operation cannot be fulfilled on {kind} "{request.name}": the object has '
                    "been modified; please apply your changes to the latest version and try again"
                ),
            )

    def _next_version(self) -> str:
        return str(next(self._versions))


@dataclass
class KubeAPI:
    url: str
    emulator: Any

    def api_client(self) -> Any:
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.ApiClient(configuration)

    def kubeconfig(self, path: Path, namespace: str) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "unused"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test",
                                                       "namespace": namespace}}],
        }))  # fmt: skip
        return path
