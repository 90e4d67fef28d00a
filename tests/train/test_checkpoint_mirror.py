"""Checkpoints copied beyond the pod as they are saved: a run started again in an empty
output folder (a retried pipeline step, on a new pod) resumes from the copy
(spanmill.train.mirror)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_train_plumbing import FirstStep, InterruptAt, Interrupted

from spanmill.train import TrainSettings, train
from spanmill.train.mirror import COMPLETE, mirror_url, restore, upload
from spanmill.train.trainer import CHECKPOINTS_DIRNAME, RUN_STATE_FILE


def checkpoint(folder: Path, step: int) -> None:
    (folder / f"checkpoint-{step}").mkdir(parents=True)
    (folder / f"checkpoint-{step}" / "adapter_model.safetensors").write_bytes(b"w" * step)
    (folder / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"step": step}))


def test_the_copy_follows_the_checkpoints_and_a_copy_cut_short_is_not_used(
    tmp_path: Path,
) -> None:
    local, store = tmp_path / "pod-a" / CHECKPOINTS_DIRNAME, tmp_path / "store"
    url = f"file://{store}"
    local.mkdir(parents=True)
    (local / RUN_STATE_FILE).write_text('{"run_id": "r"}')
    checkpoint(local, 2)
    upload(local, url)
    checkpoint(local, 4)
    upload(local, url)
    assert sorted(p.name for p in store.iterdir()) == sorted([
        RUN_STATE_FILE, "checkpoint-2", f"checkpoint-2{COMPLETE}", "checkpoint-4",
        f"checkpoint-4{COMPLETE}",
    ])  # fmt: skip
    # The Trainer rotates the oldest away: so does the copy.
    (local / "checkpoint-2" / "adapter_model.safetensors").unlink()
    (local / "checkpoint-2" / "trainer_state.json").unlink()
    (local / "checkpoint-2").rmdir()
    upload(local, url)
    assert (
        not (store / "checkpoint-2").exists() and not (store / f"checkpoint-2{COMPLETE}").exists()
    )

    fresh = tmp_path / "pod-b" / CHECKPOINTS_DIRNAME
    assert restore(url, fresh) == 4
    assert (fresh / "checkpoint-4" / "adapter_model.safetensors").read_bytes() == b"w" * 4
    assert (fresh / RUN_STATE_FILE).read_text() == '{"run_id": "r"}'
    # A folder with checkpoints of its own keeps them.
    assert restore(url, fresh) is None
    # A checkpoint whose copy was cut short (no mark) is left out: nothing to resume from.
    (store / f"checkpoint-4{COMPLETE}").unlink()
    assert restore(url, tmp_path / "pod-c" / CHECKPOINTS_DIRNAME) is None
    assert not (tmp_path / "pod-c").exists()


def test_the_key_names_the_copy_across_output_folders(tmp_path: Path) -> None:
    keyed = TrainSettings(checkpoint_store="s3://b/checkpoints/", run_key="run-1/train-lora",
                          track=False)  # fmt: skip
    assert mirror_url(keyed, tmp_path / "a") == mirror_url(keyed, tmp_path / "b")
    assert mirror_url(keyed, tmp_path / "a").startswith("s3://b/checkpoints/")  # type: ignore[union-attr]
    other = keyed.model_copy(update={"run_key": "run-2/train-lora"})
    assert mirror_url(other, tmp_path / "a") != mirror_url(keyed, tmp_path / "a")
    assert mirror_url(TrainSettings(checkpoint_store="", track=False), tmp_path) is None
    # Where the copy lives says nothing of the weights: a run may resume under another store.
    assert keyed.training_fingerprint() == TrainSettings(track=False).training_fingerprint()


@pytest.mark.services
def test_a_run_started_again_on_a_new_pod_resumes_from_the_copy(
    tmp_path: Path,
    small_dataset: Path,
    tiny_model_dir: Path,
    s3: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from object_store import s3_bucket

    # The pipeline's pods reach the object store as the chart configures them: by the
    # AWS_* environment.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3["endpoint_url"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    store = s3_bucket(s3).removesuffix("/store") + "/checkpoints"
    settings = TrainSettings(
        base_model=str(tiny_model_dir), max_steps=6, batch_size=4, save_steps=2, lora_r=4,
        lora_alpha=8, track=False, eval_loss=False, checkpoint_store=store,
        run_key="run-1/train-lora",
    )  # fmt: skip
    with pytest.raises(Interrupted):
        train(small_dataset, tmp_path / "pod-a", settings, callbacks=[InterruptAt(3)])

    first = FirstStep()
    result = train(small_dataset, tmp_path / "pod-b", settings, callbacks=[first])
    assert result.resumed_from_step == 2 and first.global_step == 2
    assert result.global_step == 6
    # A finished run's copy goes with its checkpoints.
    import fsspec

    url = mirror_url(settings, tmp_path / "pod-b")
    assert url is not None
    fs, root = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    assert not fs.exists(root)
