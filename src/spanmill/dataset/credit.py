"""Credit assignment: which reward each LLM call of an episode is trained on."""

from __future__ import annotations

from spanmill.dataset.episodes import LLMCall, Rewards
from spanmill.dataset.spec import CreditRule


def assign(
    call: LLMCall, rewards: Rewards, name: str, rule: CreditRule, discount: float = 1.0
) -> float | None:
    """The reward ``name`` credited to ``call`` under ``rule``; None when it has none.

    * ``episode``: the episode's reward, to every call of the episode. An episode
      whose only reward of that name is linked to one call takes that value.
    * ``per_call``: the reward linked to this call by its response id, else the
      episode's.
    * ``discounted``: the episode's reward, discounted by ``discount`` per call
      between this call and the episode's last (the last call gets it whole).
    """
    episode_value = rewards.episode_value(call.episode_id, name)
    if rule == "per_call":
        linked = rewards.by_response.get(call.response_id or "", {}).get(name)
        return linked if linked is not None else episode_value
    if episode_value is None:
        return None
    if rule == "discounted":
        return episode_value * discount ** (call.calls_in_episode - 1 - call.index)
    return episode_value
