"""SFT as spanmill runs it: TRL's SFTTrainer, with sample weights and a lean loss on CPUs.

TRL prepares the data (chat template, completion mask, truncation, packing) and
runs the loop; two things change, both in the loss.

Sample weights. With varying ``weight`` values, each sample's token losses are
scaled by its weight (reward-weighted SFT), the weights scaled to a mean of 1 over
the training split (:func:`spanmill.train.data.load_training_data`). The weights
travel from the dataset to the loss in the batch, next to the tokens.

Logits where a label is scored, on CPUs. TRL's fused LM head scores only the
completion positions on a GPU (Triton kernels); elsewhere it scores every
position, in chunks, and costs more than the model's plain forward. On two CPU
cores, SmolLM2-135M in bf16, 8 rows of 160 tokens with the last 30 scored, a
forward and backward took 5.5 s with it, 3.9 s with the plain forward, and 3.3 s
with the LM head run only at the positions whose next token is in the loss,
which is what this trainer does off GPUs.

A shared prefix computed once, on CPUs. An agent's samples begin with the same
system prompt and tool list; in a batch whose rows all begin with the same run of
tokens (none of them scored), that run goes through the model once, as one row,
and its keys and values are repeated for every row's own continuation. The loss
and the gradients are the same (the repeat's backward sums the rows' gradients
into the one prefix); the work is not. Calculator samples of about 160 tokens
share 88: a batch of 8 computes 640 tokens instead of 1,260. One process only
(a distributed model is called once per step) and not with activation
checkpointing (its recomputation would extend the cache twice).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from trl import SFTTrainer

WEIGHT_COLUMN = "weight"
# Shorter common runs are computed per row: a second model call costs more than they save.
MIN_SHARED_PREFIX = 16
# The batch key the weights travel under from the collator to compute_loss.
SAMPLE_WEIGHT = "spanmill_sample_weight"


class SampleWeightCollator:
    """Wraps the trainer's collator: the same batch, plus the rows' weights."""

    def __init__(self, inner: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> None:
        self.inner = inner

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        weights = torch.tensor([float(e[WEIGHT_COLUMN]) for e in examples])
        batch = self.inner([{k: v for k, v in e.items() if k != WEIGHT_COLUMN} for e in examples])
        batch[SAMPLE_WEIGHT] = weights
        return batch


class SpanmillSFTTrainer(SFTTrainer):
    """SFTTrainer with optional per-sample weights and, off GPUs, logits only where scored."""

    def __init__(
        self, *args: Any, weighted: bool = False, scored_logits_only: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.weighted = weighted
        self.scored_logits_only = scored_logits_only
        self._tokens_seen = 0
        self._correct = 0
        self._scored = 0
        if weighted:
            if self.padding_free:
                raise ValueError("sample weights need padded batches; packing flattens them")
            self.data_collator = SampleWeightCollator(self.data_collator)

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        columns = self._signature_columns
        if self.weighted and columns is not None and WEIGHT_COLUMN not in columns:
            self._signature_columns = [*columns, WEIGHT_COLUMN]

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        weights = inputs.pop(SAMPLE_WEIGHT, None)
        if self.scored_logits_only and not return_outputs:
            return self._scored_loss(model, inputs, weights, num_items_in_batch)
        if weights is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        # TRL's loss is the sum of the fused head's per-token log-probabilities:
        # scaling each row's on their way out of the model weighs it.
        def weigh(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> Any:
            if kwargs.get("fused_lm_head") and output.log_probs is not None:
                row_weights = weights.to(output.log_probs.device, output.log_probs.dtype)
                output.log_probs = output.log_probs * row_weights[:, None]
            return output

        unwrapped: Any = self.model  # the (possibly DDP-wrapped) model calls it
        handle = unwrapped.register_forward_hook(weigh, with_kwargs=True)
        try:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            handle.remove()

    def _scored_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        weights: torch.Tensor | None,
        num_items_in_batch: Any,
    ) -> torch.Tensor:
        labels = inputs.pop("labels")
        targets = labels[:, 1:]
        # Positions whose next token is in the loss, in any row: the LM head runs there only.
        scored = (targets != -100).any(dim=0).nonzero().flatten()
        outputs = self._scored_forward(model, inputs, scored)
        wanted = targets[:, scored]
        mask = wanted != -100
        logits = outputs.logits[mask]
        token_loss = F.cross_entropy(logits.float(), wanted[mask], reduction="none")
        if weights is not None:
            row_weights = weights.to(token_loss.device, token_loss.dtype)[:, None]
            token_loss = token_loss * row_weights.expand_as(wanted)[mask]
        count = mask.sum() if num_items_in_batch is None else num_items_in_batch
        loss = token_loss.sum() / torch.as_tensor(count, device=token_loss.device).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            # As the Trainer does: DDP averages gradients over ranks, and the count is global.
            loss = loss * self.accelerator.num_processes
        if model.training:
            mask_of_inputs = inputs.get("attention_mask")
            self._tokens_seen += int(
                mask_of_inputs.sum() if mask_of_inputs is not None else inputs["input_ids"].numel()
            )
            with torch.no_grad():
                self._correct += int((logits.argmax(dim=-1) == wanted[mask]).sum())
                self._scored += int(mask.sum())
        return loss

    def _scored_forward(self, model: Any, inputs: dict[str, Any], scored: torch.Tensor) -> Any:
        """The model's logits at ``scored``, its shared prefix computed once."""
        shared = 0
        if (
            set(inputs) <= {"input_ids", "attention_mask"}
            and self.accelerator.num_processes == 1
            and not self.args.gradient_checkpointing
            and scored.numel()
        ):
            shared = shared_prefix(
                inputs["input_ids"], inputs.get("attention_mask"), int(scored.min())
            )
        if shared < MIN_SHARED_PREFIX:
            return model(**inputs, use_cache=False, logits_to_keep=scored)
        input_ids = inputs["input_ids"]
        head = model(input_ids=input_ids[:1, :shared], use_cache=True, logits_to_keep=1)
        cache = head.cache
        cache.batch_repeat_interleave(input_ids.shape[0])
        return model(
            input_ids=input_ids[:, shared:],
            attention_mask=inputs.get("attention_mask"),
            cache=cache,
            use_cache=True,
            logits_to_keep=scored - shared,
        )

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # The lean loss skips TRL's bookkeeping; give the logs the same two figures.
        if self._scored and "loss" in logs:
            logs["num_tokens"] = float(self._tokens_seen)
            logs["mean_token_accuracy"] = self._correct / self._scored
            self._correct = self._scored = 0
        super().log(logs, start_time)


def shared_prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, limit: int) -> int:
    """How many leading tokens every row has in common (none of them padding), at most
    ``limit`` and always one fewer than the row length; 0 for a single row."""
    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(dim=0)
    if attention_mask is not None:
        same &= attention_mask.bool().all(dim=0)
    run = int(same.int().cumprod(dim=0).sum())
    return max(0, min(run, limit, input_ids.shape[1] - 1))
