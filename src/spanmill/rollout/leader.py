"""Leader election on a ``coordination.k8s.io/v1`` Lease: of several controller replicas,
only the holder of the Lease reconciles; the others stand by and take over when it goes.

The contract is the one Kubernetes' own controllers follow:

- The Lease names its holder (``holderIdentity``), how long one renewal holds the others
  off (``leaseDurationSeconds``), when the holder took it (``acquireTime``) and last
  renewed it (``renewTime``), and how often it changed hands (``leaseTransitions``).
- A candidate takes the Lease when it is absent, released (no holder), already its own,
  or expired. Expired is judged on the candidate's own monotonic clock: the holder's
  ``leaseDurationSeconds`` counted from the moment the candidate last saw the record
  change, so the clocks of different nodes are never compared.
- The holder renews every retry period. A holder that has not renewed for the renew
  deadline (shorter than the lease duration) stops acting, before any candidate can
  consider the Lease expired.
- Every write carries the ``resourceVersion`` it read: of two candidates racing for one
  expired Lease the API server takes one write and answers the other 409 Conflict.
- A holder that stops on purpose releases the Lease (no holder, renewed now), so a
  standby takes over at once instead of after the lease duration.

The controller asks :meth:`LeaderElector.is_leader` before each pass
(``Reconciler.run``); renewals run in a thread of their own, so a long pass (a deploy)
does not let the Lease lapse. A pass under way when the leader steps down runs to its
end: stepping down means the API server was out of reach, so its routes and state writes
fail too, and the next leader re-derives whatever it left half done (reconciler.py).

The Lease is read and replaced as plain JSON, so times written by other clients are kept
exactly as they were.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from spanmill.config import RolloutSettings
from spanmill.kube import request_timeout

log = logging.getLogger(__name__)

# Candidates retry at a jittered period, so that several do not hit the API in step.
JITTER = 1.2
# The fields of the Lease's spec whose change shows that its holder is alive.
RECORD = ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions")


def default_identity() -> str:
    """The host and a random suffix, where no identity is set (on a cluster the chart sets
    the pod's name, ``SPANMILL_ROLLOUT_LEADER_IDENTITY``).

    The suffix keeps two processes on one host (or a restarted one) from sharing an identity.
    """
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _now() -> str:
    """The API's MicroTime: RFC 3339, always six fractional digits, UTC."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquire, renew and release one Lease; :meth:`is_leader` says whether to act now."""

    def __init__(
        self,
        namespace: str,
        name: str,
        identity: str | None = None,
        *,
        lease_duration_s: int = 15,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        api_client: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError(
                f"leader election needs 0 < retry period ({retry_period_s}) < renew deadline "
                f"({renew_deadline_s}) < lease duration ({lease_duration_s})"
            )
        from kubernetes import client

        if api_client is None:
            from spanmill.kube import kube_api_client

            api_client = kube_api_client()
        self.api = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_duration_s = int(lease_duration_s)
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.clock = clock
        self._lock = threading.Lock()
        self._renewed_at: float | None = None  # when the last successful write was sent
        self._record: tuple[Any, ...] | None = None  # the Lease's spec as last seen
        self._observed_at = 0.0  # when that record was first seen
        self._contact_at: float | None = None  # the last answer from the API server
        self._holder: str | None = None
        self._reported: bool | None = None
        self._error: str | None = None

    @classmethod
    def from_settings(cls, settings: RolloutSettings, *, api_client: Any = None) -> LeaderElector:
        return cls(
            settings.namespace,
            settings.lease_name,
            settings.leader_identity,
            lease_duration_s=settings.lease_duration_s,
            renew_deadline_s=settings.renew_deadline_s,
            retry_period_s=settings.retry_period_s,
            api_client=api_client,
        )

    def describe(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    # -- what the controller asks -------------------------------------------------------

    def is_leader(self) -> bool:
        """True while this candidate holds the Lease and renewed it within the renew deadline.

        Judged on the clock alone, so a leader whose renewals hang stops acting on time.
        """
        with self._lock:
            renewed = self._renewed_at
        return renewed is not None and self.clock() - renewed < self.renew_deadline_s

    def in_touch(self) -> bool:
        """Whether the API server answered within the lease duration (a healthy standby)."""
        with self._lock:
            contact = self._contact_at
        return contact is not None and self.clock() - contact < self.lease_duration_s

    @property
    def holder(self) -> str | None:
        """The holder the Lease named when last read (None: nobody)."""
        return self._holder

    # -- the loop -----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Acquire and renew until ``stop`` is set, then release the Lease if this one holds it."""
        log.info("leader election on %s as %s", self.describe(), self.identity)
        try:
            while not stop.is_set():
                self.try_acquire_or_renew()
                self._report()
                period = self.retry_period_s
                if not self.is_leader():
                    period *= random.uniform(1.0, JITTER)
                stop.wait(period)
        finally:
            if self.release():
                self._reported = False  # said by release()
            self._report()

    def try_acquire_or_renew(self) -> bool:
        """One attempt: read the Lease, then take or renew it when the contract allows.

        Returns whether this attempt took or renewed the Lease. API errors are logged
        (once per distinct error) and count as a failed attempt.
        """
        from kubernetes.client.exceptions import ApiException

        started = self.clock()
        lease: dict[str, Any] | None = {}
        try:
            lease = self._read()
            if lease is None:
                return self._create(started)
            spec = lease.get("spec") or {}
            # Expiry counts from when this candidate saw the record, after the read: a
            # slow read must not shorten the holder's lease as seen from here.
            self._observe(spec, self.clock())
            holder = spec.get("holderIdentity") or None
            if holder != self.identity:
                with self._lock:
                    self._renewed_at = None  # whatever we thought, another holds it now
                if holder is not None and not self._expired(spec):
                    return False
            return self._won(self._replace(lease, self._taken(spec, holder)), started)
        except ApiException as exc:
            if exc.status == 409:  # another candidate wrote first; read again next time
                self._contacted()
                log.debug("%s changed while %s wrote it", self.describe(), self.identity)
                return False
            self._failed(exc, creating=lease is None)
            return False
        except Exception as exc:  # connection refused, timeouts
            self._failed(exc)
            return False

    def release(self) -> bool:
        """Give the Lease up if this candidate holds it: no holder, so a standby takes it now."""
        with self._lock:
            held = self._renewed_at is not None
            self._renewed_at = None  # stop acting before the write, not after it
        if not held:
            return False
        try:
            lease = self._read()
            spec = (lease or {}).get("spec") or {}
            if lease is None or spec.get("holderIdentity") != self.identity:
                return False
            now = _now()
            released = {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": spec.get("leaseTransitions") or 0,
            }
            self._replace(lease, released)
            self._holder = None
        except Exception as exc:
            log.warning("could not release %s (%s); a standby takes over when it expires",
                        self.describe(), _reason(exc))  # fmt: skip
            return False
        log.info("released %s", self.describe())
        return True

    # -- steps --------------------------------------------------------------------------

    def _timeout(self) -> float:
        # One request may not outlast the renew deadline by itself.
        return max(self.retry_period_s, self.renew_deadline_s / 2)

    def _read(self) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.api.read_namespaced_lease(
                self.name,
                self.namespace,
                _preload_content=False,
                _request_timeout=request_timeout(self._timeout()),
            )
        except ApiException as exc:
            if exc.status == 404:
                self._contacted()
                return None
            raise
        self._contacted()
        lease: dict[str, Any] = json.loads(response.data)
        return lease

    def _create(self, started: float) -> bool:
        now = _now()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_duration_s,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        response = self.api.create_namespaced_lease(
            self.namespace,
            body,
            _preload_content=False,
            _request_timeout=request_timeout(self._timeout()),
        )
        return self._won(json.loads(response.data), started)

    def _taken(self, spec: dict[str, Any], holder: str | None) -> dict[str, Any]:
        """The spec this candidate writes: a renewal of its own term, or a new term."""
        now = _now()
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            acquired = spec.get("acquireTime") or now
        else:
            acquired = now
            if holder is not None or spec.get("acquireTime"):
                transitions += 1  # it changes hands (a Lease never held before does not)
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_duration_s,
            "acquireTime": acquired,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def _replace(self, lease: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        """Replace the Lease's spec; the body keeps the resourceVersion read, so a Lease
        another candidate changed since is refused with 409 Conflict."""
        body = {**lease, "spec": spec}
        response = self.api.replace_namespaced_lease(
            self.name, self.namespace, body, _preload_content=False,
            _request_timeout=request_timeout(self._timeout()),
        )  # fmt: skip
        self._contacted()
        written: dict[str, Any] = json.loads(response.data)
        return written

    def _won(self, lease: dict[str, Any], started: float) -> bool:
        spec = lease.get("spec") or {}
        self._observe(spec, started)
        with self._lock:
            self._renewed_at = started  # the others' clocks started no earlier than this
            self._contact_at = self.clock()
            self._error = None
        return True

    def _observe(self, spec: dict[str, Any], now: float) -> None:
        record = tuple(spec.get(key) for key in RECORD)
        if record != self._record:
            self._record, self._observed_at = record, now
        self._holder = spec.get("holderIdentity") or None

    def _expired(self, spec: dict[str, Any]) -> bool:
        duration = spec.get("leaseDurationSeconds") or self.lease_duration_s
        return self.clock() >= self._observed_at + duration

    def _contacted(self) -> None:
        with self._lock:
            self._contact_at = self.clock()

    def _failed(self, exc: Exception, *, creating: bool = False) -> None:
        reason = _reason(exc)
        if getattr(exc, "status", None) == 403:
            reason += (
                f"; {self.describe()} does not exist and this service account may not create "
                "it: the chart creates it, so upgrade the release to restore it"
                if creating
                else f"; the controller's service account needs get and update on "
                f"{self.describe()} (the chart renders it and grants exactly that)"
            )
        if reason != self._error:
            log.warning("leader election on %s failed: %s", self.describe(), reason)
            self._error = reason

    def _report(self) -> None:
        """Log each change of role, once."""
        leading = self.is_leader()
        if leading == self._reported:
            return
        if leading:
            log.info("%s leads: holds %s", self.identity, self.describe())
        elif self._reported:
            why = (
                f"no renewal of {self.describe()} within {self.renew_deadline_s:g}s"
                if self.holder == self.identity
                else f"{self.describe()} names {self.holder or 'nobody'}"
            )
            log.warning("%s stopped leading: %s", self.identity, why)
        else:
            log.info("%s stands by; %s names %s", self.identity, self.describe(),
                     self.holder or "nobody")  # fmt: skip
        self._reported = leading


def _reason(exc: Exception) -> str:
    return str(getattr(exc, "reason", None) or exc)
