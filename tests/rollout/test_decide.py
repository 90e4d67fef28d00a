"""The rollout's decisions, as pure functions: no MLflow, Triton or clock."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from spanmill.gateway.routing import RoutingTable
from spanmill.rollout import decide
from spanmill.rollout.schemas import AgentState, Health, Phase, RolloutPolicy, Verdict

POLICY = RolloutPolicy(steps=[5, 25, 50, 100], bake_s=60, min_requests=20, max_error_rate=0.05,
                       grace_s=300, drain_s=5)  # fmt: skip


def canary(step: int = 0, started: float = 1000.0) -> AgentState:
    return AgentState(agent="calc", phase=Phase.CANARY, champion=1, challenger=2, step=step,
                      step_started_at=started)  # fmt: skip


def test_policy_steps_must_grow_to_100() -> None:
    for bad in ([], [5, 5, 100], [50, 25, 100], [5, 50], [0, 100], [5, 150]):
        with pytest.raises(ValidationError):
            RolloutPolicy(steps=bad)
    assert RolloutPolicy(steps=[100]).steps == [100]


def test_route_follows_the_state() -> None:
    stable = AgentState(agent="calc", champion=1)
    route = decide.route_for(stable, POLICY, "calc")
    assert route is not None
    assert [(b.version, b.weight, b.role) for b in route.backends] == [("1", 100, "champion")]
    route = decide.route_for(canary(step=1), POLICY, "calc")
    assert route is not None
    assert [(b.version, b.weight, b.role) for b in route.backends] == [
        ("1", 75, "champion"),
        ("2", 25, "challenger"),
    ]
    # Deploying: the challenger gets nothing until it answered its smoke check.
    deploying = AgentState(agent="calc", phase=Phase.DEPLOYING, champion=1, challenger=2)
    route = decide.route_for(deploying, POLICY, "calc")
    assert route is not None and [b.version for b in route.backends] == ["1"]
    assert decide.route_for(AgentState(agent="calc"), POLICY, "calc") is None


def test_a_vllm_route_names_each_version_by_its_adapter_or_stays_as_it_was() -> None:
    from spanmill.rollout.materialize import Engine

    engine = Engine(base_model="smollm2-135m", versions={1: None, 2: "calc-v2"}, origins={})
    route = decide.route_for(canary(step=1), POLICY, "calc", vllm=True, engine=engine)
    assert route is not None and route.flavour == "vllm"
    assert [(b.version, b.lora_name) for b in route.backends] == [("1", None), ("2", "calc-v2")]
    # A version in service that the engine's record does not list (or no record at all)
    # has no adapter to name: no route, so the one written before stays; the base model
    # (no adapter) must not answer for the challenger.
    lacking = Engine(base_model="smollm2-135m", versions={1: None}, origins={})
    assert decide.route_for(canary(step=1), POLICY, "calc", vllm=True, engine=lacking) is None
    assert decide.route_for(canary(step=1), POLICY, "calc", vllm=True, engine=None) is None


def test_with_route_bumps_the_revision_only_on_change() -> None:
    table = RoutingTable(revision=7)
    route = decide.route_for(canary(), POLICY, "calc")
    changed = decide.with_route(table, "calc", route)
    assert changed.revision == 8 and changed.routes["calc"] == route
    assert decide.with_route(changed, "calc", route) is changed
    assert decide.with_route(changed, "calc", None) is changed


def test_a_full_queue_is_its_own_signal_judged_on_a_full_sample() -> None:
    # Off by default: refusals are not errors; but ten answers are not a sample either.
    swamped = Health(requests=40, errors=0, queue_full=30)
    assert decide.judge(POLICY, swamped, None).kind == "insufficient"
    assert decide.judge(POLICY, Health(requests=60, queue_full=30), None).kind == "healthy"
    strict = POLICY.model_copy(update={"max_queue_full_rate": 0.25})
    verdict = decide.judge(strict, swamped, None)
    assert verdict.kind == "unhealthy"
    assert verdict.reasons == ("30/40 requests refused for a full queue, above 25.0%",)
    # A burst on a step's first requests is not yet a verdict, and within the rate passes.
    assert decide.judge(strict, Health(requests=8, queue_full=8), None).kind == "insufficient"
    assert decide.judge(strict, Health(requests=40, queue_full=10), None).kind == "healthy"


def test_a_version_whose_callers_got_no_answer_is_never_judged_healthy() -> None:
    """Requests a client gave up on (499: the version too slow for its callers) or the
    client's own errors (400: a context too short) counted toward the sample, and the
    errors did not: 25 such requests and no answer were "0/25 errors", healthy, promoted."""
    abandoned = Health(requests=25, errors=0, answered=0)
    assert decide.judge(POLICY, abandoned, None).kind == "insufficient"
    champion = Health(requests=200, errors=1, answered=196)  # 3 of its callers' own errors
    verdict = decide.judge(POLICY, abandoned, champion)
    assert verdict.kind == "unhealthy"
    assert verdict.reasons == (
        "25/25 requests refused as the client's or given up by it (4xx), against the "
        "champion's 1.5%",
    )
    # As many of its callers' errors as the champion's: judged on its answers alone.
    alike = Health(requests=100, errors=0, answered=98)
    assert decide.judge(POLICY, alike, champion).kind == "healthy"


def test_errors_roll_back_before_the_sample_is_full() -> None:
    # 20 requests at 5% allow one error; a second one can never be made up for.
    assert decide.judge(POLICY, Health(requests=3, errors=1), None).kind == "insufficient"
    verdict = decide.judge(POLICY, Health(requests=3, errors=2), None)
    assert verdict.kind == "unhealthy" and "error rate 2/3" in verdict.reasons[0]
    assert decide.judge(POLICY, Health(requests=100, errors=5), None).kind == "healthy"
    assert decide.judge(POLICY, Health(requests=100, errors=6), None).kind == "unhealthy"


def test_latency_and_reward_thresholds() -> None:
    policy = POLICY.model_copy(update={"max_p95_latency_s": 0.5, "max_latency_ratio": 2.0,
                                       "max_reward_drop": 0.1, "min_rewards": 5})  # fmt: skip
    champion = Health(requests=50, p95_latency_s=0.1, mean_reward=0.8, rewards=20)
    slow = Health(requests=30, p95_latency_s=0.6, mean_reward=0.8, rewards=10)
    reasons = decide.judge(policy, slow, champion).reasons
    assert any("above 500 ms" in r for r in reasons) and any(
        "2x the champion" in r for r in reasons
    )
    worse = Health(requests=30, p95_latency_s=0.1, mean_reward=0.6, rewards=10)
    verdict = decide.judge(policy, worse, champion)
    assert verdict.kind == "unhealthy" and "below the champion's 0.800" in verdict.reasons[0]
    unrewarded = Health(requests=30, p95_latency_s=0.1, rewards=2, mean_reward=0.1)
    verdict = decide.judge(policy, unrewarded, champion)
    assert verdict.kind == "insufficient" and "2/5 rewards" in verdict.reasons[0]
    # Latency is judged on a full sample only.
    early = Health(requests=5, p95_latency_s=9.0)
    assert decide.judge(policy, early, champion).kind == "insufficient"


def test_next_move_bakes_then_advances_then_promotes() -> None:
    healthy = Verdict(kind="healthy", reasons=("0/40 errors",))
    state = canary(step=0, started=1000.0)
    move = decide.next_move(state, POLICY, healthy, now=1030.0)
    assert move.kind == "hold" and "30s left" in move.reason
    assert decide.next_move(state, POLICY, healthy, now=1060.0).kind == "advance"
    waiting = Verdict(kind="insufficient", reasons=("waiting for 3/20 requests",))
    move = decide.next_move(state, POLICY, waiting, now=5000.0)
    assert move.kind == "hold" and "3/20 requests at 5%" in move.reason
    last = canary(step=3, started=1000.0)
    assert decide.next_move(last, POLICY, healthy, now=1060.0).kind == "promote"
    bad = Verdict(kind="unhealthy", reasons=("error rate 5/6 is above 5.0%",))
    assert decide.next_move(state, POLICY, bad, now=1001.0).kind == "rollback"


def test_a_whole_rollout_through_the_state_machine() -> None:
    state = AgentState(agent="calc", champion=1)
    state = decide.begin_deploy(state, 2, now=10)
    assert state.phase == Phase.DEPLOYING and state.challenger == 2
    state = decide.start_canary(state, now=20, baseline={"x": 1})
    assert (state.phase, state.step, state.step_started_at) == (Phase.CANARY, 0, 20)
    for step in (1, 2, 3):
        state = decide.advance(state, now=20 + step, baseline=None)
        assert state.step == step
    assert decide.challenger_weight(state, POLICY) == 100
    state = decide.promote(state, now=100, policy=POLICY)
    assert (state.phase, state.champion, state.challenger) == (Phase.STABLE, 2, None)
    # The old champion is kept for the grace period, then retired.
    assert state.retiring == {1: 400}
    assert decide.due(state, now=399) == [] and decide.due(state, now=400) == [1]
    state = decide.retired(state, 1, now=400)
    assert state.retiring == {}


def test_the_last_step_compares_with_the_champion_of_the_steps_before() -> None:
    """At 100% the champion answers nothing; a challenger twice as slow as it was must
    still fail the latency ratio there, not pass on error rate alone."""
    policy = POLICY.model_copy(update={"max_latency_ratio": 1.5})
    champion = Health(requests=300, errors=0, p95_latency_s=0.1)
    slow = Health(requests=300, errors=0, p95_latency_s=0.3)
    state = canary(step=2)
    state = decide.advance(state, now=2000, baseline=None, champion=champion, policy=policy)
    assert decide.challenger_weight(state, policy) == 100
    silent = Health(requests=0)  # this step sends the champion nothing
    reference = decide.champion_reference(state, silent, policy)
    assert reference == champion
    verdict = decide.judge(policy, slow, reference)
    assert verdict.kind == "unhealthy" and "1.5x the champion" in verdict.reasons[0]
    # Without the kept figures, the comparison would not run at all.
    assert decide.judge(policy, slow, silent).kind == "healthy"
    # Where the champion has traffic of its own, this step's figures are the reference,
    # and a step with too little of it keeps the older ones.
    busy = Health(requests=50, p95_latency_s=0.2)
    assert decide.champion_reference(state, busy, policy) == busy
    kept = decide.advance(state, now=2100, baseline=None, champion=Health(requests=3),
                          policy=policy)  # fmt: skip
    assert kept.champion_reference == champion
    # A new canary starts with none.
    restarted = decide.start_canary(AgentState(agent="calc", phase=Phase.DEPLOYING, champion=1,
                                               challenger=3, champion_reference=champion),
                                    now=3000, baseline=None)  # fmt: skip
    assert restarted.champion_reference is None


def test_rollback_drains_before_unloading_only_after_traffic() -> None:
    state = decide.roll_back(canary(step=2), now=100, policy=POLICY, had_traffic=True)
    assert (state.phase, state.champion, state.challenger) == (Phase.STABLE, 1, None)
    assert state.retiring == {2: 105}
    deploying = AgentState(agent="calc", phase=Phase.DEPLOYING, champion=1, challenger=3)
    state = decide.roll_back(deploying, now=100, policy=POLICY, had_traffic=False)
    assert state.retiring == {3: 100}


def test_invalid_transitions_are_refused() -> None:
    with pytest.raises(decide.TransitionError):
        decide.start_canary(AgentState(agent="calc", champion=1), now=1, baseline=None)
    with pytest.raises(ValidationError):
        AgentState(agent="calc", phase=Phase.CANARY, champion=1)


def test_serving_a_new_champion_by_hand_during_a_canary_keeps_the_canary() -> None:
    state = decide.serve(canary(step=1), 7, now=50, policy=POLICY)
    assert (state.phase, state.champion, state.challenger, state.step) == (Phase.CANARY, 7, 2, 1)
    assert state.retiring == {1: 350}
    # Serving a version that was waiting to retire keeps it.
    back = decide.serve(state, 1, now=60, policy=POLICY)
    assert 1 not in back.retiring and back.retiring[7] == 360


def test_state_survives_json() -> None:
    state = decide.start_canary(decide.begin_deploy(AgentState(agent="c", champion=1), 2, 5), 6,
                                {"requests": {"2": {"200": 3.0}}})  # fmt: skip
    state = state.model_copy(update={"retiring": {4: 9.5}})
    again = AgentState.model_validate_json(state.model_dump_json())
    assert again == state


def test_a_version_gone_takes_its_retries_and_reload_count_with_it() -> None:
    """Kept for good, a rolled-back or retired version's retry time and reload failures
    grew the one annotation every agent's state shares (a re-staged version started
    from its old count, rejected after one more try)."""
    state = decide.begin_deploy(decide.serve(AgentState(agent="a"), 1, 0.0, POLICY), 2, 1.0)
    state, _ = decide.engine_reload_failed(state, 2, 2.0, 60.0)
    state = decide.deploy_failed(state, 7, 2.0, 60.0)
    assert state.retry_at.keys() == {2, 7} and state.reload_failures == {2: 1}
    back = decide.roll_back(state, 3.0, POLICY, had_traffic=False)
    assert back.retry_at.keys() == {7} and back.reload_failures == {}
    gone = decide.retired(back, 7, 4.0)
    assert gone.retry_at == {} and gone.reload_failures == {}
