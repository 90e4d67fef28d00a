"""The lean SFT loss equals the model's own loss, and weighs samples as asked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spanmill.train.sft import (
    MIN_SHARED_PREFIX,
    SAMPLE_WEIGHT,
    SpanmillSFTTrainer,
    shared_prefix,
)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, small_dataset: Path):  # type: ignore[no-untyped-def]
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig

    from spanmill.train.data import load_training_data

    data = load_training_data(small_dataset)
    rows = Dataset(data.train.table).select(range(6))
    return SpanmillSFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        args=SFTConfig(
            output_dir=str(tmp_path_factory.mktemp("sft")),
            report_to="none",
            use_cpu=True,
            bf16=False,
            activation_checkpointing=False,
        ),
        train_dataset=rows,
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        weighted=True,
        scored_logits_only=True,
    )


def batch_of(trainer: SpanmillSFTTrainer, weights: list[float]) -> dict:
    examples = [dict(trainer.train_dataset[i]) for i in range(len(weights))]
    for example, weight in zip(examples, weights, strict=True):
        example["weight"] = weight
    return trainer.data_collator(examples)


def test_the_scored_loss_is_the_models_own_loss(trainer: SpanmillSFTTrainer) -> None:
    batch = batch_of(trainer, [1.0, 1.0, 1.0, 1.0])
    model = trainer.model
    with torch.no_grad():
        own = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=batch["labels"],
        ).loss
        lean = trainer.compute_loss(model, dict(batch))
    assert lean.item() == pytest.approx(own.item(), rel=1e-5)


def test_weights_scale_each_samples_tokens(trainer: SpanmillSFTTrainer) -> None:
    model = trainer.model
    batch = batch_of(trainer, [1.0, 0.0, 0.0, 0.0])
    scored = (batch["labels"][:, 1:] != -100).sum(dim=1)
    with torch.no_grad():
        weighted = trainer.compute_loss(model, dict(batch))
        first_alone = model(
            input_ids=batch["input_ids"][:1],
            attention_mask=batch["attention_mask"][:1],
            labels=batch["labels"][:1],
        ).loss
    # Row 0's mean token loss, counted over every scored token of the batch.
    expected = first_alone * scored[0] / scored.sum()
    assert weighted.item() == pytest.approx(expected.item(), rel=1e-5)
    assert SAMPLE_WEIGHT in batch_of(trainer, [0.5, 2.0])


def lora_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: param.grad.detach().clone()
        for name, param in model.named_parameters()
        if param.requires_grad and param.grad is not None
    }


def test_a_shared_prefix_is_computed_once_with_the_same_loss_and_gradients(
    trainer: SpanmillSFTTrainer,
) -> None:
    model = trainer.model
    batch = batch_of(trainer, [1.0, 1.0, 1.0, 1.0])
    scored = (batch["labels"][:, 1:] != -100).any(dim=0).nonzero().flatten()
    shared = shared_prefix(batch["input_ids"], batch["attention_mask"], int(scored.min()))
    # The fixture's samples begin with one system prompt: the batch has a prefix to share.
    assert shared >= MIN_SHARED_PREFIX

    model.zero_grad()
    own = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        labels=batch["labels"],
    ).loss
    own.backward()
    expected = lora_gradients(model)

    calls: list[tuple[int, ...]] = []
    handle = model.register_forward_pre_hook(
        lambda _m, _a, kwargs: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    model.zero_grad()
    try:
        lean = trainer.compute_loss(model, dict(batch))
        lean.backward()
    finally:
        handle.remove()
    got = lora_gradients(model)
    model.zero_grad()

    width = batch["input_ids"].shape[1]
    assert calls == [(1, shared), (4, width - shared)]
    assert lean.item() == pytest.approx(own.item(), rel=1e-5)
    assert expected and got.keys() == expected.keys()
    for name, gradient in expected.items():
        torch.testing.assert_close(got[name], gradient, rtol=1e-4, atol=1e-6, msg=name)


def test_the_shared_prefix_stops_at_padding_a_differing_token_and_the_limit() -> None:
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 1, 2], [5, 6, 7, 8, 3]])
    ones = torch.ones_like(ids)
    assert shared_prefix(ids, ones, limit=10) == 3
    assert shared_prefix(ids, ones, limit=2) == 2
    assert shared_prefix(ids[:1], ones[:1], limit=10) == 0  # one row shares with no one
    assert shared_prefix(ids[[0, 0]], ones[:2], limit=10) == 4  # a token is always left
    left_padded = ones.clone()
    left_padded[1, 0] = 0
    assert shared_prefix(ids, left_padded, limit=10) == 0
    assert shared_prefix(ids, None, limit=10) == 3


def test_a_loss_or_norm_that_is_not_a_number_stops_training_but_fp16s_skipped_steps_do_not() -> (
    None
):
    """fp16's loss scaler skips a step whose gradients overflowed (logging an infinite
    norm) and lowers its scale; nothing reached the weights. In bf16 or fp32 the same
    norm was applied."""
    from types import SimpleNamespace

    from spanmill.train.errors import TrainError
    from spanmill.train.tracking import FiniteLoss

    state = SimpleNamespace(global_step=7)
    overflowed = {"loss": 2.5, "grad_norm": float("inf")}
    FiniteLoss(fp16=True).on_log(None, state, None, logs=overflowed)  # type: ignore[arg-type]
    with pytest.raises(TrainError, match="gradient norm at step 7 is inf"):
        FiniteLoss().on_log(None, state, None, logs=overflowed)  # type: ignore[arg-type]
    with pytest.raises(TrainError, match="training loss at step 7 is nan"):
        FiniteLoss(fp16=True).on_log(None, state, None, logs={"loss": float("nan")})  # type: ignore[arg-type]
    FiniteLoss().on_log(None, state, None, logs={"loss": 2.5, "grad_norm": 1.0})  # type: ignore[arg-type]
