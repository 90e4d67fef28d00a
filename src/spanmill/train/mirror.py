"""Checkpoints kept beyond the machine that saves them, for a run started again elsewhere.

A training step's checkpoints live in its output folder, on the pod's scratch: when the
pod is lost (a preempted GPU node, an eviction, the step's deadline) and the pipeline
retries the step on a new pod, that folder is gone, and hours of training start over.
With ``TrainSettings.checkpoint_store`` set (an object store folder, the chart's
``SPANMILL_TRAIN_CHECKPOINT_STORE``), each checkpoint is copied there as soon as it is
saved (:func:`mirror_callback`; GRPO's after each of its saves), into a folder named
from ``TrainSettings.run_key`` (a pipeline run's id and the step's task name, the same
for every try); a run that finds no checkpoint in its output folder first copies them
back (:func:`restore`), and then resumes as from its own, under the same checks (the
same dataset and settings), in the same MLflow run. The copy goes once the run has
finished (:func:`spanmill.train.remote.remove`).
"""

from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath
from typing import Any

from spanmill.train.errors import TrainError
from spanmill.train.remote import get_files, open_url, put_file, run_digest
from spanmill.train.settings import TrainSettings

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "checkpoint-"
# Beside each checkpoint folder copied whole: a copy cut short has none, and is not used.
COMPLETE = ".complete"


def mirror_url(settings: TrainSettings, output_dir: Path) -> str | None:
    """Where this run's checkpoints are copied; None without a checkpoint store."""
    if not settings.checkpoint_store:
        return None
    digest = run_digest(output_dir, settings.run_key or "")[:16]
    return f"{settings.checkpoint_store.rstrip('/')}/{digest}"


def restore(url: str, checkpoints: Path, prefix: str = CHECKPOINT_PREFIX) -> int | None:
    """Copy the mirrored checkpoints into ``checkpoints`` where it holds none; the step of
    the last one copied, None when there was nothing to copy. A checkpoint whose copy was
    cut short (no :data:`COMPLETE` mark) is left out."""
    if checkpoints.is_dir() and any(checkpoints.glob(f"{prefix}*")):
        return None  # this folder's own come first
    fs, root = open_url(url)
    fs.invalidate_cache(root)
    try:
        found = [str(p) for p in fs.find(root)] if fs.exists(root) else []
    except OSError as exc:
        raise TrainError(f"cannot read the checkpoints at {url}: {exc}") from None
    relative = [PurePosixPath(path).relative_to(PurePosixPath(root)) for path in found]
    complete = {r.name.removesuffix(COMPLETE) for r in relative if r.name.endswith(COMPLETE)}
    wanted = [
        r for r in relative
        if not r.name.endswith(COMPLETE)
        and (len(r.parts) == 1 or r.parts[0] in complete)
    ]  # fmt: skip
    steps = [s for s in (_step(name, prefix) for name in complete) if s is not None]
    if not steps:
        return None
    try:
        get_files(fs, root, wanted, checkpoints)
    except OSError as exc:
        raise TrainError(f"cannot copy the checkpoints at {url}: {exc}") from None
    log.info("checkpoints up to step %d copied from %s into %s", max(steps), url, checkpoints)
    return max(steps)


def _step(name: str, prefix: str) -> int | None:
    suffix = name.removeprefix(prefix)
    return int(suffix) if name.startswith(prefix) and suffix.isdigit() else None


def upload(checkpoints: Path, url: str, prefix: str = CHECKPOINT_PREFIX) -> None:
    """Make ``url`` hold what ``checkpoints`` holds: the files beside the checkpoints (the
    run's state) and every checkpoint folder, each marked complete once all its files are
    there, the ones it no longer holds removed (the Trainer keeps the last few). A
    checkpoint copied whole before is not copied again."""
    fs, root = open_url(url)
    fs.invalidate_cache(root)
    present = (
        {PurePosixPath(p).name for p in fs.ls(root, detail=False)} if fs.exists(root) else set()
    )
    local = {p.name for p in checkpoints.iterdir()}
    for path in sorted(checkpoints.iterdir()):
        if path.name.startswith("."):
            continue  # a checkpoint being written, or a file being replaced
        if path.is_file():
            put_file(fs, path, f"{root}/{path.name}")
            continue
        if path.name + COMPLETE in present:
            continue  # a checkpoint folder does not change once saved
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            put_file(fs, file, f"{root}/{file.relative_to(checkpoints).as_posix()}")
        fs.pipe_file(f"{root}/{path.name}{COMPLETE}", b"")
    # Marks first: a clean-up cut short leaves no mark on a folder it emptied.
    for name in sorted(present, key=lambda n: not n.endswith(COMPLETE)):
        folder = name.removesuffix(COMPLETE)
        if folder.startswith(prefix) and folder not in local:
            fs.rm(f"{root}/{name}", recursive=True)


def copy_checkpoints(
    checkpoints: Path, url: str, step: int, prefix: str = CHECKPOINT_PREFIX
) -> None:
    """:func:`upload`, after step ``step``'s save; a failure is logged and training goes
    on (a retry then resumes from an older copy, or starts over)."""
    try:
        upload(checkpoints, url, prefix)
    except OSError as exc:
        log.warning("copying checkpoint %d to %s failed: %s", step, url, exc)
    else:
        log.info("checkpoint %d copied to %s", step, url)


def mirror_callback(url: str, checkpoints: Path) -> Any:
    """A ``TrainerCallback`` that copies each checkpoint to ``url`` once it is saved (the
    main process alone)."""
    from transformers import TrainerCallback

    class MirrorCallback(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero:
                copy_checkpoints(checkpoints, url, state.global_step)

    return MirrorCallback()
