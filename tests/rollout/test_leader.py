"""Leader election on a Lease (spanmill.rollout.leader) against kmock's in-memory API, which
keeps resource versions as the real API server does (kube_emulator.py).

The contract is checked step by step on a clock the test moves; then two and three real
controllers (``spanmill rollout`` processes) share one Lease: one acts, a killed leader is
replaced once its Lease expires, a stopped one hands over at once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from spanmill.config import RolloutSettings, load_settings
from spanmill.errors import ConfigError
from spanmill.registry import ModelRegistry
from spanmill.rollout.leader import LeaderElector, default_identity
from spanmill.stack.ports import free_port

NS = "flywheel"
LEASE = "spanmill-rollout"
DURATION, DEADLINE, RETRY = 3, 2.0, 0.5


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def candidate(kube: Any, identity: str, clock: Callable[[], float]) -> LeaderElector:
    return LeaderElector(NS, LEASE, identity, lease_duration_s=DURATION,
                         renew_deadline_s=DEADLINE, retry_period_s=RETRY,
                         api_client=kube.api_client(), clock=clock)  # fmt: skip


def read_lease(kube: Any) -> dict[str, Any]:
    from kubernetes import client

    api = client.CoordinationV1Api(kube.api_client())
    lease: dict[str, Any] = json.loads(
        api.read_namespaced_lease(LEASE, NS, _preload_content=False).data
    )
    return lease


def test_the_api_refuses_a_write_on_a_stale_version(kube) -> None:  # type: ignore[no-untyped-def]
    """The emulator's side of the contract, through the official client."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.CoordinationV1Api(kube.api_client())
    body = {"metadata": {"name": LEASE, "namespace": NS}, "spec": {"holderIdentity": "a"}}
    created = api.create_namespaced_lease(NS, body)
    first = created.metadata.resource_version
    assert first
    patched = api.patch_namespaced_lease(LEASE, NS, {"spec": {"leaseTransitions": 1}})
    assert patched.metadata.resource_version != first
    for write in (
        lambda: api.patch_namespaced_lease(
            LEASE, NS, {"metadata": {"resourceVersion": first}, "spec": {"holderIdentity": "b"}}
        ),
        lambda: api.replace_namespaced_lease(LEASE, NS, created),
    ):
        with pytest.raises(ApiException) as refused:
            write()
        assert refused.value.status == 409
    # A replace on the current version replaces the whole object: what it leaves out is gone.
    current = api.read_namespaced_lease(LEASE, NS)
    current.spec.holder_identity = None
    replaced = api.replace_namespaced_lease(LEASE, NS, current)
    assert replaced.spec.holder_identity is None and replaced.spec.lease_transitions == 1
    assert replaced.metadata.resource_version not in (first, patched.metadata.resource_version)


def test_one_holder_until_its_lease_expires(kube) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    a, b = candidate(kube, "rollout-a", clock), candidate(kube, "rollout-b", clock)

    # No Lease yet: the first candidate creates it and holds it.
    assert a.try_acquire_or_renew() and a.is_leader()
    spec = read_lease(kube)["spec"]
    assert spec["holderIdentity"] == "rollout-a"
    assert (spec["leaseDurationSeconds"], spec["leaseTransitions"]) == (DURATION, 0)
    assert spec["acquireTime"] == spec["renewTime"]
    assert not b.try_acquire_or_renew() and not b.is_leader()
    assert b.holder == "rollout-a"

    # Renewals keep the term (acquireTime) and move renewTime and the resourceVersion.
    clock.advance(1.0)
    before = read_lease(kube)
    assert a.try_acquire_or_renew()
    after = read_lease(kube)
    assert after["spec"]["acquireTime"] == before["spec"]["acquireTime"]
    assert after["spec"]["renewTime"] != before["spec"]["renewTime"]
    assert after["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
    assert not b.try_acquire_or_renew()  # b sees the renewal: its count starts again

    # a stops renewing (a crash). It counts as leader up to the renew deadline only ...
    clock.advance(DEADLINE - 0.1)
    assert a.is_leader() and not b.try_acquire_or_renew()
    clock.advance(0.1)
    assert not a.is_leader()
    # ... which passes before b may take the Lease: at no moment do both act.
    clock.advance(DURATION - DEADLINE - 0.1)
    assert not b.try_acquire_or_renew() and not b.is_leader()
    clock.advance(0.1)
    assert b.try_acquire_or_renew() and b.is_leader()
    spec = read_lease(kube)["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("rollout-b", 1)
    assert spec["acquireTime"] == spec["renewTime"]

    # a comes back: the Lease names b, so a stands by.
    assert not a.try_acquire_or_renew() and not a.is_leader()
    assert a.holder == "rollout-b"


def test_a_leader_that_cannot_renew_stops_before_its_lease_expires(kube) -> None:  # type: ignore[no-untyped-def]
    from kubernetes import client

    clock = Clock()
    a, b = candidate(kube, "rollout-a", clock), candidate(kube, "rollout-b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    # The API server becomes unreachable for a alone.
    unreachable = client.Configuration()
    unreachable.host = f"http://127.0.0.1:{free_port()}"
    a.api = client.CoordinationV1Api(client.ApiClient(unreachable))
    clock.advance(RETRY)
    assert not a.try_acquire_or_renew()
    assert a.is_leader()  # within the renew deadline it still acts
    clock.advance(DEADLINE - RETRY)
    assert not a.try_acquire_or_renew() and not a.is_leader()
    assert not b.try_acquire_or_renew()  # the Lease holds b off a while longer
    clock.advance(DURATION - DEADLINE)
    assert b.try_acquire_or_renew() and b.is_leader()


def test_a_release_hands_over_at_once(kube) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    a, b = candidate(kube, "rollout-a", clock), candidate(kube, "rollout-b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    # Only the holder releases: b's release changes nothing.
    version = read_lease(kube)["metadata"]["resourceVersion"]
    assert not b.release()
    assert read_lease(kube)["metadata"]["resourceVersion"] == version

    assert a.release() and not a.is_leader()
    spec = read_lease(kube)["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
    # No time passes, and b takes it: a released Lease has no holder to wait for.
    assert b.try_acquire_or_renew() and b.is_leader()
    spec = read_lease(kube)["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("rollout-b", 1)


class _ReadTogether:
    """The API as a candidate sees it when every candidate reads before any writes."""

    def __init__(self, api: Any, barrier: threading.Barrier, writes: list[str]) -> None:
        self.api, self.barrier, self.writes = api, barrier, writes

    def read_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        response = self.api.read_namespaced_lease(*args, **kwargs)
        self.barrier.wait(timeout=30)
        return response

    def replace_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        self.writes.append(args[2]["spec"]["holderIdentity"])
        return self.api.replace_namespaced_lease(*args, **kwargs)


def test_candidates_racing_for_an_expired_lease_one_wins(kube) -> None:  # type: ignore[no-untyped-def]
    from kubernetes import client

    api = client.CoordinationV1Api(kube.api_client())
    gone = {"metadata": {"name": LEASE, "namespace": NS},
            "spec": {"holderIdentity": "rollout-gone", "leaseDurationSeconds": DURATION,
                     "leaseTransitions": 4}}  # fmt: skip
    api.create_namespaced_lease(NS, gone)
    clock = Clock()
    racers = [candidate(kube, f"rollout-{n}", clock) for n in ("a", "b", "c")]
    for racer in racers:
        assert not racer.try_acquire_or_renew()  # held, and not expired yet
    clock.advance(DURATION)
    barrier, writes = threading.Barrier(len(racers)), list[str]()
    for racer in racers:
        racer.api = _ReadTogether(racer.api, barrier, writes)
    with ThreadPoolExecutor(len(racers)) as pool:
        won = list(pool.map(lambda racer: racer.try_acquire_or_renew(), racers))
    # All saw the Lease expired and wrote; the API server took exactly one write.
    assert sorted(writes) == ["rollout-a", "rollout-b", "rollout-c"]
    assert won.count(True) == 1
    winner = racers[won.index(True)]
    assert [r.is_leader() for r in racers] == won
    spec = read_lease(kube)["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == (winner.identity, 5)


def test_a_forbidden_lease_says_what_to_do(kube, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    import kmock

    # The chart's Role names its Lease and grants no create: a deleted Lease is refused.
    kube.emulator["post", kmock.resource("coordination.k8s.io", "v1", "leases")] << 403
    with caplog.at_level(logging.WARNING, logger="spanmill.rollout.leader"):
        assert not candidate(kube, "rollout-a", Clock()).try_acquire_or_renew()
    assert f"Lease {NS}/{LEASE} does not exist" in caplog.text
    assert "upgrade the release to restore it" in caplog.text


def test_settings_refuse_a_renew_deadline_past_the_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPANMILL_ROLLOUT_LEASE_DURATION_S", "10")
    monkeypatch.setenv("SPANMILL_ROLLOUT_RENEW_DEADLINE_S", "10")
    with pytest.raises(ConfigError, match=r"SPANMILL_ROLLOUT_RENEW_DEADLINE_S: .*shorter than"):
        load_settings(RolloutSettings)
    monkeypatch.setenv("SPANMILL_ROLLOUT_RENEW_DEADLINE_S", "5")
    monkeypatch.setenv("SPANMILL_ROLLOUT_RETRY_PERIOD_S", "5")
    with pytest.raises(ConfigError, match=r"SPANMILL_ROLLOUT_RETRY_PERIOD_S: .*shorter than"):
        load_settings(RolloutSettings)
    monkeypatch.setenv("SPANMILL_ROLLOUT_RETRY_PERIOD_S", "1")
    settings = load_settings(RolloutSettings)
    assert not settings.leader_election  # off unless asked for: one local controller


def test_a_slow_read_does_not_shorten_the_holders_lease(kube) -> None:  # type: ignore[no-untyped-def]
    """Expiry counts from when the standby saw the record, after its read returned."""
    clock = Clock()
    a, b = candidate(kube, "rollout-a", clock), candidate(kube, "rollout-b", clock)
    assert a.try_acquire_or_renew()
    read = b._read

    def slow_read() -> Any:
        found = read()
        clock.advance(DURATION - 0.5)  # the answer took most of a lease duration
        return found

    b._read = slow_read  # type: ignore[method-assign]
    assert not b.try_acquire_or_renew()
    b._read = read  # type: ignore[method-assign]
    # Counted from before the read, the lease would be over now; counted from the
    # answer, a full duration has not passed and a still holds it.
    clock.advance(1.0)
    assert not b.try_acquire_or_renew() and b.holder == "rollout-a"
    clock.advance(DURATION)
    assert b.try_acquire_or_renew() and b.is_leader()


def test_the_identity_is_the_pod_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPANMILL_ROLLOUT_LEADER_IDENTITY", "spanmill-rollout-7d9f-x2x4q")
    assert load_settings(RolloutSettings).leader_identity == "spanmill-rollout-7d9f-x2x4q"
    # Outside a pod: two processes on one host still differ.
    assert default_identity() != default_identity()


# -- real controllers ------------------------------------------------------------------


class Controller:
    """One ``spanmill rollout`` process, leader election on, seen through its /metrics."""

    def __init__(self, name: str, env: dict[str, str], logs: Path) -> None:
        self.name = name
        self.port = free_port()
        self.log = logs / f"{name}.log"
        env = {**env, "SPANMILL_ROLLOUT_LEADER_IDENTITY": name,
               "SPANMILL_ROLLOUT_HTTP_PORT": str(self.port)}  # fmt: skip
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "spanmill.cli.main", "rollout"],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def leads(self) -> bool:
        return self.metrics()["spanmill_rollout_leader"] == 1

    def reconciled(self) -> float:
        return self.metrics()["spanmill_rollout_last_reconcile_timestamp_seconds"]

    def ready(self) -> bool:
        return httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=5).status_code == 200

    def output(self) -> str:
        return self.log.read_text()

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        return self.process.wait(timeout=60)


def _eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass  # not listening yet
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture
def controllers(kube, tmp_path: Path) -> Iterator[Callable[[str], Controller]]:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SPANMILL_") and k != "KUBERNETES_SERVICE_HOST"}  # fmt: skip
    env.update({
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig", NS)),
        "SPANMILL_HOME": str(tmp_path / "home"),
        "SPANMILL_MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "SPANMILL_ROLLOUT_BACKEND": "kubernetes",
        "SPANMILL_ROLLOUT_NAMESPACE": NS,
        "SPANMILL_ROLLOUT_INTERVAL_S": "0.3",
        "SPANMILL_ROLLOUT_LEADER_ELECTION": "true",
        "SPANMILL_ROLLOUT_LEASE_NAME": LEASE,
        "SPANMILL_ROLLOUT_LEASE_DURATION_S": str(DURATION),
        "SPANMILL_ROLLOUT_RENEW_DEADLINE_S": str(DEADLINE),
        "SPANMILL_ROLLOUT_RETRY_PERIOD_S": str(RETRY),
    })  # fmt: skip
    # The controllers share one registry; it is made before they start, as a server's is.
    assert ModelRegistry(env["SPANMILL_MLFLOW_TRACKING_URI"]).agents() == []
    started: list[Controller] = []

    def start(name: str) -> Controller:
        started.append(Controller(name, env, tmp_path))
        return started[-1]

    try:
        yield start
    finally:
        for controller in started:
            controller.stop(signal.SIGKILL)
            print(f"--- {controller.name}:\n{controller.output()[-4000:]}")  # shown on failure


def test_of_two_controllers_one_acts_and_the_other_takes_over(  # type: ignore[no-untyped-def]
    kube, controllers: Callable[[str], Controller]
) -> None:
    pair = [controllers("rollout-a"), controllers("rollout-b")]
    # Both become ready, the standby too; one leads and reconciles.
    _eventually(lambda: all(c.ready() for c in pair) and any(c.leads() for c in pair),
                timeout=120, what="the controllers did not start")  # fmt: skip
    leader, standby = pair if pair[0].leads() else pair[::-1]
    _eventually(lambda: leader.reconciled() > 0, timeout=30, what="the leader did not reconcile")
    first = leader.reconciled()
    _eventually(lambda: leader.reconciled() > first, timeout=30, what="the leader stopped")
    assert not standby.leads() and standby.reconciled() == 0
    spec = read_lease(kube)["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == (leader.name, 0)
    assert f"{leader.name} leads" in leader.output()
    assert f"{standby.name} stands by" in standby.output()

    # The leader dies without a word: the standby takes over once the Lease expires.
    leader.stop(signal.SIGKILL)
    _eventually(standby.leads, timeout=DURATION + 2 * RETRY + 10, what="no takeover")
    _eventually(lambda: standby.reconciled() > 0, timeout=30, what="the new leader is idle")
    spec = read_lease(kube)["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == (standby.name, 1)

    # A controller stopped on purpose releases the Lease as it goes.
    third = controllers("rollout-c")
    _eventually(third.ready, timeout=120, what="the third controller did not start")
    assert not third.leads() and third.reconciled() == 0
    assert standby.stop(signal.SIGTERM) == 0
    assert read_lease(kube)["spec"]["holderIdentity"] in ("", third.name)
    assert "released Lease" in standby.output()
    _eventually(third.leads, timeout=30, what="the released Lease was not taken")
    _eventually(lambda: third.reconciled() > 0, timeout=30, what="the third controller is idle")
    assert read_lease(kube)["spec"]["leaseTransitions"] == 2
