"""A call's offered tools reach its training prompt, as serving renders them.

The dataset keeps them in ``request``; TRL renders a row's ``tools`` column with the
chat template. SmolLM2's template writes no tools, so the tests give the tokenizer one
that does, as Qwen's and Llama's do: without the column the prompt trained on lacked
the tool definitions every served prompt held.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spanmill.dataset.layout import TRAIN_FILE
from spanmill.serving.generation import render_prompt
from spanmill.train import DatasetError, load_training_data
from spanmill.train.sft import SpanmillSFTTrainer
from spanmill.train.trainer import within_length

TOOLS = [{"type": "function", "function": {
    "name": "multiply_exactly", "description": "Multiply two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]  # fmt: skip
# A template that writes the tools into the prompt, as tool-calling models' do.
TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _with_requests(dataset: Path, folder: Path, requests: list[str | None]) -> Path:
    shutil.copytree(dataset, folder)
    table = pq.read_table(folder / TRAIN_FILE)
    table = table.slice(0, len(requests))
    table = table.set_column(
        table.column_names.index("request"), "request", pa.array(requests, pa.string())
    )
    pq.write_table(table, folder / TRAIN_FILE)
    return folder


def test_the_offered_tools_are_a_column_the_trainer_reads(
    tmp_path: Path, small_dataset: Path
) -> None:
    requests = [
        json.dumps({"tools": TOOLS, "max_tokens": 64}),
        json.dumps({"max_tokens": 64}),
        None,
        json.dumps({"tools": []}),
    ]
    data = load_training_data(_with_requests(small_dataset, tmp_path / "d", requests))
    assert data.train.table.column("tools").to_pylist() == [json.dumps(TOOLS), None, None, None]

    bad = _with_requests(small_dataset, tmp_path / "bad", [json.dumps({"tools": "add"})])
    with pytest.raises(DatasetError, match=r"row 0, column request: tools must be a list"):
        load_training_data(bad)
    broken = _with_requests(small_dataset, tmp_path / "broken", ["{not json"])
    with pytest.raises(DatasetError, match=r"row 0, column request: not a JSON object"):
        load_training_data(broken)


def test_trl_renders_the_tools_into_the_prompt_as_serving_does(
    tmp_path: Path, small_dataset: Path, tiny_model_dir: Path
) -> None:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig

    requests = [json.dumps({"tools": TOOLS}), None]
    data = load_training_data(_with_requests(small_dataset, tmp_path / "d", requests))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TEMPLATE
    trainer = SpanmillSFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        args=SFTConfig(
            output_dir=str(tmp_path / "out"),
            report_to="none",
            use_cpu=True,
            bf16=False,
            completion_only_loss=True,
        ),
        train_dataset=Dataset(data.train.table).remove_columns("weight"),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        weighted=False,
        scored_logits_only=True,
    )
    with_tools, without = (trainer.train_dataset[i] for i in range(2))
    trained = tokenizer.decode(with_tools["input_ids"])
    prompt = data.train.table.column("prompt").to_pylist()[0]
    assert "multiply_exactly" in trained
    # The prompt trained on is the prompt served.
    assert trained.startswith(render_prompt(tokenizer, prompt, TOOLS))
    assert "multiply_exactly" not in tokenizer.decode(without["input_ids"])


def test_the_length_check_counts_the_tools(
    tmp_path: Path, small_dataset: Path, tiny_model_dir: Path
) -> None:
    from transformers import AutoTokenizer

    many = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": f"tool_{i}"}}
            for i in range(40)]  # fmt: skip
    requests = [json.dumps({"tools": many}), None]
    data = load_training_data(_with_requests(small_dataset, tmp_path / "d", requests))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TEMPLATE
    kept, over = within_length(data.train.table, tokenizer, 512)
    assert (kept.num_rows, over) == (1, 1)
    assert kept.column("tools").to_pylist() == [None]
