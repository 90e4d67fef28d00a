"""The lean SFT loss equals the model's own loss, and weighs samples as asked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spanmill.train.sft import SAMPLE_WEIGHT, SpanmillSFTTrainer


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
