"""The evaluation in the vLLM flavour: what it stages is LoRA adapters of one engine.

A GPU holds one vLLM engine, so an evaluation stages its candidates (the challenger,
and a champion no serving Triton holds, or the base model on an agent's first run) as
adapters of one engine, a version of the agent's candidate model, and asks each by its
LoRA name; a champion in service answers from the agent's own engine. The tests' Triton
runs the stand-in for the vLLM backend (tests/vllm_backend_standin.py: vLLM needs a GPU,
and this machine has none); everything of spanmill's is real, MLflow included. The two
adapters (tests/taught_adapters.py) answer the same question differently, so which one
answered is plain from the text.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

import pytest
from taught_adapters import QUESTION, TOOL_CALL, TOOLS, WORDS
from triton_state import loaded_model

from spanmill.config import MLflowSettings, ServingSettings, TritonSettings
from spanmill.evaluate.comparison import ModelRef
from spanmill.evaluate.run import serve_models
from spanmill.evaluate.served import ServingError, _tokenizers
from spanmill.evaluate.settings import EvalSettings
from spanmill.registry import Lineage, ModelRegistry, names
from spanmill.rollout.deployer import Deployer
from spanmill.rollout.fleet import fleet_of
from spanmill.rollout.materialize import ModelRepository, ServingOptions
from spanmill.serving.protocol import GenerationParams

pytestmark = pytest.mark.services


def settings_for(triton, mlflow_server) -> EvalSettings:  # type: ignore[no-untyped-def]
    return EvalSettings(
        track=False,
        mlflow=MLflowSettings(tracking_uri=mlflow_server.tracking_uri),
        triton=TritonSettings(
            http_url=triton.http_url, model_repository=str(triton.model_repository)
        ),
        serving=ServingSettings(flavour="vllm"),
    )


def answer(served) -> str:  # type: ignore[no-untyped-def]
    (result,) = served.generate_batch(
        [QUESTION], GenerationParams(max_tokens=40, temperature=0.0), TOOLS
    )
    return str(result.choices[0].text)


def test_a_first_run_compares_the_base_and_the_challenger_in_one_engine(  # type: ignore[no-untyped-def]
    triton, mlflow_server, smollm2_dir: Path, taught_adapters: dict[str, Path]
) -> None:
    agent = f"vl{uuid.uuid4().hex[:8]}"
    candidate = names.triton_candidate_model(agent)
    challenger = ModelRef("challenger", str(smollm2_dir), str(taught_adapters["words"]))
    with serve_models(settings_for(triton, mlflow_server), agent, challenger) as served:
        champion, staged = served["champion"], served["challenger"]
        # One engine, one version of the candidate model, both asked for by name.
        assert (champion.model, staged.model) == (candidate, candidate)
        assert champion.engine == staged.engine == champion.version
        assert (champion.lora_name, staged.lora_name) == (None, "challenger")
        assert champion.registered is None  # no champion: the base model stood in
        assert list(loaded_model(triton.http_url, candidate)) == [staged.engine]
        assert answer(staged) == WORDS
        assert answer(champion) not in (WORDS, TOOL_CALL)
        assert "adapter challenger" in staged.describe()
        # The prompts' tokenizer was loaded once for the process, not once per batch.
        assert str(smollm2_dir) in _tokenizers()._loaded
    assert loaded_model(triton.http_url, candidate) == {}
    assert ModelRepository(str(triton.model_repository)).versions(candidate) == []


def promoted(mlflow_server, base: Path | str, adapter: Path) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    """A new agent whose champion in MLflow is ``adapter`` on ``base``: (agent, version)."""
    agent = f"vl{uuid.uuid4().hex[:8]}"
    registry = ModelRegistry(mlflow_server.tracking_uri)
    lineage = Lineage(kind="adapter", base_model=str(base))
    version = registry.register(agent, lineage, adapter).version
    registry.promote(agent, version)
    return agent, version


def test_a_champion_not_in_service_is_an_adapter_beside_the_challenger(  # type: ignore[no-untyped-def]
    triton, mlflow_server, smollm2_dir: Path, taught_adapters: dict[str, Path]
) -> None:
    agent, version = promoted(mlflow_server, smollm2_dir, taught_adapters["calls"])
    challenger = ModelRef("challenger", str(smollm2_dir), str(taught_adapters["words"]))
    with serve_models(settings_for(triton, mlflow_server), agent, challenger) as served:
        champion, staged = served["champion"], served["challenger"]
        # Staged under a version of its own; the registration checks the one it stands for.
        assert champion.registered == version != champion.version
        assert champion.model == staged.model == names.triton_candidate_model(agent)
        assert champion.engine == staged.engine
        assert (champion.lora_name, staged.lora_name) == ("champion", "challenger")
        assert answer(champion) == TOOL_CALL
        assert answer(staged) == WORDS
    # The serving engine is the controller's: the evaluation loaded nothing there.
    assert loaded_model(triton.http_url, names.triton_model(agent)) == {}


def test_a_champion_in_service_answers_from_the_agents_engine(  # type: ignore[no-untyped-def]
    triton, mlflow_server, smollm2_dir: Path, taught_adapters: dict[str, Path]
) -> None:
    agent, version = promoted(mlflow_server, smollm2_dir, taught_adapters["calls"])
    registry = ModelRegistry(mlflow_server.tracking_uri)
    settings = settings_for(triton, mlflow_server)
    deployer = Deployer(
        registry,
        fleet_of(settings.triton),
        ModelRepository.from_settings(settings.triton),
        ServingOptions(flavour="vllm"),
        smoke_timeout_s=300,
    )
    deployer.deploy(agent, version)
    try:
        challenger = ModelRef("challenger", str(smollm2_dir), str(taught_adapters["words"]))
        with serve_models(settings, agent, challenger) as served:
            champion, staged = served["champion"], served["challenger"]
            assert (champion.model, champion.version) == (names.triton_model(agent), version)
            assert champion.lora_name == names.lora_name(agent, version)
            assert staged.model == names.triton_candidate_model(agent)
            assert answer(champion) == TOOL_CALL
            assert answer(staged) == WORDS
        assert deployer.ready(agent, version)
        # A challenger on another base than the engine's: the controller could not deploy
        # it, so it is refused before anything is staged or compared.
        other = ModelRef("other", "HuggingFaceTB/SmolLM2-360M-Instruct",
                         str(taught_adapters["words"]))  # fmt: skip
        with (
            pytest.raises(ServingError, match="different base models"),
            serve_models(settings, agent, other),
        ):
            pass
        assert (
            ModelRepository.from_settings(settings.triton).versions(
                names.triton_candidate_model(agent)
            )
            == []
        )
    finally:
        deployer.retire(agent, version)


def test_models_on_different_bases_are_refused_before_anything_is_staged(  # type: ignore[no-untyped-def]
    triton, mlflow_server, smollm2_dir: Path, taught_adapters: dict[str, Path]
) -> None:
    other = "HuggingFaceTB/SmolLM2-360M-Instruct"
    agent, _ = promoted(mlflow_server, other, taught_adapters["calls"])
    challenger = ModelRef("challenger", str(smollm2_dir), str(taught_adapters["words"]))
    settings = settings_for(triton, mlflow_server)
    with (
        pytest.raises(ServingError, match="different base models"),
        serve_models(settings, agent, challenger),
    ):
        pass
    candidate = names.triton_candidate_model(agent)
    assert ModelRepository(str(triton.model_repository)).versions(candidate) == []


def test_a_candidate_that_does_not_load_is_removed_again(  # type: ignore[no-untyped-def]
    triton, mlflow_server, smollm2_dir: Path, taught_adapters: dict[str, Path], tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(taught_adapters["words"], broken)
    for weights in broken.glob("adapter_model.*"):
        weights.write_bytes(b"not a tensor file")
    agent = f"vl{uuid.uuid4().hex[:8]}"
    challenger = ModelRef("challenger", str(smollm2_dir), str(broken))
    settings = settings_for(triton, mlflow_server)
    with (
        pytest.raises(ServingError, match="does not serve"),
        serve_models(settings, agent, challenger),
    ):
        pass
    candidate = names.triton_candidate_model(agent)
    assert loaded_model(triton.http_url, candidate) == {}
    assert ModelRepository(str(triton.model_repository)).versions(candidate) == []


class NoServers:
    """A fleet with no server: what is staged is written and never loaded."""

    def members(self) -> list[object]:
        return []


def test_the_engine_opens_the_base_as_named_not_as_this_machine_resolved_it(
    tmp_path: Path, taught_adapters: dict[str, Path]
) -> None:
    """A catalog name resolves to the evaluation pod's own download; the engine in the
    Triton pod is given its hub id, and a hub id and the catalog name of one model agree."""
    from spanmill.evaluate.served import Candidate, staged_engine

    repository = ModelRepository(str(tmp_path / "repo"))
    options = ServingOptions(flavour="vllm", triton_root="/models")
    candidates = {
        "champion": Candidate("/local/pulled/smollm2", named="smollm2-135m"),
        "challenger": Candidate("HuggingFaceTB/SmolLM2-135M-Instruct", taught_adapters["words"],
                                named="HuggingFaceTB/SmolLM2-135M-Instruct"),
    }  # fmt: skip
    model = names.triton_candidate_model("calc")
    # Versions of evaluations killed before they removed theirs: a day old goes, an hour
    # old (another evaluation may be using it) stays.
    now_ms = int(time.time() * 1000)
    old, recent = now_ms - 25 * 3600_000, now_ms - 3600_000
    for leftover in (old, recent):
        (tmp_path / "repo" / model / str(leftover)).mkdir(parents=True)
        (tmp_path / "repo" / model / str(leftover) / "model.json").write_text("{}")
    with staged_engine(NoServers(), repository, "calc", candidates, options,  # type: ignore[arg-type]
                       triton_url="triton:8000") as served:  # fmt: skip
        (version,) = set(repository.versions(model)) - {recent}
        folder = tmp_path / "repo" / model / str(version)
        args = json.loads((folder / "model.json").read_text())
        assert args["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
        assert json.loads((folder / "multi_lora.json").read_text()) == {
            "challenger": f"/models/{model}/{version}/adapters/challenger"
        }
        assert (folder / "adapters" / "challenger" / "adapter_config.json").exists()
        assert served["champion"].lora_name is None
    assert repository.versions(model) == [recent]
