"""The rollout controller's loop: make Triton and the gateway serve what the aliases say.

Each tick, for each agent: read the desired state (the ``champion`` and
``challenger`` aliases), the persisted rollout state, what Triton holds and how
each version is doing; decide with :mod:`spanmill.rollout.decide`; act; persist.
The same loop runs on one machine and on Kubernetes: only the backend (where
state and routes live, where events go) differs.

Crash safety comes from ordering. MLflow changes first (an alias moved, a
version tagged), then the state, then the routes, which follow from the state;
every tick rewrites routes that disagree with the state and re-derives what an
interrupted step left half done.

One step does not wait for MLflow: a canary whose own signals (the gateway's, or
the span store's) call for a rollback is rolled back while MLflow cannot be read,
so a failing challenger does not keep its traffic through an outage. There the
state goes first, holding what MLflow must still be told (the version tagged
rolled back, its challenger alias removed), then the routes; every pass that
reaches MLflow tells it that before it reads the aliases, so the version is never
staged again, whenever the controller stopped meanwhile.

Deployments (the registry's files written, Triton's load, the smoke check: minutes for
a large model) run on threads of their own. A pass waits up to ``deploy_wait_s`` for
one; past that the agent holds, and its next passes take up the deployment once it has
ended, while every other agent's pass goes on: one agent's slow load never delays
another's canary judgement or rollback. An agent with a deployment under way is left
alone meanwhile (its model repository and engine record have one writer at a time).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spanmill.errors import SpanmillError
from spanmill.gateway.routing import RoutingTable
from spanmill.registry import names
from spanmill.registry.client import Desired, ModelRegistry, RegistryError
from spanmill.rollout import decide
from spanmill.rollout.backend import RolloutBackend
from spanmill.rollout.deployer import (
    Deployer,
    DeployError,
    EngineReloadError,
    PodDeployError,
    ServingUnreachable,
)
from spanmill.rollout.metrics import RolloutMetrics
from spanmill.rollout.schemas import (
    Action,
    AgentState,
    ControllerState,
    Decision,
    Health,
    Move,
    Phase,
    RolloutPolicy,
)
from spanmill.rollout.signals import Signals

log = logging.getLogger(__name__)

HOLD_LOG_EVERY_S = 30.0


class NotLeading(SpanmillError):
    """This replica lost its Lease during a pass: it must not write what it decided."""


class StillDeploying(Exception):
    """The agent's deployment has run past the pass's wait: the pass holds, and a later
    one takes it up once it has ended."""

    def __init__(self, deployment: _Deployment, *, said: bool = False) -> None:
        self.deployment = deployment
        self.said = said  # the pass has already said the agent holds for it
        super().__init__(
            f"deploying version {deployment.version}: {deployment.seconds():.0f}s so far; "
            "the other agents' passes go on meanwhile"
        )


@dataclass
class _Deployment:
    """One agent's deployment under way on the reconciler's deploy threads."""

    version: int
    serving: bool
    future: concurrent.futures.Future[float]
    started: float = field(default_factory=time.monotonic)

    def seconds(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class Stall:
    """A pass that has not moved on: since when (monotonic), at what, and its thread's
    stack now (empty if the thread is gone)."""

    since: float
    what: str
    stack: str

    def idle_s(self) -> float:
        return time.monotonic() - self.since


class Reconciler:
    def __init__(
        self,
        registry: ModelRegistry,
        deployer: Deployer,
        signals: Signals,
        backend: RolloutBackend,
        policy: RolloutPolicy | None = None,
        *,
        agents: Sequence[str] = (),
        metrics: RolloutMetrics | None = None,
        clock: Callable[[], float] = time.time,
        retry_after_s: float = 60.0,
        deploy_wait_s: float | None = None,
        deploy_threads: int = 4,
    ) -> None:
        self.registry = registry
        self.deployer = deployer
        self.signals = signals
        self.backend = backend
        self.policy = policy or RolloutPolicy()
        self.agents = [names.check_agent(a) for a in agents]
        self.metrics = metrics or RolloutMetrics()
        self.clock = clock
        self.retry_after_s = retry_after_s
        # How long a pass waits for a deployment before it holds the agent and goes on to
        # the next (None: until it has ended, one agent after another).
        self.deploy_wait_s = deploy_wait_s
        self._deploy_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=deploy_threads, thread_name_prefix="rollout-deploy"
        )
        self._deploying: dict[str, _Deployment] = {}
        # Agents held for a deployment in this tick: a later step of their pass waits too,
        # whatever version it asks for (a deployment that ends between two steps of one
        # pass is taken up by the next pass, not thrown away for another).
        self._held_now: set[str] = set()
        # Deployments begun before this replica lost its Lease that still run: their
        # agents hold until they end, and their outcomes are never taken up.
        self._orphans: dict[str, _Deployment] = {}
        self.history: collections.deque[Decision] = collections.deque(maxlen=500)
        self._state = ControllerState()
        self._table = RoutingTable()
        self._tick_decisions: list[Decision] = []
        self.last_tick_at: float | None = None
        # When each agent's last hold was logged: a canary waiting on traffic says why
        # every HOLD_LOG_EVERY_S, not on every tick and not never.
        self._hold_logged: dict[str, float] = {}
        # Where the pass under way stands, None between passes: when it last moved on (its
        # start, an agent's step begun), on which thread, and to what. Every call a pass
        # makes is bounded; one that is not, or a bound too long, shows here (stalled()).
        self._progress: tuple[float, int, str] | None = None
        self.metrics.pass_idle.set_function(self._idle_s)
        # Whether this replica may act now (leader election); always, without it.
        self.active: Callable[[], bool] = lambda: True
        # The deployer's clean-ups after a failure are fenced by the same Lease.
        self.deployer.fence = lambda: self.active()

    # -- the loop ------------------------------------------------------------------------

    def run(
        self,
        stop: threading.Event,
        interval_s: float,
        *,
        active: Callable[[], bool] | None = None,
        standby_poll_s: float = 1.0,
    ) -> None:
        """Tick every ``interval_s`` until ``stop`` is set; a failed tick is logged and retried.

        With ``active`` (this replica leads), tick only while it says so, asking again every
        ``standby_poll_s`` meanwhile.
        """
        log.info("rollout controller: %s, every %.1fs", self.backend.describe(), interval_s)
        self.active = active or self.active
        while not stop.is_set():
            if active is not None and not active():
                self._forget_deployments()
                stop.wait(min(interval_s, standby_poll_s))
                continue
            try:
                self.tick()
            except SpanmillError as exc:
                log.error("reconcile failed: %s", exc)
            except Exception:
                log.exception("reconcile failed unexpectedly")
            stop.wait(interval_s)

    def tick(self) -> list[Decision]:
        """One pass over every agent; returns the decisions taken (holds included)."""
        try:
            self._moved_on("reading the state and the agents")
            return self._tick()
        finally:
            self._progress = None

    def stalled(self, after_s: float) -> Stall | None:
        """The pass under way, if it has not moved on for over ``after_s``: what it was at,
        and where its thread is now."""
        progress = self._progress
        if progress is None or time.monotonic() - progress[0] <= after_s:
            return None
        since, thread, what = progress
        frame = sys._current_frames().get(thread)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
        return Stall(since=since, what=what, stack=stack)

    def _moved_on(self, what: str) -> None:
        self._progress = (time.monotonic(), threading.get_ident(), what)

    def _idle_s(self) -> float:
        progress = self._progress
        return 0.0 if progress is None else time.monotonic() - progress[0]

    def _tick(self) -> list[Decision]:
        self._tick_decisions = []
        self._held_now = set()
        self._state, self._table = self.backend.load()
        agents = self.agents or self._known_agents()
        for agent in agents:
            self._moved_on(f"the pass of {agent}")
            if not self.active():
                # The Lease went to another replica mid-pass: leave the rest to it.
                log.warning("no longer leading: the pass stops before %s", agent)
                self._forget_deployments()
                break
            try:
                self._reconcile(agent)
            except NotLeading as exc:
                log.warning("%s", exc)
                self._forget_deployments()
                break
            except SpanmillError as exc:
                self.metrics.errors.labels(agent).inc()
                self._decide(agent, "error", None, str(exc))
            except Exception as exc:  # a bug, or an error not yet named (a full disk):
                # this agent's pass fails, and the agents after it still get theirs.
                log.exception("%s: the pass failed unexpectedly", agent)
                self.metrics.errors.labels(agent).inc()
                self._decide(agent, "error", None, f"{type(exc).__name__}: {exc}")
        self.last_tick_at = self.clock()
        self.metrics.last_reconcile.set(self.last_tick_at)
        return list(self._tick_decisions)

    def state(self, agent: str) -> AgentState | None:
        return self._state.agents.get(agent)

    def close(self) -> None:
        """Wait for the deployments under way to end (they write the model repository and
        load Triton, which a successor must not find half done), then stop the threads."""
        self._deploy_pool.shutdown(wait=True, cancel_futures=True)

    def _forget_deployments(self) -> None:
        """A replica that lost its Lease takes up none of its deployments' outcomes later:
        the leader meanwhile may have deployed, or retired, the same versions. One still
        running holds its agent should this replica lead again before it ends."""
        for agent, deployment in self._deploying.items():
            if not deployment.future.done():
                self._orphans[agent] = deployment
        self._deploying.clear()

    def _known_agents(self) -> list[str]:
        try:
            listed = self.registry.agents()
        except RegistryError as exc:
            # Those the state knows still get their pass: a canary rolls back without MLflow.
            log.warning("listing the agents failed, only those in the state get a pass: %s", exc)
            listed = []
        return sorted(set(listed) | set(self._state.agents))

    # -- one agent -----------------------------------------------------------------------

    def _reconcile(self, agent: str) -> None:
        st = self._state.agents.get(agent) or AgentState(agent=agent)
        orphan = self._orphans.get(agent)
        if orphan is not None and orphan.future.done():
            del self._orphans[agent]
            orphan = None
        under_way = self._deploying.get(agent)
        running = orphan or (under_way if under_way and not under_way.future.done() else None)
        if running is not None:
            # Its deployment writes the agent's model repository and engine record: the
            # agent's pass waits for it, the other agents' do not.
            self._held(agent, StillDeploying(running), st)
            return
        self._pass(agent, st)
        # An ended deployment a whole pass did not take up is one it no longer needs (the
        # registry moved on, or the version is loaded): a later pass that needs it again
        # deploys it afresh. (A pass cut short, by MLflow out of reach say, leaves it to
        # the next one.)
        if under_way is not None and self._deploying.get(agent) is under_way:
            del self._deploying[agent]
            log.info("%s: the deployment of version %d ended; this pass did not need it",
                     agent, under_way.version)  # fmt: skip

    def _pass(self, agent: str, st: AgentState) -> None:
        try:
            try:
                st = self._record_rollbacks(agent, st)
                desired = self.registry.desired(agent)
            except RegistryError:
                st = self._canary_without_registry(agent, st)
                raise

            # The challenger in flight is no longer the one the aliases name.
            if st.phase != Phase.STABLE and st.challenger != desired.challenger:
                if desired.champion is not None and desired.champion == st.challenger:
                    st = self._promoted_by_alias(agent, st)
                else:
                    st = self._stop(agent, st, desired)

            # The champion.
            if desired.champion is not None and desired.champion != st.champion:
                st = self._serve(agent, st, desired.champion)
            elif st.champion is not None and not self.deployer.ready(agent, st.champion):
                st = self._restore(agent, st, st.champion)

            # The challenger.
            challenger = desired.challenger
            if challenger is not None and challenger != st.champion:
                if st.phase in (Phase.STABLE, Phase.DEPLOYING) and (
                    st.champion is None and desired.champion is not None
                ):
                    # The registry has a champion that is not in service yet (it cannot be
                    # loaded, or waits to be tried again): staged now, the challenger would
                    # be served as a first version, all traffic and no canary.
                    self._decide(agent, "hold", challenger,
                                 f"waiting for champion version {desired.champion} to be served",
                                 quiet=True)  # fmt: skip
                elif st.phase in (Phase.STABLE, Phase.DEPLOYING):
                    st = self._stage(agent, st, challenger)
                elif st.phase == Phase.CANARY:
                    st = self._canary(agent, st)

            if agent not in self._deploying:  # its deployment writes what retiring removes
                st = self._retire(agent, st)
        finally:
            # What was done before a failure (MLflow or Triton unreachable mid-pass) is
            # kept, so the next pass does not do it twice.
            self._commit(agent, st)

    def _commit(self, agent: str, st: AgentState) -> None:
        """Persist the agent's state and the route it calls for (only when either changed)."""
        before = self._state.agents.get(agent)
        taken = [d for d in self._tick_decisions if d.agent == agent and d.action != "hold"]
        if taken:
            st = st.model_copy(update={"last_action": taken[-1].action,
                                       "last_reason": taken[-1].reason})  # fmt: skip
        engine = self.deployer.engine(agent)
        route = decide.route_for(st, self.policy, names.triton_model(agent),
                                 vllm=self.deployer.vllm, engine=engine)  # fmt: skip
        if route is None and st.champion is not None and agent not in self._deploying:
            # (While a deployment is under way, it may be writing the engine's record.)
            listed = sorted(engine.versions) if engine is not None else "no engine"
            log.error("%s: the vLLM engine's record lists %s, not every version in service "
                      "(champion %s, challenger %s): the route stays as it was", agent, listed,
                      st.champion, st.challenger)  # fmt: skip
        table = decide.with_route(self._table, names.route(agent), route)
        routes_changed = table is not self._table
        if before == st and not routes_changed:
            return
        if not self.active():
            raise NotLeading(f"{agent}: no longer leading; its state and routes stay unwritten")
        self._state.agents[agent] = st
        self.backend.save(self._state, table if routes_changed else None)
        self._table = table
        self.metrics.challenger_weight.labels(agent).set(decide.challenger_weight(st, self.policy))
        self.metrics.champion.labels(agent).set(st.champion or 0)
        self.metrics.challenger.labels(agent).set(st.challenger or 0)

    # -- steps ---------------------------------------------------------------------------

    def _serve(self, agent: str, st: AgentState, version: int) -> AgentState:
        """The champion alias names another version: put it in service, all traffic.

        A version already loaded (the challenger, or a champion in its grace period)
        is only checked again, which takes one request.
        """
        now = self.clock()
        waiting = self._into_service(agent, st, version, "the champion alias names it")
        if waiting is not None:
            return waiting
        previous = st.champion
        st = decide.serve(st, version, now, self.policy)
        replaced = (
            f"; version {previous} stays loaded for {self.policy.grace_s:.0f}s" if previous else ""
        )
        self._decide(agent, "serve", version, f"the champion alias names it{replaced}",
                     weight=None, status="promoted")  # fmt: skip
        return st

    def _into_service(
        self, agent: str, st: AgentState, version: int, why: str
    ) -> AgentState | None:
        """Deploy ``version`` (or, already loaded, check it again with one request) before
        it takes all traffic: None once it serves; else the state to keep, which tries it
        again after ``retry_after_s``, the failure said."""
        now = self.clock()
        if now < st.retry_at.get(version, 0.0):
            return st
        try:
            self._deployed(agent, version)
        except StillDeploying as exc:
            return self._held(agent, exc, st)
        except DeployError as exc:
            keeping = f"version {st.champion} keeps serving" if st.champion else "nothing serves"
            self._decide(agent, "error", version,
                         f"{why} but it cannot be served ({exc}); {keeping}; retrying in "
                         f"{self.retry_after_s:.0f}s")  # fmt: skip
            return decide.deploy_failed(st, version, now, self.retry_after_s)
        return None

    def _restore(self, agent: str, st: AgentState, version: int) -> AgentState:
        """Triton lost the champion (a restart): load it again; its files stay whatever
        happens, for the next try."""
        now = self.clock()
        if now < st.retry_at.get(version, 0.0):
            return st
        try:
            self._deployed(agent, version, serving=True)
        except StillDeploying as exc:
            return self._held(agent, exc, st)
        except DeployError as exc:
            reason = f"the champion is not loaded in Triton and cannot be loaded again ({exc})"
            self._decide(agent, "error", version, reason)
            return decide.deploy_failed(st, version, now, self.retry_after_s)
        log.info("%s version %d loaded again into Triton", agent, version)
        return st

    def _stage(self, agent: str, st: AgentState, version: int) -> AgentState:
        """Deploy a new challenger; start its canary (or serve it, when there is no champion)."""
        now = self.clock()
        if (
            st.phase == Phase.DEPLOYING
            and st.challenger == version
            and now < st.retry_at.get(version, 0.0)
        ):
            # Its last try failed for a reason not its own (Triton out of reach, an engine
            # that did not reload): tried again once the wait is over.
            return st
        if st.phase == Phase.STABLE:
            st = decide.begin_deploy(st, version, now)
            # Persisted before the (possibly long) deployment: a restart finishes it.
            self._commit(agent, st)
        try:
            seconds = self._deployed(agent, version)
        except StillDeploying as exc:
            return self._held(agent, exc, st)
        except PodDeployError as exc:
            self._pod_failed(agent, version, exc)
            seconds = 0.0
        except ServingUnreachable as exc:
            self._decide(agent, "error", version,
                         f"{exc}; Triton cannot be asked, which says nothing against the "
                         f"version; trying again in {self.retry_after_s:.0f}s")  # fmt: skip
            return decide.deploy_failed(st, version, now, self.retry_after_s)
        except EngineReloadError as exc:
            st, last = decide.engine_reload_failed(st, version, now, self.retry_after_s)
            tries = st.reload_failures[version]
            if last:
                return self._reject(agent, st, f"{exc} ({tries} tries)", had_traffic=False)
            self._decide(agent, "error", version,
                         f"{exc}; the engine serves on without it; trying again in "
                         f"{self.retry_after_s:.0f}s (try {tries} of "
                         f"{decide.ENGINE_RELOAD_TRIES})")  # fmt: skip
            return st
        except DeployError as exc:
            return self._reject(agent, st, str(exc), had_traffic=False)
        if version in st.reload_failures:
            failures = {v: n for v, n in st.reload_failures.items() if v != version}
            st = decide.transition(st, st.phase, now, reload_failures=failures)
        self._decide(
            agent, "deploy", version, f"written, loaded and answering after {seconds:.1f}s"
        )
        now = self.clock()
        if st.champion is None:
            if not self._may_promote(agent, version):
                return st
            self.registry.promote(agent, version, reason="first version", record=False)
            st = decide.promote(st, now, self.policy)
            self._decide(agent, "promote", version,
                         "the first version of this agent: there is no champion to compare with",
                         status="promoted")  # fmt: skip
            return st
        if not self._may_promote(agent, version, "given traffic"):
            return st
        st = decide.start_canary(st, now, self._snapshot(agent, st))
        self._decide(agent, "canary", version, f"against champion version {st.champion}",
                     weight=decide.challenger_weight(st, self.policy), status="canary")  # fmt: skip
        return st

    def _canary(self, agent: str, st: AgentState) -> AgentState:
        assert st.challenger is not None
        version = st.challenger
        if not self.deployer.ready(agent, version):
            try:
                self._deployed(agent, version)
            except StillDeploying as exc:
                return self._held(agent, exc, st)
            except PodDeployError as exc:
                self._pod_failed(agent, version, exc)
            except DeployError as exc:
                return self._reject(agent, st, f"it is no longer loaded: {exc}", had_traffic=True)
        health, champion_health, move = self._judged(agent, st)
        now = self.clock()
        if move.kind == "hold":
            self._decide(agent, "hold", version, move.reason, health=health, quiet=True)
            return st
        if move.kind == "rollback":
            return self._reject(agent, st, move.reason, had_traffic=True, health=health)
        if move.kind == "advance":
            st = decide.advance(st, now, self._snapshot(agent, st), champion_health, self.policy)
            weight = decide.challenger_weight(st, self.policy)
            self._decide(agent, "advance", version, move.reason, weight=weight, health=health)
            return st
        if not self._may_promote(agent, version):
            return st
        self.registry.promote(agent, version, reason=move.reason, record=False)
        st = decide.promote(st, now, self.policy)
        self._decide(agent, "promote", version, move.reason, weight=100.0, health=health,
                     status="promoted")  # fmt: skip
        return st

    def _judged(self, agent: str, st: AgentState) -> tuple[Health, Health | None, Move]:
        """The canary's health, the champion's where the policy compares them, and the move
        they call for."""
        assert st.challenger is not None
        route = names.route(agent)
        since = st.step_started_at if st.step_started_at is not None else self.clock()
        health = self.signals.health(route, st.challenger, since, st.baseline)
        compare = (
            self.policy.max_latency_ratio is not None or self.policy.max_reward_drop is not None
        )
        champion_health: Health | None = None
        if compare and st.champion is not None:
            champion_health = self.signals.health(route, st.champion, since, st.baseline)
        verdict = decide.judge(
            self.policy, health, decide.champion_reference(st, champion_health, self.policy)
        )
        return health, champion_health, decide.next_move(st, self.policy, verdict, self.clock())

    def _canary_without_registry(self, agent: str, st: AgentState) -> AgentState:
        """MLflow cannot be read: a canary that its signals condemn is rolled back all the
        same, to the champion the state knows; MLflow is told on a later pass. Advancing
        and promoting wait for MLflow, which may have rolled the version back meanwhile."""
        if st.phase != Phase.CANARY or st.challenger is None:
            return st
        version = st.challenger
        try:
            health, _, move = self._judged(agent, st)
        except SpanmillError as exc:
            log.warning("%s v%d: the canary cannot be judged either: %s", agent, version, exc)
            return st
        if move.kind != "rollback":
            return st
        st = decide.roll_back(st, self.clock(), self.policy, had_traffic=True,
                              unrecorded=move.reason)  # fmt: skip
        self._decide(agent, "rollback", version, f"{move.reason} (MLflow cannot be reached: "
                     "the version is tagged and its alias removed once it can)", weight=0.0,
                     health=health, record=False)  # fmt: skip
        return st

    def _record_rollbacks(self, agent: str, st: AgentState) -> AgentState:
        """Tell MLflow of the rollbacks made while it could not be reached, as :meth:`_reject`
        would have: the tag first, then the alias."""
        for version, reason in sorted(st.unrecorded_rollbacks.items()):
            aliases = self.registry.aliases(agent)
            # Promoted by hand meanwhile: the registry's word is the later one.
            if aliases.get(names.CHAMPION) != version:
                # Tagged by a pass that stopped before the alias: not recorded twice.
                if not self.registry.version(agent, version).rolled_back:
                    self.registry.record(agent, version, f"{agent} v{version}: rollback: {reason}",
                                         status=names.ROLLED_BACK, reason=reason)  # fmt: skip
                if aliases.get(names.CHALLENGER) == version:
                    self.registry.delete_alias(agent, names.CHALLENGER)
            st = decide.recorded(st, version, self.clock())
            log.info("%s v%d: its rollback is recorded in MLflow", agent, version)
        return st

    def _promoted_by_alias(self, agent: str, st: AgentState) -> AgentState:
        """The champion alias moved onto the challenger (by a person, or by a promotion that
        was interrupted before its state was saved)."""
        version = st.challenger
        assert version is not None
        # Moved while it was still being deployed, it was routed every request while no
        # pod held it.
        waiting = self._into_service(agent, st, version, "the champion alias was moved onto it")
        if waiting is not None:
            return waiting
        challenger_alias = self.registry.aliases(agent).get(names.CHALLENGER)
        if challenger_alias == version:
            self.registry.delete_alias(agent, names.CHALLENGER)
        st = decide.promote(st, self.clock(), self.policy)
        self._decide(agent, "promote", version, "the champion alias was moved onto it",
                     weight=100.0, status="promoted")  # fmt: skip
        return st

    def _stop(self, agent: str, st: AgentState, desired: Desired) -> AgentState:
        """The challenger alias was removed or moved: end this canary."""
        version = st.challenger
        assert version is not None
        try:
            registered = self.registry.version(agent, version)
            rolled_back = registered.rolled_back
            why = registered.tags.get(names.TAG_ROLLOUT_REASON, "") if rolled_back else ""
        except SpanmillError:
            rolled_back, why = False, "the version is gone from the registry"
        if desired.challenger is not None:
            reason = f"superseded by version {desired.challenger}"
        elif rolled_back:
            reason = f"rolled back from the registry: {why or 'no reason given'}"
        else:
            reason = why or "the challenger alias was removed"
        st = decide.roll_back(st, self.clock(), self.policy, had_traffic=st.phase == Phase.CANARY)
        self._decide(agent, "rollback", version, reason, weight=0.0)
        return st

    def _reject(
        self,
        agent: str,
        st: AgentState,
        reason: str,
        *,
        had_traffic: bool,
        health: Health | None = None,
    ) -> AgentState:
        """Take the challenger out: tag why, drop its alias, route all traffic to the champion."""
        version = st.challenger
        assert version is not None
        if not self.active():  # a long deployment may outlast the Lease: the leader decides
            raise NotLeading(f"{agent}: no longer leading; version {version} is not rolled back")
        # Tagged before the alias goes: a version tagged rolled back is never staged
        # again, even if removing its alias fails.
        try:
            self.registry.record(agent, version, f"{agent} v{version}: rollback: {reason}",
                                 status=names.ROLLED_BACK, reason=reason)  # fmt: skip
            if self.registry.aliases(agent).get(names.CHALLENGER) == version:
                self.registry.delete_alias(agent, names.CHALLENGER)
        except RegistryError as exc:
            # MLflow answers reads but refuses the writes (a full or read-only database, a
            # user that may only read): the traffic goes back all the same, and MLflow is
            # told on a later pass (_record_rollbacks), as when it cannot be reached.
            st = decide.roll_back(st, self.clock(), self.policy, had_traffic=had_traffic,
                                  unrecorded=reason)  # fmt: skip
            self._decide(agent, "rollback", version, f"{reason} (MLflow refused the record: "
                         f"{exc}; the version is tagged and its alias removed once it takes "
                         "them)", weight=0.0, health=health, record=False)  # fmt: skip
            return st
        st = decide.roll_back(st, self.clock(), self.policy, had_traffic=had_traffic)
        self._decide(agent, "rollback", version, reason, weight=0.0, health=health,
                     record=False)  # fmt: skip
        return st

    def _retire(self, agent: str, st: AgentState) -> AgentState:
        now = self.clock()
        if st.champion is not None:
            # Versions nobody asked for (left by an interrupted step, or copied in by
            # hand) go too, after the same grace as a replaced champion.
            wanted = {st.champion, st.challenger, *st.retiring}
            strays = [v for v in self.deployer.present(agent) if v not in wanted]
            if strays:
                retiring = dict(st.retiring)
                retiring.update({v: now + self.policy.grace_s for v in strays})
                st = decide.transition(st, st.phase, now, retiring=retiring)
        route = self._table.routes.get(names.route(agent))
        # The routes as last written: a version they still send traffic to stays loaded
        # until a write without it has gone through (the state may be ahead of them).
        routed = {int(b.version) for b in route.backends if b.weight > 0} if route else set()
        for version in decide.due(st, now):
            if version in routed:
                log.info("%s version %d: retired once the routes no longer send it traffic",
                         agent, version)  # fmt: skip
                continue
            if not self.active():  # a deposed leader unloads nothing the leader may route to
                raise NotLeading(f"{agent}: no longer leading; version {version} stays loaded")
            self.deployer.retire(agent, version)
            st = decide.retired(st, version, now)
            try:
                rolled_back = self.registry.version(agent, version).rolled_back
            except SpanmillError:
                rolled_back = True  # gone from the registry: nothing to tag
            self._decide(agent, "retire", version, "unloaded from Triton and removed from the "
                         "model repository", status=None if rolled_back else "retired")  # fmt: skip
        return st

    # -- helpers -------------------------------------------------------------------------

    def _snapshot(self, agent: str, st: AgentState) -> dict[str, Any] | None:
        """The signals' counters a canary step is judged from, of its two versions."""
        versions = [v for v in (st.champion, st.challenger) if v is not None]
        return self.signals.snapshot(names.route(agent), versions)

    def _may_promote(self, agent: str, version: int, step: str = "promoted") -> bool:
        """Asked again just before a promotion, or a canary's first traffic, which may come
        long after the pass began (a deployment, a canary's checks): still leading, and the
        registry still names ``version`` the challenger and has not rolled it back meanwhile
        (by hand, or by a controller that took over). Where not, the next pass does what
        the registry says."""
        if not self.active():
            raise NotLeading(f"{agent}: no longer leading; version {version} is not {step}")
        rolled_back = self.registry.version(agent, version).rolled_back
        named = self.registry.aliases(agent).get(names.CHALLENGER) == version
        if rolled_back or not named:
            why = "it was rolled back" if rolled_back else "the challenger alias moved"
            self._decide(agent, "hold", version, f"not {step}: {why} meanwhile", quiet=True)
            return False
        return True

    def _pod_failed(self, agent: str, version: int, exc: PodDeployError) -> None:
        """One pod cannot take a version the others serve: not the version's fault, so no
        rollback; that pod stays out of traffic, and the next pass tries it again."""
        self.metrics.errors.labels(agent).inc()
        self._decide(agent, "error", version, f"{exc}; it keeps serving on the other pods, "
                     "and that pod stays unready until it takes it", record=False)  # fmt: skip

    def _deployed(self, agent: str, version: int, *, serving: bool = False) -> float:
        """Deploy ``version`` on a deploy thread, or take up the outcome of the one a
        pass before began: its seconds, or its error raised here. StillDeploying where
        it runs past ``deploy_wait_s``."""
        if not self.active():
            raise NotLeading(f"{agent}: no longer leading; version {version} is not deployed")
        if agent in self._held_now:
            # One deployment of an agent at a time, whichever version this step asks for.
            # (A pass begins only once its agent has none running: _reconcile.)
            raise StillDeploying(self._deploying[agent], said=True)
        deployment = self._deploying.pop(agent, None)
        if deployment is not None and (deployment.version, deployment.serving) != (
            version, serving
        ):  # fmt: skip
            deployment = None
        # Ended since a pass before: a version it loaded may be gone since (a Triton
        # restart meanwhile), and is then deployed again rather than given traffic.
        if (
            deployment is not None
            and deployment.future.exception() is None
            and not self.deployer.ready(agent, version)
        ):
            log.info("%s version %d: loaded, and no longer by now; deployed again",
                     agent, version)  # fmt: skip
            deployment = None
        if deployment is None:
            deployment = _Deployment(version, serving, self._deploy_pool.submit(
                self.deployer.deploy, agent, version, serving=serving))  # fmt: skip
        # Waited for, not result(timeout=...): a deployment's own TimeoutError (a slow
        # volume, a socket) is its outcome, not the wait running out.
        concurrent.futures.wait([deployment.future], timeout=self.deploy_wait_s)
        if not deployment.future.done():
            self._deploying[agent] = deployment
            self._held_now.add(agent)
            raise StillDeploying(deployment)
        seconds = deployment.future.result()
        self.metrics.deploy_seconds.labels(agent).set(seconds)
        return seconds

    def _held(self, agent: str, waiting: StillDeploying, st: AgentState) -> AgentState:
        """The pass holds ``agent`` while its deployment goes on: ``st`` stays as it is."""
        if not waiting.said:
            self._decide(agent, "hold", waiting.deployment.version, str(waiting), quiet=True)
        return st

    def _decide(
        self,
        agent: str,
        action: Action,
        version: int | None,
        reason: str,
        *,
        weight: float | None = None,
        health: Health | None = None,
        status: str | None = None,
        quiet: bool = False,
        record: bool = True,
    ) -> Decision:
        decision = Decision(agent=agent, action=action, version=version, reason=reason,
                            at=self.clock(), weight=weight, health=health)  # fmt: skip
        self._tick_decisions.append(decision)
        self.metrics.decisions.labels(agent, action).inc()
        if quiet:
            now = time.monotonic()
            if now - self._hold_logged.get(agent, float("-inf")) >= HOLD_LOG_EVERY_S:
                self._hold_logged[agent] = now
                log.info("%s", decision.message())
            else:
                log.debug("%s", decision.message())
            return decision
        self._hold_logged.pop(agent, None)
        self.history.append(decision)
        level = logging.WARNING if action in ("rollback", "error") else logging.INFO
        log.log(level, "%s", decision.message())
        try:
            self.backend.event(decision)
        except SpanmillError as exc:
            log.warning("decision not recorded as an event: %s", exc)
        if record and version is not None and action != "error":
            try:
                self.registry.record(
                    agent,
                    version,
                    decision.message(),
                    status=status,
                    reason=reason if status == names.ROLLED_BACK else None,
                )
            except SpanmillError as exc:
                log.warning("decision not recorded on the MLflow version: %s", exc)
        return decision
