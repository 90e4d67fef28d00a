"""GRPO's numbers: group-relative advantages and the clipped loss over multi-turn episodes.

A group is k episodes of one task instance, sampled from the policy the endpoint
served. Each episode gets one reward (the primary reward, or a weighted mix of
named rewards: :func:`weighted_rewards`), and one advantage relative to its group
(:func:`group_advantages`). The loss (:func:`grpo_loss`) then pushes every
completion token of every LLM call in the episode by that advantage, through an
importance ratio against the logprobs the gateway recorded when the token was
sampled; prompts and tool results are in the sequence for context only, and
their mask is 0.

Where this matches TRL's ``GRPOTrainer`` (the training stack spanmill uses):

- advantages are ``scale_rewards="group"`` (std with Bessel's correction, plus
  ``epsilon`` = 1e-4), or ``scale_rewards="none"`` with ``scale_rewards=False``
  (Dr. GRPO: centred, not scaled); reward weights sum as
  ``multi_objective_aggregation="sum_then_normalize"``;
- the per-token loss is TRL's clipped surrogate with ``epsilon_low`` /
  ``epsilon_high``, token-level importance sampling, and the k3 KL estimator
  times ``beta`` added per token;
- ``normalize="token"`` (the default) is ``loss_type="bnpo"``: one mean over
  every completion token in the batch, so long episodes weigh by their length.
  Within one batch, without gradient accumulation, ``loss_type="dapo"`` gives
  the same number. ``normalize="sequence"`` is ``loss_type="grpo"``: a mean per
  episode, then a mean over episodes.

Where spanmill differs: a group whose rewards are all equal gets advantages of
exactly 0 (not a rounding residue of its mean), so it contributes no gradient;
the old logprobs are always the sampler's (the episode was sampled outside the
trainer); and masked positions may hold anything (a prompt token has no sampled
logprob), since they are replaced before any arithmetic, so a NaN there cannot
reach the loss or the gradient.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import torch

from spanmill.train.errors import RewardError

Normalize = Literal["token", "sequence"]

# The keys of the stats :func:`grpo_loss` returns, averaged over completion tokens.
CLIP_RATIO = "clip_ratio"
CLIP_RATIO_LOW = "clip_ratio/low"
CLIP_RATIO_HIGH = "clip_ratio/high"
RATIO_MEAN = "ratio_mean"
KL = "kl"


def weighted_rewards(
    episode_rewards: Sequence[Mapping[str, float]], reward_weights: Mapping[str, float]
) -> list[float]:
    """One reward per episode: the sum of its named rewards times their weights.

    The primary reward alone is ``{primary: 1.0}``. Rewards not in
    ``reward_weights`` are ignored; an episode lacking a weighted one is refused,
    since scoring it 0 would bias its group's baseline.
    """
    if not reward_weights:
        raise RewardError(
            "no reward weights given: name at least one reward, e.g. {'primary': 1.0}"
        )
    for name, weight in reward_weights.items():
        if not math.isfinite(weight):
            raise RewardError(f"the weight of reward {name!r} is {weight}, not a finite number")
    mixed = []
    for index, rewards in enumerate(episode_rewards):
        total = 0.0
        for name, weight in reward_weights.items():
            if name not in rewards:
                raise RewardError(
                    f"episode {index} has no reward {name!r} (it has {sorted(rewards) or 'none'}); "
                    "drop the episode, or leave the reward out of the weights"
                )
            value = float(rewards[name])
            if not math.isfinite(value):
                raise RewardError(
                    f"episode {index}: reward {name!r} is {value}, not a finite number"
                )
            total += weight * value
        mixed.append(total)
    return mixed


def group_advantages(
    rewards: Sequence[float], *, scale_rewards: bool = True, epsilon: float = 1e-4
) -> list[float]:
    """The advantages of one group's episodes: ``(r - mean) / (std + epsilon)``.

    ``std`` has Bessel's correction. Without ``scale_rewards`` the advantage is
    ``r - mean`` (Dr. GRPO), so a group's spread does not set its step size. A
    group whose rewards are all equal, or of one episode, says nothing about
    which attempt was better: its advantages are exactly 0.
    """
    if not rewards:
        raise RewardError("a group has no episodes; a group needs at least one reward")
    values = [float(r) for r in rewards]
    for index, value in enumerate(values):
        if not math.isfinite(value):
            raise RewardError(
                f"episode {index} of the group has reward {value}, not a finite number"
            )
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    if min(values) == max(values):
        return [0.0] * len(values)
    mean = math.fsum(values) / len(values)
    centred = [value - mean for value in values]
    if not scale_rewards:
        return centred
    std = math.sqrt(math.fsum(c * c for c in centred) / (len(values) - 1))
    return [c / (std + epsilon) for c in centred]


def grpo_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    ref_per_token_logps: torch.Tensor | None = None,
    beta: float = 0.0,
    normalize: Normalize = "token",
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped policy-gradient loss of a batch of episodes, and its stats.

    Tensors are ``(episodes, tokens)``: ``per_token_logps`` from the policy being
    trained (with grad), ``old_per_token_logps`` recorded at sampling time,
    ``completion_mask`` 1 on the completion tokens of every LLM call and 0 on
    prompts, tool results and padding; ``advantages`` is ``(episodes,)``.

    Per token, with ``ratio = exp(new - old)`` and ``A`` its episode's advantage::

        loss_t = -min(ratio * A, clip(ratio, 1 - epsilon_low, 1 + epsilon_high) * A)
                 + beta * (exp(ref - new) - (ref - new) - 1)

    averaged over the completion tokens of the whole batch (``normalize="token"``)
    or per episode and then over episodes (``"sequence"``). The KL term needs
    ``ref_per_token_logps``; with them and ``beta=0`` it is still reported.

    Stats, each a mean over the batch's completion tokens: ``clip_ratio`` (the
    tokens whose clipped term was taken, so their gradient is 0), split into
    ``clip_ratio/low`` (ratio below ``1 - epsilon_low``, A < 0) and
    ``clip_ratio/high`` (above ``1 + epsilon_high``, A > 0); ``ratio_mean``;
    and ``kl`` when reference logprobs are given.
    """
    mask = _check_inputs(
        per_token_logps,
        old_per_token_logps,
        completion_mask,
        advantages,
        ref_per_token_logps,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        beta=beta,
        normalize=normalize,
    )
    weights = mask.to(per_token_logps.dtype)
    # Masked positions take the policy's own (detached) values, so whatever the
    # recorder left there (0, NaN) gives ratio 1 and KL 0, and its gradient is 0
    # once multiplied by the mask; torch.where alone would let a NaN's gradient through.
    current = per_token_logps.detach()
    old = torch.where(mask, old_per_token_logps.to(current.dtype), current)
    ratio = torch.exp(per_token_logps - old)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    advantage = advantages.to(per_token_logps.dtype).unsqueeze(1)
    per_token_loss = -torch.min(ratio * advantage, clipped * advantage)

    per_token_kl = None
    if ref_per_token_logps is not None:
        ref = torch.where(mask, ref_per_token_logps.to(current.dtype), current)
        delta = ref - per_token_logps
        per_token_kl = torch.exp(delta) - delta - 1
        if beta != 0.0:
            per_token_loss = per_token_loss + beta * per_token_kl

    tokens = weights.sum()
    if normalize == "token":
        loss = (per_token_loss * weights).sum() / tokens
    else:
        loss = ((per_token_loss * weights).sum(dim=1) / weights.sum(dim=1)).mean()

    with torch.no_grad():
        low = (ratio < 1 - epsilon_low) & (advantage < 0) & mask
        high = (ratio > 1 + epsilon_high) & (advantage > 0) & mask
        stats = {
            CLIP_RATIO: ((low | high).sum() / tokens).item(),
            CLIP_RATIO_LOW: (low.sum() / tokens).item(),
            CLIP_RATIO_HIGH: (high.sum() / tokens).item(),
            RATIO_MEAN: ((ratio * weights).sum() / tokens).item(),
        }
        if per_token_kl is not None:
            stats[KL] = ((per_token_kl * weights).sum() / tokens).item()
    return loss, stats


def _check_inputs(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    ref_per_token_logps: torch.Tensor | None,
    *,
    epsilon_low: float,
    epsilon_high: float,
    beta: float,
    normalize: str,
) -> torch.Tensor:
    """Refuses inputs the loss would silently get wrong; returns the mask as booleans."""
    if per_token_logps.dim() != 2:
        raise ValueError(
            f"per_token_logps must be (episodes, tokens), got shape {tuple(per_token_logps.shape)}"
        )
    shape = per_token_logps.shape
    named = {"old_per_token_logps": old_per_token_logps, "completion_mask": completion_mask}
    if ref_per_token_logps is not None:
        named["ref_per_token_logps"] = ref_per_token_logps
    for name, tensor in named.items():
        if tensor.shape != shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)}, per_token_logps {tuple(shape)}: "
                "they must align token for token"
            )
    if advantages.shape != shape[:1]:
        raise ValueError(
            f"advantages must be one per episode, shape ({shape[0]},), "
            f"got {tuple(advantages.shape)}"
        )
    if not 0 <= epsilon_low < 1 or epsilon_high < 0:
        raise ValueError(
            f"clip range needs 0 <= epsilon_low < 1 and epsilon_high >= 0, "
            f"got epsilon_low={epsilon_low}, epsilon_high={epsilon_high}"
        )
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta > 0 and ref_per_token_logps is None:
        raise ValueError(f"beta={beta} weighs a KL term, which needs ref_per_token_logps")
    if normalize not in ("token", "sequence"):
        raise ValueError(f"normalize must be 'token' or 'sequence', got {normalize!r}")

    mask = completion_mask.bool()
    if not torch.equal(mask.to(completion_mask.dtype), completion_mask):
        raise ValueError("completion_mask must hold only 0 and 1")
    empty = (~mask.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"episodes {empty} have no completion tokens; leave them out of the batch")
    if not torch.isfinite(advantages).all():
        raise ValueError("advantages must be finite numbers")
    for name, tensor in named.items():
        if name != "completion_mask" and not torch.isfinite(tensor[mask]).all():
            raise ValueError(f"{name} is not finite on some completion tokens")
    return mask
