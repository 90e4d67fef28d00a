"""Two LoRA adapters of SmolLM2, each taught one answer to the same question, so which
one answered is plain from the text: ``calls`` calls the calculator tool, ``words`` says
"Twelve.", and the base model says something else (the conftest's ``taught_adapters``
makes them once a session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluates an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]  # fmt: skip
QUESTION = [{"role": "user", "content": "What is 7 + 5?"}]
TOOL_CALL = '{"name": "calculator", "arguments": {"expression": "7 + 5"}}'
WORDS = "Twelve."


def teach(base: Path, tokenizer: Any, answer: str, out: Path, seed: int) -> Path:
    """A LoRA adapter taught to answer QUESTION (with TOOLS offered) with ``answer``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from spanmill.serving.generation import render_prompt

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                        task_type="CAUSAL_LM")  # fmt: skip
    peft = get_peft_model(model, config)
    prompt = tokenizer(render_prompt(tokenizer, QUESTION, TOOLS))["input_ids"]
    target = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    optimizer = torch.optim.AdamW([p for p in peft.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(60):
        loss = peft(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if loss.item() < 0.02:
            break
    peft.save_pretrained(out)
    return out


def both(base: Path, folder: Path) -> dict[str, Path]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    return {
        "calls": teach(base, tokenizer, TOOL_CALL, folder / "calls", seed=2),
        "words": teach(base, tokenizer, WORDS, folder / "words", seed=3),
    }
