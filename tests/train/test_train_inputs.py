"""Bad inputs fail with a clear SpanmillError before a model is loaded or MLflow is called."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spanmill.dataset.layout import CARD_FILE, TRAIN_FILE
from spanmill.errors import ModelError, SpanmillError
from spanmill.evaluate import EvalSettings, evaluate
from spanmill.train import (
    DatasetError,
    EmptyDatasetError,
    MissingColumnsError,
    TrainError,
    TrainSettings,
    load_training_data,
    train,
)
from spanmill.train.reference import reference_rows


@pytest.fixture(autouse=True)
def no_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model, or creating an MLflow run, fails these tests: nothing may start."""
    import transformers
    from mlflow import MlflowClient

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("compute was spent before the inputs were checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(MlflowClient, "create_run", refuse)


def settings(model: Path | str, **overrides: object) -> TrainSettings:
    return TrainSettings(base_model=str(model), max_steps=1, **overrides)  # type: ignore[arg-type]


def copy_with_train(dataset: Path, folder: Path, table: pa.Table) -> Path:
    shutil.copytree(dataset, folder)
    pq.write_table(table, folder / TRAIN_FILE)
    return folder


def test_a_missing_dataset_folder_is_named(tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        train(tmp_path / "nowhere", tmp_path / "out", settings(tiny_model_dir))


def test_an_empty_dataset_is_refused(
    tmp_path: Path, small_dataset: Path, tiny_model_dir: Path
) -> None:
    schema = pq.read_schema(small_dataset / TRAIN_FILE)
    folder = copy_with_train(small_dataset, tmp_path / "empty", schema.empty_table())
    with pytest.raises(EmptyDatasetError, match="has no rows"):
        train(folder, tmp_path / "out", settings(tiny_model_dir))


def test_missing_columns_are_named(
    tmp_path: Path, small_dataset: Path, tiny_model_dir: Path
) -> None:
    table = pq.read_table(small_dataset / TRAIN_FILE).drop_columns(["weight", "reward"])
    folder = copy_with_train(small_dataset, tmp_path / "no-weights", table)
    with pytest.raises(MissingColumnsError, match="lacks columns weight, reward") as caught:
        train(folder, tmp_path / "out", settings(tiny_model_dir))
    assert "sft dataset" in str(caught.value)

    # Without a card to declare the mode, the message names what the closest mode lacks.
    (folder / CARD_FILE).unlink()
    with pytest.raises(MissingColumnsError, match="weight, reward"):
        load_training_data(folder)


def test_a_base_model_that_does_not_exist_is_refused(tmp_path: Path, small_dataset: Path) -> None:
    with pytest.raises(ModelError, match="nowhere/model"):
        train(small_dataset, tmp_path / "out", settings(tmp_path / "nowhere" / "model"))
    # A folder that exists but holds no model is refused too, and by name.
    (tmp_path / "not-a-model").mkdir()
    with pytest.raises(ModelError, match="not-a-model"):
        train(small_dataset, tmp_path / "out", settings(tmp_path / "not-a-model"))


def test_a_completion_that_is_not_a_reply_is_refused(
    tmp_path: Path, small_dataset: Path, tiny_model_dir: Path
) -> None:
    rows = pq.read_table(small_dataset / TRAIN_FILE).to_pylist()
    rows[3]["completion"] = [{"role": "user", "content": "hi"}]
    folder = copy_with_train(small_dataset, tmp_path / "bad", pa.Table.from_pylist(rows))
    with pytest.raises(DatasetError, match="row 3, column completion"):
        train(folder, tmp_path / "out", settings(tiny_model_dir))


def test_weights_must_be_usable(tmp_path: Path, small_dataset: Path, tiny_model_dir: Path) -> None:
    rows = pq.read_table(small_dataset / TRAIN_FILE).to_pylist()
    for row in rows:
        row["weight"] = 0.0
    folder = copy_with_train(small_dataset, tmp_path / "zero", pa.Table.from_pylist(rows))
    with pytest.raises(EmptyDatasetError, match="weight 0"):
        train(folder, tmp_path / "out", settings(tiny_model_dir))

    rows[0]["weight"] = 2.0
    folder = copy_with_train(small_dataset, tmp_path / "varied", pa.Table.from_pylist(rows))
    with pytest.raises(DatasetError, match="packing"):
        train(folder, tmp_path / "out", settings(tiny_model_dir, packing=True))


def test_reward_weights_are_scaled_to_a_mean_of_one(tmp_path: Path, small_dataset: Path) -> None:
    """A weight is how much a sample counts against the others: rewards of 0 to 100
    took steps a hundred times those of 0 to 1. The same rewards on two scales train
    alike; the dataset's own columns (``full``) keep what was written."""
    rows = pq.read_table(small_dataset / TRAIN_FILE).to_pylist()
    for i, row in enumerate(rows):
        row["weight"] = float(i % 4)  # 0, 1, 2, 3: mean 1.5
    small = load_training_data(copy_with_train(small_dataset, tmp_path / "small",
                                               pa.Table.from_pylist(rows)))  # fmt: skip
    for row in rows:
        row["weight"] *= 100
    large = load_training_data(copy_with_train(small_dataset, tmp_path / "large",
                                               pa.Table.from_pylist(rows)))  # fmt: skip
    weights = small.train.table.column("weight").to_pylist()
    assert small.weighted
    assert sum(weights) / len(weights) == pytest.approx(1.0)
    assert weights[:4] == pytest.approx([0, 1 / 1.5, 2 / 1.5, 3 / 1.5])
    assert large.train.table.column("weight").to_pylist() == pytest.approx(weights)
    assert large.train.full is not None
    assert large.train.full.column("weight").to_pylist()[:4] == [0, 100, 200, 300]


def test_fp16_without_a_gpu_is_refused(
    tmp_path: Path, small_dataset: Path, tiny_model_dir: Path
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("fp16 is fine on a GPU")
    with pytest.raises(TrainError, match="fp16 needs a GPU"):
        train(small_dataset, tmp_path / "out", settings(tiny_model_dir, precision="fp16"))


def test_a_preference_method_on_an_sft_dataset_is_refused(
    tmp_path: Path, small_dataset: Path, tiny_model_dir: Path
) -> None:
    with pytest.raises(DatasetError, match="needs a preference dataset"):
        train(small_dataset, tmp_path / "out", settings(tiny_model_dir, method="dpo"))


def test_an_unreachable_mlflow_stops_before_training(
    tmp_path: Path,
    small_dataset: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spanmill.config import MLflowSettings
    from spanmill.stack.ports import free_port

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    unreachable = MLflowSettings(tracking_uri=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(TrainError, match="MLflow"):
        train(small_dataset, tmp_path / "out", settings(tiny_model_dir, mlflow=unreachable))


def test_evaluation_checks_its_inputs_first(
    tmp_path: Path, small_dataset: Path, tiny_model_dir: Path
) -> None:
    quiet = EvalSettings(track=False, instances=2, replay_items=2)
    with pytest.raises(ModelError, match="nowhere"):
        evaluate(small_dataset, str(tmp_path / "nowhere"), tmp_path / "eval", quiet)
    with pytest.raises(SpanmillError, match="unknown task"):
        evaluate(
            small_dataset,
            str(tiny_model_dir),
            tmp_path / "eval",
            quiet.model_copy(update={"task": "juggling"}),
        )
    with pytest.raises(DatasetError, match="does not exist"):
        evaluate(tmp_path / "nowhere", str(tiny_model_dir), tmp_path / "eval", quiet)


def test_reference_rows_follow_the_layout(small_dataset: Path) -> None:
    from spanmill.dataset.layout import LINEAGE_COLUMNS, REQUIRED_COLUMNS
    from spanmill.tasks import get_task

    task = get_task("calculator")
    rows = reference_rows(task, task.instances("train", 2))
    assert len(rows) == 4  # two assistant turns per episode
    assert set(REQUIRED_COLUMNS["sft"]) | set(LINEAGE_COLUMNS) <= set(rows[0])
    assert rows[0]["prompt"][-1]["role"] == "user"
    assert rows[1]["prompt"][-1] == {"role": "tool", "content": rows[1]["completion"][0]["content"]}
    data = load_training_data(small_dataset)
    assert (data.mode, data.train.rows, data.eval.rows if data.eval else 0) == ("sft", 48, 8)
    assert not data.train.task_ids & (data.eval.task_ids if data.eval else frozenset())


def test_rows_longer_than_max_length_are_left_out_and_counted(smollm2_dir: Path) -> None:
    """TRL cuts a row longer than max_length to fit, keeping its start: the completion
    lost its end and end-of-turn (the model learns to stop mid-answer), and nothing
    counted it. Such rows are left out, as the chat template renders them."""
    import pyarrow as pa
    from transformers import AutoTokenizer

    from spanmill.train.trainer import within_length

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    short = [{"role": "user", "content": "2 + 2?"}]
    long = [{"role": "user", "content": "Add these up: " + " + ".join(["7"] * 300)}]
    answer = [{"role": "assistant", "content": "4"}]
    sft = pa.table({"prompt": [short, long, short], "completion": [answer, answer, answer]})
    kept, over = within_length(sft, tokenizer, 128)
    assert (kept.num_rows, over) == (2, 1)
    assert kept.column("prompt").to_pylist() == [short, short]
    rambling = [{"role": "assistant", "content": "x " * 400}]
    pairs = pa.table({"prompt": [short, short], "chosen": [answer, answer],
                      "rejected": [answer, rambling]})  # fmt: skip
    assert within_length(pairs, tokenizer, 128)[1] == 1  # the longer answer decides
    assert within_length(sft, tokenizer, 4096) == (sft, 0)
