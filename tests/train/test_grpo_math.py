"""GRPO's advantages and loss against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from spanmill.train.errors import RewardError
from spanmill.train.grpo import (
    CLIP_RATIO,
    CLIP_RATIO_HIGH,
    CLIP_RATIO_LOW,
    KL,
    RATIO_MEAN,
    group_advantages,
    grpo_loss,
    weighted_rewards,
)

NAN = float("nan")


# --- advantages ---------------------------------------------------------------


def test_advantages_scaled_by_the_groups_std() -> None:
    # mean 0.5; std with Bessel's correction: sqrt(4 * 0.25 / 3) = sqrt(1/3).
    unit = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert group_advantages([1, 0, 0, 1]) == pytest.approx([unit, -unit, -unit, unit], abs=1e-12)
    half_root3 = math.sqrt(3) / 2  # 0.5 / sqrt(1/3)
    assert group_advantages([1, 0, 0, 1], epsilon=0.0) == pytest.approx(
        [half_root3, -half_root3, -half_root3, half_root3]
    )


def test_advantages_without_std_scaling_are_centred_rewards() -> None:
    assert group_advantages([1, 0, 0, 1], scale_rewards=False) == [0.5, -0.5, -0.5, 0.5]
    # The spread does not set the step: the same ranking with rewards 10x apart.
    assert group_advantages([10, 0, 0, 10], scale_rewards=False) == [5.0, -5.0, -5.0, 5.0]
    # Std scaling undoes the 10x.
    assert group_advantages([10, 0, 0, 10], epsilon=0.0) == pytest.approx(
        group_advantages([1, 0, 0, 1], epsilon=0.0)
    )


def test_uneven_group_by_hand() -> None:
    # rewards [2, 0, 1]: mean 1, deviations [1, -1, 0], std sqrt(2 / 2) = 1.
    assert group_advantages([2, 0, 1], epsilon=0.0) == pytest.approx([1.0, -1.0, 0.0])


@pytest.mark.parametrize("rewards", [[0.1, 0.1, 0.1], [1.0] * 4, [0.0, 0.0], [0.7]])
@pytest.mark.parametrize("scale", [True, False])
def test_a_group_of_equal_rewards_has_advantages_exactly_zero(
    rewards: list[float], scale: bool
) -> None:
    assert group_advantages(rewards, scale_rewards=scale) == [0.0] * len(rewards)


def test_a_group_needs_finite_rewards() -> None:
    with pytest.raises(RewardError, match="no episodes"):
        group_advantages([])
    with pytest.raises(RewardError, match=r"episode 1 .* nan"):
        group_advantages([1.0, NAN])


# --- weighted rewards ---------------------------------------------------------


def test_weighted_mix_of_named_rewards() -> None:
    episodes = [
        {"correct": 1.0, "format": 0.5, "unused": 9.0},
        {"correct": 0.0, "format": 1.0},
    ]
    weights = {"correct": 1.0, "format": 0.2}
    assert weighted_rewards(episodes, weights) == pytest.approx([1.1, 0.2])
    assert weighted_rewards(episodes, {"correct": 1.0}) == [1.0, 0.0]


def test_a_missing_named_reward_is_refused_by_name() -> None:
    episodes = [{"correct": 1.0, "format": 0.5}, {"correct": 0.0}]
    with pytest.raises(
        RewardError, match=r"episode 1 has no reward 'format' \(it has \['correct'\]\)"
    ):
        weighted_rewards(episodes, {"correct": 1.0, "format": 0.2})
    with pytest.raises(RewardError, match="no reward weights"):
        weighted_rewards(episodes, {})
    with pytest.raises(RewardError, match="'correct' is nan"):
        weighted_rewards([{"correct": NAN}], {"correct": 1.0})


# --- loss ---------------------------------------------------------------------

# Two episodes, four positions each, epsilon 0.2 (clip range [0.8, 1.2]).
# Episode 0, A = +1: a prompt token, then completion tokens with ratios 1.1, 1.5, 1.0.
# Episode 1, A = -1: completion tokens with ratios 0.5, 1.3, then two tool-result tokens.
MASK = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])
RATIOS = torch.tensor([[1.0, 1.1, 1.5, 1.0], [0.5, 1.3, 1.0, 1.0]])
ADVANTAGES = torch.tensor([1.0, -1.0])
# Per-token loss -min(r * A, clip(r) * A):
#   ep 0: r 1.1 -> -1.1; r 1.5 -> -min(1.5, 1.2) = -1.2 (clipped high); r 1.0 -> -1.0
#   ep 1: r 0.5 -> -min(-0.5, -0.8) = 0.8 (clipped low); r 1.3 -> -min(-1.3, -1.2) = 1.3
TOKEN_LOSS = (-1.1 - 1.2 - 1.0 + 0.8 + 1.3) / 5  # -0.24
SEQUENCE_LOSS = ((-1.1 - 1.2 - 1.0) / 3 + (0.8 + 1.3) / 2) / 2  # -0.025


def _logps(ratios: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """New logprobs (leaf, with grad) and old ones giving ``ratios``; NaN where masked."""
    base = torch.linspace(-2.0, -0.5, ratios.numel(), dtype=torch.float64).reshape(ratios.shape)
    new = base.clone().requires_grad_(True)
    old = base - torch.log(ratios.to(torch.float64))
    old = torch.where(mask.bool(), old, torch.full_like(old, NAN))
    return new, old


def test_loss_by_hand_token_normalised() -> None:
    new, old = _logps(RATIOS, MASK)
    loss, stats = grpo_loss(new, old, MASK, ADVANTAGES)
    assert loss.item() == pytest.approx(TOKEN_LOSS)
    assert stats[CLIP_RATIO] == pytest.approx(2 / 5)
    assert stats[CLIP_RATIO_LOW] == pytest.approx(1 / 5)
    assert stats[CLIP_RATIO_HIGH] == pytest.approx(1 / 5)
    assert stats[RATIO_MEAN] == pytest.approx((1.1 + 1.5 + 1.0 + 0.5 + 1.3) / 5)
    assert KL not in stats

    loss.backward()
    assert new.grad is not None
    # d/d new of -r * A / N is -A * r / N where unclipped; 0 where clipped or masked.
    expected = torch.tensor(
        [[0.0, -1.1 / 5, 0.0, -1.0 / 5], [0.0, 1.3 / 5, 0.0, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(new.grad, expected)


def test_loss_by_hand_sequence_normalised() -> None:
    new, old = _logps(RATIOS, MASK)
    loss, stats = grpo_loss(new, old, MASK, ADVANTAGES, normalize="sequence")
    assert loss.item() == pytest.approx(SEQUENCE_LOSS)
    assert stats[CLIP_RATIO] == pytest.approx(2 / 5)  # stats stay per token
    loss.backward()
    assert new.grad is not None
    # Each episode's tokens weigh 1 / (its tokens * episodes).
    expected = torch.tensor(
        [[0.0, -1.1 / 6, 0.0, -1.0 / 6], [0.0, 1.3 / 4, 0.0, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(new.grad, expected)


def test_asymmetric_clip_range() -> None:
    # epsilon_high 0.6 lets ratio 1.5 through for A > 0: its term is -1.5 and unclipped.
    new, old = _logps(RATIOS, MASK)
    loss, stats = grpo_loss(new, old, MASK, ADVANTAGES, epsilon_low=0.2, epsilon_high=0.6)
    assert loss.item() == pytest.approx((-1.1 - 1.5 - 1.0 + 0.8 + 1.3) / 5)
    assert stats[CLIP_RATIO_HIGH] == 0.0
    assert stats[CLIP_RATIO_LOW] == pytest.approx(1 / 5)


def test_prompt_and_tool_tokens_get_no_gradient() -> None:
    new, old = _logps(RATIOS, MASK)
    ref = torch.where(MASK.bool(), new.detach() + 0.3, torch.full_like(old, NAN))
    loss, stats = grpo_loss(new, old, MASK, ADVANTAGES, ref_per_token_logps=ref, beta=0.5)
    assert torch.isfinite(loss)
    assert all(math.isfinite(value) for value in stats.values())
    loss.backward()
    assert new.grad is not None
    assert torch.all(new.grad[~MASK.bool()] == 0)
    assert torch.all(new.grad[MASK.bool()] != 0)  # the KL term reaches even clipped tokens


def test_a_group_with_equal_rewards_contributes_no_gradient() -> None:
    # Group A (episodes 0, 1) learns; group B (episodes 2, 3) all scored 0.3.
    advantages = torch.tensor(group_advantages([1.0, 0.0]) + group_advantages([0.3, 0.3]))
    assert advantages[2:].tolist() == [0.0, 0.0]
    mask = torch.tensor([[0, 1, 1], [1, 1, 0], [0, 1, 1], [1, 1, 1]])
    ratios = torch.tensor([[1.0, 1.1, 0.9], [1.0, 1.05, 1.0], [1.0, 1.5, 0.7], [1.1, 1.0, 0.95]])
    new, old = _logps(ratios, mask)
    for normalize in ("token", "sequence"):
        new.grad = None
        loss, _ = grpo_loss(new, old, mask, advantages, normalize=normalize)  # type: ignore[arg-type]
        loss.backward()
        assert new.grad is not None
        assert torch.all(new.grad[2:] == 0)
        assert torch.any(new.grad[:2] != 0)


def test_kl_term_is_the_k3_estimator_by_hand() -> None:
    # A = 0, so only the KL term is left. ref - new = [ln 2, 0, -ln 2]:
    #   k3 = e^d - d - 1 = [1 - ln 2, 0, ln 2 - 1/2]; their mean is (1/2) / 3 = 1/6.
    new = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, requires_grad=True)
    ref = new.detach() + torch.tensor([[math.log(2), 0.0, -math.log(2)]], dtype=torch.float64)
    mask = torch.ones(1, 3)
    beta = 0.1
    loss, stats = grpo_loss(
        new, new.detach(), mask, torch.zeros(1), ref_per_token_logps=ref, beta=beta
    )
    assert stats[KL] == pytest.approx(1 / 6)
    assert loss.item() == pytest.approx(beta / 6)
    loss.backward()
    assert new.grad is not None
    # d k3 / d new = 1 - e^d: [-1, 0, 1/2], times beta / 3 tokens.
    torch.testing.assert_close(
        new.grad, torch.tensor([[-1.0, 0.0, 0.5]], dtype=torch.float64) * beta / 3
    )


def test_kl_is_reported_without_weighing_it() -> None:
    new = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    ref = new.detach() + math.log(2)
    loss, stats = grpo_loss(
        new, new.detach(), torch.ones(1, 2), torch.zeros(1), ref_per_token_logps=ref
    )
    assert stats[KL] == pytest.approx(1 - math.log(2))
    assert loss.item() == 0.0


def test_inputs_the_loss_would_get_wrong_are_refused() -> None:
    new, old = _logps(RATIOS, MASK)
    with pytest.raises(ValueError, match="needs ref_per_token_logps"):
        grpo_loss(new, old, MASK, ADVANTAGES, beta=0.1)
    with pytest.raises(ValueError, match="one per episode"):
        grpo_loss(new, old, MASK, ADVANTAGES.unsqueeze(1))
    with pytest.raises(ValueError, match="completion_mask has shape"):
        grpo_loss(new, old, MASK[:, :3], ADVANTAGES)
    with pytest.raises(ValueError, match=r"episodes \[1\] have no completion tokens"):
        grpo_loss(new, old, torch.tensor([[0, 1, 1, 1], [0, 0, 0, 0]]), ADVANTAGES)
    with pytest.raises(ValueError, match="old_per_token_logps is not finite"):
        grpo_loss(new, torch.full_like(old, NAN), MASK, ADVANTAGES)
    with pytest.raises(ValueError, match="only 0 and 1"):
        grpo_loss(new, old, MASK * 2, ADVANTAGES)
