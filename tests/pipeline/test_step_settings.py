"""A step's connections: a run parameter a person set wins; an empty one falls back to the
environment the cluster's ConfigMap gives every step (spanmill.pipeline.cluster)."""

from __future__ import annotations

import pytest

from spanmill.errors import ConfigError
from spanmill.pipeline import steps


@pytest.fixture
def cluster_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "SPANMILL_TRITON_HTTP_URL": "triton.spanmill.svc:8000",
        "SPANMILL_TRITON_MODEL_REPOSITORY": "s3://spanmill/models",
        "SPANMILL_TRITON_DISCOVERY": "endpointslices",
        "SPANMILL_MLFLOW_TRACKING_URI": "http://mlflow.spanmill.svc:5000",
        "SPANMILL_SERVING_FLAVOUR": "vllm",
        "SPANMILL_SERVING_COPY_BASE": "true",
    }.items():
        monkeypatch.setenv(key, value)


@pytest.mark.usefixtures("cluster_env")
def test_empty_parameters_come_from_the_cluster() -> None:
    triton = steps._triton("", "")
    assert triton.http_url == "triton.spanmill.svc:8000"
    assert triton.model_repository == "s3://spanmill/models"
    assert triton.discovery == "endpointslices"
    assert steps._mlflow("").tracking_uri == "http://mlflow.spanmill.svc:5000"
    serving = steps._serving("")
    assert serving.flavour == "vllm" and serving.copy_base


@pytest.mark.usefixtures("cluster_env")
def test_a_parameter_a_person_sets_wins() -> None:
    triton = steps._triton("10.0.0.5:8000", "/models")
    assert (triton.http_url, triton.model_repository) == ("10.0.0.5:8000", "/models")
    # What the person did not set still comes from the cluster.
    assert triton.discovery == "endpointslices"
    assert steps._mlflow("http://elsewhere:5000").tracking_uri == "http://elsewhere:5000"
    serving = steps._serving("python", num_threads=4)
    assert (serving.flavour, serving.num_threads, serving.copy_base) == ("python", 4, True)


def test_a_bad_cluster_value_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPANMILL_SERVING_FLAVOUR", "tensorrt")
    with pytest.raises(ConfigError, match="SPANMILL_SERVING_FLAVOUR"):
        steps._serving("")


def test_the_gate_the_environment_sets_reaches_a_pipeline_evaluation(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate's fields a run does not pass (the tolerances, the deciding suite, whether
    the difference must be significant) come from SPANMILL_EVAL_GATE__*, as for the CLI;
    the run's own margin and metric win."""
    import spanmill.evaluate
    from spanmill.evaluate import EvalSettings

    seen: list[EvalSettings] = []

    def evaluate(dataset: object, model: object, out: object, settings: EvalSettings) -> None:
        seen.append(settings)
        raise ConfigError("stop here")

    monkeypatch.setattr(spanmill.evaluate, "evaluate", evaluate)
    monkeypatch.setenv("SPANMILL_EVAL_GATE__REQUIRE_SIGNIFICANT", "true")
    monkeypatch.setenv("SPANMILL_EVAL_GATE__FORMAT_TOLERANCE", "0.3")
    monkeypatch.setenv("SPANMILL_EVAL_GATE__MARGIN", "0.2")
    with pytest.raises(ConfigError, match="stop here"):
        steps.evaluate_step(tmp_path, tmp_path, tmp_path, agent="calc", base_model="b",  # type: ignore[arg-type]
                            margin=0.05, gate_metric="success_rate")  # fmt: skip
    gate = seen[0].gate
    assert gate.require_significant and gate.format_tolerance == 0.3
    assert (gate.margin, gate.metric) == (0.05, "success_rate")
