"""The rollout's decisions as pure functions over plain data: no MLflow, Triton or clock.

The reconciler gathers facts (aliases, what Triton holds, how each version is
doing), asks these functions what to do, and carries it out.
"""

from __future__ import annotations

from typing import Final

from spanmill.gateway.routing import Backend, Route, RoutingTable
from spanmill.rollout.materialize import Engine
from spanmill.rollout.schemas import (
    VALID_TRANSITIONS,
    AgentState,
    Health,
    Move,
    Phase,
    RolloutPolicy,
    Verdict,
)


class TransitionError(ValueError):
    """A state change the state machine does not allow: a bug, not a user error."""


def transition(state: AgentState, phase: Phase, now: float, **changes: object) -> AgentState:
    """A copy of ``state`` in ``phase`` with ``changes``, checked against the state machine."""
    if phase not in VALID_TRANSITIONS[state.phase]:
        raise TransitionError(f"{state.agent}: {state.phase} cannot become {phase}")
    data = state.model_dump()
    data.update(changes)
    data.update(phase=phase, updated_at=now)
    return AgentState.model_validate(data)


# -- traffic -------------------------------------------------------------------------


def challenger_weight(state: AgentState, policy: RolloutPolicy) -> float:
    """Percent of traffic the challenger takes in this state."""
    if state.phase != Phase.CANARY:
        return 0.0
    return policy.steps[min(state.step, len(policy.steps) - 1)]


def route_for(
    state: AgentState,
    policy: RolloutPolicy,
    triton_model: str,
    *,
    vllm: bool = False,
    engine: Engine | None = None,
) -> Route | None:
    """The gateway route this state calls for; None while there is no champion, and in
    the ``vllm`` flavour where the agent's ``engine`` (None: none in the repository) does
    not list a version the route would give traffic to: the route then stays as it was,
    since such a version has no adapter to name and the base model must not answer for it.

    With a vLLM ``engine`` each version is named by its adapter (the base model by none),
    so moving traffic between versions is this route alone.
    """
    if state.champion is None:
        return None
    share = challenger_weight(state, policy)
    chosen = [(state.champion, 100.0 - share, "champion")]
    if share > 0 and state.challenger is not None:
        chosen.append((state.challenger, share, "challenger"))
    if not vllm:
        backends = [Backend(version=str(v), weight=w, role=r) for v, w, r in chosen]
        return Route(triton_model=triton_model, backends=backends)
    if engine is None or any(v not in engine.versions for v, _, _ in chosen):
        return None
    backends = [
        Backend(version=str(v), weight=w, role=r, lora_name=engine.versions.get(v))
        for v, w, r in chosen
    ]
    return Route(
        triton_model=triton_model, backends=backends, flavour="vllm", base_model=engine.base_model
    )


def with_route(table: RoutingTable, name: str, route: Route | None) -> RoutingTable:
    """``table`` with ``name`` routed by ``route``; a new revision only when something changed.

    A route of None leaves whatever the table holds for ``name`` alone: before the
    first champion, a route written by hand keeps serving.
    """
    if route is None or table.routes.get(name) == route:
        return table
    routes = dict(table.routes)
    routes[name] = route
    return RoutingTable(revision=table.revision + 1, routes=routes)


# -- judging the canary --------------------------------------------------------------


def judge(policy: RolloutPolicy, challenger: Health, champion: Health | None) -> Verdict:
    """Is the challenger healthy enough, judged on this step's traffic?

    Errors are judged from the first request: once more errors have happened than
    a full sample of ``min_requests`` may hold, no later success can make up for
    them, so the rollback does not wait for the sample to fill. Requests refused for a
    full queue, latency and reward are judged on a full sample only.
    """
    reasons: list[str] = []
    sample = max(challenger.requests, policy.min_requests)
    if challenger.errors > policy.max_error_rate * sample:
        reasons.append(
            f"error rate {challenger.errors}/{challenger.requests} is above "
            f"{policy.max_error_rate:.1%}"
        )
    # A full sample is of requests the model answered or failed: a client's bad request
    # or one it gave up on (4xx, 499) says nothing of it, and a version no request reached
    # an answer of (its callers all timed out) was judged healthy on such requests.
    enough = challenger.served >= policy.min_requests and challenger.served > 0
    if (
        challenger.requests >= policy.min_requests
        and champion is not None
        and champion.requests >= policy.min_requests
    ):
        mine = challenger.refused / challenger.requests
        theirs = champion.refused / champion.requests
        if mine > theirs + policy.max_error_rate:
            reasons.append(
                f"{challenger.refused}/{challenger.requests} requests refused as the client's "
                f"or given up by it (4xx), against the champion's {theirs:.1%}"
            )
    # Unlike errors, a full queue can pass with the burst that filled it: judged on a full
    # sample only.
    if (
        challenger.requests >= policy.min_requests
        and policy.max_queue_full_rate is not None
        and challenger.queue_full > policy.max_queue_full_rate * challenger.requests
    ):
        reasons.append(
            f"{challenger.queue_full}/{challenger.requests} requests refused for a full queue, "
            f"above {policy.max_queue_full_rate:.1%}"
        )
    if enough and challenger.p95_latency_s is not None:
        if (
            policy.max_p95_latency_s is not None
            and challenger.p95_latency_s > policy.max_p95_latency_s
        ):
            reasons.append(
                f"latency p95 {challenger.p95_latency_s * 1000:.0f} ms is above "
                f"{policy.max_p95_latency_s * 1000:.0f} ms"
            )
        reference = champion.p95_latency_s if champion is not None else None
        if (
            policy.max_latency_ratio is not None
            and reference
            and champion is not None
            and champion.requests >= policy.min_requests
            and challenger.p95_latency_s > policy.max_latency_ratio * reference
        ):
            reasons.append(
                f"latency p95 {challenger.p95_latency_s * 1000:.0f} ms is more than "
                f"{policy.max_latency_ratio:g}x the champion's {reference * 1000:.0f} ms"
            )
    rewarded = challenger.mean_reward is not None and challenger.rewards >= policy.min_rewards
    if rewarded and challenger.mean_reward is not None:
        if policy.min_mean_reward is not None and challenger.mean_reward < policy.min_mean_reward:
            reasons.append(
                f"mean reward {challenger.mean_reward:.3f} is below {policy.min_mean_reward:.3f}"
            )
        if (
            policy.max_reward_drop is not None
            and champion is not None
            and champion.mean_reward is not None
            and champion.rewards >= policy.min_rewards
            and challenger.mean_reward < champion.mean_reward - policy.max_reward_drop
        ):
            reasons.append(
                f"mean reward {challenger.mean_reward:.3f} is more than "
                f"{policy.max_reward_drop:.3f} below the champion's {champion.mean_reward:.3f}"
            )
    if reasons:
        return Verdict(kind="unhealthy", reasons=tuple(reasons))
    missing = []
    if not enough:
        missing.append(f"{challenger.served}/{policy.min_requests} requests answered")
    wants_reward = policy.min_mean_reward is not None or policy.max_reward_drop is not None
    if wants_reward and not rewarded:
        missing.append(f"{challenger.rewards}/{policy.min_rewards} rewards")
    if missing:
        return Verdict(kind="insufficient", reasons=(f"waiting for {', '.join(missing)}",))
    return Verdict(kind="healthy", reasons=(challenger.describe(),))


def next_move(state: AgentState, policy: RolloutPolicy, verdict: Verdict, now: float) -> Move:
    """Hold, advance to the next step, promote after the last one, or roll back."""
    if verdict.kind == "unhealthy":
        return Move(kind="rollback", reason="; ".join(verdict.reasons))
    started = state.step_started_at if state.step_started_at is not None else now
    left = policy.bake_s - (now - started)
    share = challenger_weight(state, policy)
    if left > 0:
        return Move(kind="hold", reason=f"baking at {share:g}%, {left:.0f}s left")
    if verdict.kind == "insufficient":
        return Move(kind="hold", reason=f"{verdict.reasons[0]} at {share:g}%")
    detail = "; ".join(verdict.reasons)
    if state.step + 1 < len(policy.steps):
        return Move(kind="advance", reason=f"healthy at {share:g}% ({detail})")
    return Move(kind="promote", reason=f"healthy at {share:g}% ({detail})")


# -- state changes -------------------------------------------------------------------


def begin_deploy(state: AgentState, version: int, now: float) -> AgentState:
    return transition(state, Phase.DEPLOYING, now, challenger=version, step=0,
                      step_started_at=None, baseline=None)  # fmt: skip


def start_canary(state: AgentState, now: float, baseline: dict[str, object] | None) -> AgentState:
    return transition(state, Phase.CANARY, now, step=0, step_started_at=now, baseline=baseline,
                      champion_reference=None)  # fmt: skip


def advance(
    state: AgentState,
    now: float,
    baseline: dict[str, object] | None,
    champion: Health | None = None,
    policy: RolloutPolicy | None = None,
) -> AgentState:
    """The next step; ``champion``'s figures over the step that ends are kept as the
    reference for the steps to come where they had traffic enough (see
    :func:`champion_reference`)."""
    reference = state.champion_reference
    if champion is not None and policy is not None and champion.requests >= policy.min_requests:
        reference = champion
    return transition(state, Phase.CANARY, now, step=state.step + 1, step_started_at=now,
                      baseline=baseline, champion_reference=reference)  # fmt: skip


def champion_reference(
    state: AgentState, current: Health | None, policy: RolloutPolicy
) -> Health | None:
    """What a challenger is compared with: the champion's figures over this step, or,
    where the step gives it too little traffic (none at the last step, at 100%), those
    kept from an earlier step, so that the last step is not judged on its absolute
    limits alone. With neither, :func:`judge` has nothing to compare with."""
    if current is not None and current.requests >= policy.min_requests:
        return current
    return state.champion_reference or current


def _retire(retiring: dict[int, float], version: int | None, at: float) -> dict[int, float]:
    out = dict(retiring)
    if version is not None:
        out[version] = min(at, out.get(version, at))
    return out


def serve(state: AgentState, version: int, now: float, policy: RolloutPolicy) -> AgentState:
    """``version`` becomes the champion; the one it replaces is unloaded after the grace."""
    previous = state.champion
    retiring = _retire(
        state.retiring, previous if previous != version else None, now + policy.grace_s
    )
    retiring.pop(version, None)
    retry_at = {v: t for v, t in state.retry_at.items() if v != version}
    if state.phase == Phase.STABLE or state.challenger == version:
        return transition(state, Phase.STABLE, now, champion=version, challenger=None, step=0,
                          step_started_at=None, baseline=None, retiring=retiring,
                          retry_at=retry_at)  # fmt: skip
    # A champion replaced by hand during a canary: the canary goes on against it.
    return transition(state, state.phase, now, champion=version, retiring=retiring,
                      retry_at=retry_at)  # fmt: skip


def promote(state: AgentState, now: float, policy: RolloutPolicy) -> AgentState:
    if state.challenger is None:
        raise TransitionError(f"{state.agent}: nothing to promote")
    return serve(state, state.challenger, now, policy)


def roll_back(
    state: AgentState,
    now: float,
    policy: RolloutPolicy,
    *,
    had_traffic: bool,
    unrecorded: str | None = None,
) -> AgentState:
    """The champion takes all traffic back; the challenger goes once traffic has drained.

    ``unrecorded``: why, where MLflow could not be told yet (see :func:`recorded`)."""
    at = now + policy.drain_s if had_traffic else now
    retiring = _retire(state.retiring, state.challenger, at)
    pending = dict(state.unrecorded_rollbacks)
    if unrecorded is not None and state.challenger is not None:
        pending[state.challenger] = unrecorded
    # Its retries and reload count go with it (they were kept for good, in the one
    # annotation every agent's state shares).
    retry_at, failures = _forget(state, state.challenger)
    return transition(state, Phase.STABLE, now, challenger=None, step=0, step_started_at=None,
                      baseline=None, retiring=retiring, unrecorded_rollbacks=pending,
                      retry_at=retry_at, reload_failures=failures)  # fmt: skip


def _forget(state: AgentState, version: int | None) -> tuple[dict[int, float], dict[int, int]]:
    """The state's retry times and reload counts without ``version``'s."""
    retry_at = {v: t for v, t in state.retry_at.items() if v != version}
    failures = {v: n for v, n in state.reload_failures.items() if v != version}
    return retry_at, failures


def recorded(state: AgentState, version: int, now: float) -> AgentState:
    """MLflow was told of ``version``'s rollback."""
    pending = {v: r for v, r in state.unrecorded_rollbacks.items() if v != version}
    return transition(state, state.phase, now, unrecorded_rollbacks=pending)


def due(state: AgentState, now: float) -> list[int]:
    """Versions whose time to go has come, never the champion or the challenger."""
    keep = {state.champion, state.challenger}
    return sorted(v for v, at in state.retiring.items() if at <= now and v not in keep)


def retired(state: AgentState, version: int, now: float) -> AgentState:
    retiring = {v: t for v, t in state.retiring.items() if v != version}
    retry_at, failures = _forget(state, version)
    return transition(state, state.phase, now, retiring=retiring, retry_at=retry_at,
                      reload_failures=failures)  # fmt: skip


# Tries of a challenger whose vLLM engine does not reload before it is rolled back.
ENGINE_RELOAD_TRIES: Final = 3


def engine_reload_failed(
    state: AgentState, version: int, now: float, retry_after_s: float
) -> tuple[AgentState, bool]:
    """A challenger's engine reload failed with the engine serving on: the state that
    tries it again after ``retry_after_s``, and whether it has had its last try."""
    failures = dict(state.reload_failures)
    failures[version] = failures.get(version, 0) + 1
    state = deploy_failed(state, version, now, retry_after_s)
    state = transition(state, state.phase, now, reload_failures=failures)
    return state, failures[version] >= ENGINE_RELOAD_TRIES


def deploy_failed(state: AgentState, version: int, now: float, retry_after_s: float) -> AgentState:
    """Remember a failed deployment so it is not retried on every tick."""
    retry_at = dict(state.retry_at)
    retry_at[version] = now + retry_after_s
    return transition(state, state.phase, now, retry_at=retry_at)
