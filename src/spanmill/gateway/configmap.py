"""The routing table kept in a Kubernetes ConfigMap, watched through the ``kubernetes`` client.

On Kubernetes the rollout controller writes the table into a ConfigMap (key
``routes.json``) and every gateway replica watches it, so a traffic step reaches
all replicas within moments and survives any pod's restart. A table that does
not parse is logged and ignored: the last good one keeps serving.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Protocol

from spanmill.errors import ConfigError
from spanmill.gateway.routing import RoutingFile, RoutingTable
from spanmill.kube import kube_api_client, request_timeout

log = logging.getLogger(__name__)

ROUTES_KEY = "routes.json"
LABELS = {"app.kubernetes.io/name": "spanmill", "app.kubernetes.io/component": "routing"}


class RoutingSource(Protocol):
    """Where the gateway reads its table from, and where the admin endpoint writes it."""

    def current(self) -> RoutingTable: ...

    def write(self, table: RoutingTable) -> None: ...


def parse_reference(reference: str) -> tuple[str, str]:
    """``namespace/name`` -> (namespace, name)."""
    namespace, sep, name = reference.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ConfigError(
            f"SPANMILL_GATEWAY_ROUTING_CONFIGMAP must be namespace/name, got {reference!r}"
        )
    return namespace, name


class ConfigMapRoutes:
    """The latest good routing table of one ConfigMap, kept current by a watch."""

    def __init__(
        self,
        namespace: str,
        name: str,
        *,
        api_client: Any = None,
        key: str = ROUTES_KEY,
        resync_s: float = 300.0,
    ) -> None:
        from kubernetes import client

        self.namespace = namespace
        self.name = name
        self.key = key
        self.resync_s = resync_s
        self.core = client.CoreV1Api(api_client or kube_api_client())
        self._table = RoutingTable()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: Any = None
        self._response: Any = None
        self._synced = threading.Event()
        self._thread = threading.Thread(target=self._run, name="routing-configmap", daemon=True)
        self._thread.start()

    @property
    def source(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    def current(self) -> RoutingTable:
        with self._lock:
            return self._table

    def wait_synced(self, timeout: float) -> bool:
        """True once the ConfigMap was read (or found absent) at least once."""
        return self._synced.wait(timeout)

    def _apply(self, configmap: Any) -> None:
        data = (configmap.data or {}) if configmap is not None else {}
        text = data.get(self.key)
        if text is None:
            return
        try:
            table = RoutingTable.parse(text, f"{self.source} key {self.key}")
        except ConfigError as exc:
            log.error("keeping routing revision %s: %s", self.current().revision, exc)
            return
        with self._lock:
            if table.revision != self._table.revision or table != self._table:
                log.info("routing revision %s from %s", table.revision, self.source)
            self._table = table

    def _read(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._apply(
                self.core.read_namespaced_config_map(
                    self.name, self.namespace, _request_timeout=request_timeout()
                )
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        self._synced.set()

    def _run(self) -> None:
        from kubernetes import watch

        backoff = 0.5
        while not self._stop.is_set():
            try:
                # Read first: a watch only reports changes, and one may have been missed.
                self._read()
                self._watch = watch.Watch()
                for event in self._watch.stream(
                    self._listing(),
                    self.namespace,
                    field_selector=f"metadata.name={self.name}",
                    timeout_seconds=int(self.resync_s),
                    _request_timeout=request_timeout(self.resync_s + 30),
                ):
                    backoff = 0.5
                    obj = event.get("object")
                    if event.get("type") in ("ADDED", "MODIFIED") and _named(obj, self.name):
                        self._apply(obj)
                    if self._stop.is_set():
                        break
            except Exception as exc:
                if self._stop.is_set():
                    break
                log.warning("watching %s: %s; retrying in %.1fs", self.source, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _listing(self) -> Any:
        """The list call, keeping hold of its streaming response so close() can end it.

        The watch only checks for a stop between events; shutting the response
        down is what ends a read that is waiting for the next one.
        """
        list_fn = self.core.list_namespaced_config_map

        @functools.wraps(list_fn)
        def listing(*args: Any, **kwargs: Any) -> Any:
            self._response = list_fn(*args, **kwargs)
            return self._response

        return listing

    def write(self, table: RoutingTable) -> None:
        """Store ``table`` in the ConfigMap (creating it), then serve it at once."""
        write_configmap_routes(self.core, self.namespace, self.name, table, key=self.key)
        with self._lock:
            self._table = table

    def close(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        response = self._response
        if response is not None and hasattr(response, "shutdown"):
            response.shutdown()
        self._thread.join(timeout=5)


def _named(obj: Any, name: str) -> bool:
    metadata = getattr(obj, "metadata", None)
    return metadata is not None and metadata.name == name


def write_configmap_routes(
    core: Any,
    namespace: str,
    name: str,
    table: RoutingTable,
    *,
    key: str = ROUTES_KEY,
    annotations: dict[str, str] | None = None,
    resource_version: str | None = None,
) -> str | None:
    """Merge ``table`` (and annotations) into the ConfigMap, creating it when absent; returns
    the ConfigMap's new resourceVersion.

    With ``resource_version``, the API server refuses the write (409 Conflict) when the
    ConfigMap changed since that version was read.
    """
    from kubernetes.client.exceptions import ApiException

    patch: dict[str, Any] = {"data": {key: table.dumps()}}
    metadata: dict[str, Any] = {}
    if annotations:
        metadata["annotations"] = annotations
    if resource_version:
        metadata["resourceVersion"] = resource_version
    if metadata:
        patch["metadata"] = metadata
    try:
        written = core.patch_namespaced_config_map(
            name, namespace, patch, _request_timeout=request_timeout()
        )
        return _version_of(written)
    except ApiException as exc:
        if exc.status != 404:
            raise
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(LABELS),
            "annotations": dict(annotations or {}),
        },
        "data": {key: table.dumps()},
    }
    return _version_of(
        core.create_namespaced_config_map(namespace, body, _request_timeout=request_timeout())
    )


def _version_of(configmap: Any) -> str | None:
    metadata = getattr(configmap, "metadata", None)
    return getattr(metadata, "resource_version", None) if metadata is not None else None


def routing_source(
    routing_file: Any, routing_configmap: str | None
) -> RoutingFile | ConfigMapRoutes | None:
    """The gateway's routing source from its settings: a ConfigMap, a file, or neither."""
    if routing_configmap:
        namespace, name = parse_reference(routing_configmap)
        return ConfigMapRoutes(namespace, name)
    return RoutingFile(routing_file) if routing_file else None
