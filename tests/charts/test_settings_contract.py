"""One source of truth: the chart starts the commands and sets the settings the code defines.

Every ``SPANMILL_*`` variable the chart gives the collector, gateway and rollout
controller must be a field of that service's settings model in ``spanmill.config``
(env prefix + field name, through the connection models it composes), and its rendered
value must load. Every command must be one ``spanmill.cli.main`` registers, with
options it declares. Where the local stack starts the same process, the chart sets
at least what the stack sets.
"""

from __future__ import annotations

import importlib.util
import os
import tomllib
import warnings
from pathlib import Path
from typing import Any

import pytest
import typer.main
from helm_render import ROOT, VALUE_SETS, Rendered, env_of, merged_values
from pydantic_settings import BaseSettings

from spanmill import paths
from spanmill.cli.main import app
from spanmill.collector.redact import Redactor
from spanmill.config import CollectorSettings, GatewaySettings, RolloutSettings, load_settings
from spanmill.stack import services

SERVICES: dict[str, type[BaseSettings]] = {
    "collector": CollectorSettings,
    "gateway": GatewaySettings,
    "rollout": RolloutSettings,
}

# Names the chart renders ahead of the code, each tolerated only while the module
# that is to define it does not exist yet; once it does, the name must be real.
PENDING_ENV: dict[str, str] = {}
PENDING_COMMANDS: dict[tuple[str, ...], str] = {}

# Variables read outside the settings models: spanmill.paths and the libraries the services use
# (the AWS SDK behind s3fs and MLflow; MLflow's client credentials; Python itself).
PROCESS_ENV = {
    "SPANMILL_HOME",
    "HOME",
    "PYTHONUNBUFFERED",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
}


def _landed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def settings_env_names(model: type[BaseSettings]) -> set[str]:
    """Every variable that feeds ``model``: its prefix + field, and its nested models'."""
    prefix = str(model.model_config.get("env_prefix", ""))
    names = set()
    for field_name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseSettings):
            names |= settings_env_names(annotation)
        else:
            names.add((prefix + field_name).upper())
    return names


def _command(path: tuple[str, ...]) -> Any:
    command: Any = typer.main.get_command(app)
    for part in path:
        group: dict[str, Any] = getattr(command, "commands", {})
        if part not in group:
            return None
        command = group[part]
    return command


def _split_args(args: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """Command path (the leading words) and the options that follow."""
    words = []
    for arg in args:
        if arg.startswith("-"):
            break
        words.append(arg)
    return tuple(words), args[len(words) :]


def _check_command(where: str, command: list[str], args: list[str]) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert command == ["spanmill"], f"{where}: runs {command}, not the spanmill CLI"
    assert scripts["spanmill"] == "spanmill.cli.main:app"
    path, rest = _split_args(args)
    # The chart passes no positional arguments: the leading words are the command. A
    # group counts when it runs on its own (``spanmill rollout`` runs the controller).
    found = _command(path)
    if found is not None and hasattr(found, "commands") and not found.invoke_without_command:
        found = None
    if found is None:
        pending = PENDING_COMMANDS.get(path)
        assert pending is not None, f"{where}: `spanmill {' '.join(path)}` is not a command"
        assert not _landed(pending), (
            f"{where}: {pending} exists now, but `spanmill {' '.join(path)}` is not registered "
            f"in spanmill.cli.main; register it or align the chart"
        )
        return
    declared = {opt for param in found.params for opt in param.opts}
    for arg in rest:
        if arg.startswith("--"):
            assert arg.split("=", 1)[0] in declared, f"{where}: {arg} is not an option of {path}"


def _deployment(rendered: Rendered, service: str) -> dict[str, Any]:
    container: dict[str, Any] = rendered.container(f"spanmill-{service}")
    return container


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_service_env_names_are_settings_fields(rendered: Rendered, service: str) -> None:
    model = SERVICES[service]
    known = settings_env_names(model)
    for name in env_of(_deployment(rendered, service)):
        if name in PROCESS_ENV:
            continue
        assert name.startswith("SPANMILL_"), f"{service}: {name} is neither spanmill's nor known"
        if name in known:
            continue
        module = PENDING_ENV.get(name)
        assert module is not None, (
            f"{service}: {name} is not a field of {model.__name__} or of the connection "
            f"models it composes (spanmill.config); fix the chart or add the setting"
        )
        assert not _landed(module), (
            f"{service}: {module} exists now but {name} is still not a field of "
            f"{model.__name__}; align the chart with the setting's real name"
        )


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_service_env_values_load_into_the_settings(
    rendered: Rendered, service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("SPANMILL_"):
            monkeypatch.delenv(name)
    for name, entry in env_of(_deployment(rendered, service)).items():
        # Secret values are whatever the Secret holds; any string stands in for them.
        value = entry.get("value", "from-a-secret")
        if "resourceFieldRef" in entry.get("valueFrom", {}):
            # The kubelet gives a whole number of the divisor: cores, rounded up.
            assert entry["valueFrom"]["resourceFieldRef"]["divisor"] == "1"
            value = "1"
        monkeypatch.setenv(name, value)
    settings: Any = load_settings(SERVICES[service])
    if service == "collector":
        assert settings.http_host == "0.0.0.0"
        assert settings.store_url.startswith("s3://")
        assert (settings.processes, settings.workers, settings.cpus) == ("auto", "auto", 1)
        # The most pods the group may have: the autoscaler's maximum, or the replicas.
        hpa = rendered.find("HorizontalPodAutoscaler", "spanmill-collector")
        deployment = rendered.get("Deployment", "spanmill-collector")
        most = hpa["spec"]["maxReplicas"] if hpa else deployment["spec"]["replicas"]
        assert settings.instances == most
        # Redaction as the values say; by default exactly the code's own defaults.
        values = merged_values(rendered.name)["collector"]
        assert settings.redact_patterns == values["redactPatterns"]
        assert settings.attributes_deny == values["attributesDeny"]
        assert settings.attributes_allow == values["attributesAllow"]
        assert settings.redact_rules == values["redactRules"]
        assert settings.conventions == values["conventions"]
        if rendered.name == "defaults":  # the fields' own defaults, not the environment's
            fields = CollectorSettings.model_fields
            names = ("redact_rules", "redact_patterns", "attributes_deny", "attributes_allow",
                     "conventions")  # fmt: skip
            for name in names:
                default = fields[name].get_default(call_default_factory=True)
                assert getattr(settings, name) == default, name
        else:
            # The redactor the collector builds from them takes the patterns.
            redactor = Redactor(settings.redact_rules, settings.redact_patterns,
                                settings.attributes_allow, settings.attributes_deny)  # fmt: skip
            assert set(values["redactPatterns"]) <= {rule.name for rule in redactor.rules}
    if service == "gateway":
        assert settings.host == "0.0.0.0"
        # One routing source: the ConfigMap through the API, or the same mounted as a file.
        if settings.routing_configmap:
            assert settings.routing_file is None
            assert settings.routing_configmap == "spanmill/spanmill-routing"
        else:
            assert str(settings.routing_file) == "/etc/spanmill/routing/routes.json"
    if service == "rollout":
        assert settings.backend == "kubernetes"
        assert settings.mlflow.tracking_uri.startswith("http")
        # The ConfigMap the chart creates, the one the gateway reads and RBAC names.
        assert (settings.namespace, settings.configmap) == ("spanmill", "spanmill-routing")
        assert settings.http_host == "0.0.0.0"


def test_spanmill_home_is_read_by_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPANMILL_HOME", "/tmp/spanmill")
    assert paths.home() == Path("/tmp/spanmill")


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_service_runs_a_registered_cli_command(rendered: Rendered, service: str) -> None:
    container = _deployment(rendered, service)
    _check_command(f"{rendered.name}/{service}", container["command"], container["args"])
    assert container["args"][0] == service


def test_pipeline_upload_job_runs_a_registered_command(render_set: Any) -> None:
    rendered = render_set("all-features")
    container = rendered.get("Job", "spanmill-pipeline-upload")["spec"]["template"]["spec"][
        "containers"
    ][0]
    _check_command("pipeline-upload", container["command"], container["args"])


# A local setting and the settings that stand for it on a cluster.
CLUSTER_EQUIVALENTS = {"routing_file": {"routing_file", "routing_configmap"}}


def test_gateway_gets_what_the_local_stack_gives_it(render_set: Any, tmp_path: Path) -> None:
    local = services.GatewayProcess(
        "127.0.0.1",
        18080,
        tmp_path,
        routing_file=tmp_path / "routes.json",
        kafka_bootstrap="127.0.0.1:19092",
        triton_url="127.0.0.1:18000",
    )
    local_env = {k for k in local.env() if k.startswith("SPANMILL_") and k not in os.environ}
    argv = list(local.argv())
    command = argv[argv.index("gateway") :]
    for name in VALUE_SETS:
        container = render_set(name).container("spanmill-gateway")
        assert container["args"] == command[:1], f"{name}: runs {container['args']}"
        chart_env = set(env_of(container))
        prefix = "SPANMILL_GATEWAY_"
        for variable in local_env:
            field = variable.removeprefix(prefix).lower()
            if variable.startswith(prefix):
                assert field in GatewaySettings.model_fields, variable
            names = {f"{prefix}{f.upper()}" for f in CLUSTER_EQUIVALENTS.get(field, set())}
            assert ({variable} | names) & chart_env, f"{name}: the chart lacks {variable}"


def test_collector_gets_what_the_local_stack_gives_it(render_set: Any, tmp_path: Path) -> None:
    local = services.CollectorProcess(
        "127.0.0.1",
        4318,
        tmp_path,
        store_url=str(tmp_path / "spans"),
        kafka_bootstrap="127.0.0.1:19092",
    )
    local_env = {k for k in local.env() if k.startswith("SPANMILL_") and k not in os.environ}
    argv = list(local.argv())
    assert argv[1:4] == ["-m", "spanmill.cli.main", "collector"]
    for name in VALUE_SETS:
        container = render_set(name).container("spanmill-collector")
        assert container["args"] == argv[3:], f"{name}: runs {container['args']}"
        chart_env = set(env_of(container))
        assert local_env <= chart_env, f"{name}: the chart lacks {local_env - chart_env}"


def _flags(args: list[str]) -> dict[str, str]:
    return dict(
        [*a.split("=", 1), ""][:2] if "=" in a else (a, "") for a in args if a.startswith("--")
    )


class _Install:
    binary = Path("tritonserver")
    backend_dir = Path("backends")


def test_triton_runs_with_the_local_stacks_flags(render_set: Any, tmp_path: Path) -> None:
    local = services.TritonServer.__new__(services.TritonServer)
    local.host, local.http_port, local.grpc_port, local.metrics_port = "127.0.0.1", 1, 2, 3
    local.model_repository, local.install = tmp_path / "models", _Install()  # type: ignore[assignment]
    local_flags = _flags(list(local.argv())[1:])
    # Addresses, ports and paths differ on a cluster; pinned memory and GPU metrics
    # are off locally only because there is no GPU.
    placement = {
        "--model-repository",
        "--backend-directory",
        "--http-address",
        "--http-port",
        "--grpc-address",
        "--grpc-port",
        "--metrics-address",
        "--metrics-port",
        "--pinned-memory-pool-byte-size",
        "--allow-gpu-metrics",
    }
    behaviour = {k: v for k, v in local_flags.items() if k not in placement}
    assert "--model-control-mode" in behaviour
    for name in VALUE_SETS:
        triton = render_set(name).container("spanmill-triton")
        assert triton["command"] == ["tritonserver"]
        chart_flags = _flags(triton["args"])
        for flag, value in behaviour.items():
            assert chart_flags.get(flag) == value, f"{name}: {flag}={value}"
        for flag in ("--model-repository", "--http-port", "--grpc-port", "--metrics-port"):
            assert flag in chart_flags, f"{name}: {flag}"


def test_mlflow_runs_as_the_local_stack_runs_it(render_set: Any, tmp_path: Path) -> None:
    local = services.MLflowServer.__new__(services.MLflowServer)
    local.host, local.port, local.work_dir = "127.0.0.1", 1, tmp_path
    local.binary = Path("mlflow")
    argv = list(local.argv())
    local_options = {a for a in argv if a.startswith("--")}
    env = {k: v for k, v in local.env().items() if k.startswith("MLFLOW_")}
    for name in ("defaults", "all-features"):
        mlflow = render_set(name).container("spanmill-mlflow")
        # With authentication, mlflow-with-auth (services/mlflow/mlflow-with-auth.sh)
        # writes the auth config and runs `mlflow` with the same arguments.
        assert mlflow["command"] in (["mlflow"], ["mlflow-with-auth"])
        assert mlflow["args"][0] == argv[1] == "server"
        chart_options = set(_flags(mlflow["args"]))
        chart_env = env_of(mlflow)
        # A database URI holds a password: MLflow reads it from its environment.
        if "MLFLOW_BACKEND_STORE_URI" in chart_env:
            chart_options.add("--backend-store-uri")
        assert local_options <= chart_options, f"{name}: {local_options - chart_options}"
        for key, value in env.items():
            if key not in os.environ:
                assert chart_env[key]["value"] == value


def test_pending_names_are_still_pending() -> None:
    """A pending name that became real is harmless, but the list should say so: warn."""
    known = set().union(*(settings_env_names(m) for m in SERVICES.values()))
    for name in PENDING_ENV:
        if name in known:
            warnings.warn(f"{name} is a real setting now: drop it from PENDING_ENV", stacklevel=1)
    for path in PENDING_COMMANDS:
        if _command(path) is not None:
            warnings.warn(f"`spanmill {' '.join(path)}` is registered: drop it", stacklevel=1)


def test_store_upkeep_job_sets_store_settings_and_runs_a_registered_command(
    render_set: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spanmill.config import StoreSettings

    rendered = render_set("all-features")
    cronjob = rendered.get("CronJob", "spanmill-store-upkeep")
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"  # one run at a time
    container = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    _check_command("store-upkeep", container["command"], container["args"])
    assert container["args"] == ["store", "compact"]
    known = settings_env_names(StoreSettings)
    for name in list(os.environ):
        if name.startswith("SPANMILL_"):
            monkeypatch.delenv(name)
    for name, entry in env_of(container).items():
        assert name in known or name in PROCESS_ENV, f"store-upkeep: {name} is not a setting"
        monkeypatch.setenv(name, entry.get("value", "from-a-secret"))
    settings = load_settings(StoreSettings)
    assert settings.url.startswith("s3://") and settings.retention_days == 30
    assert settings.user_id_attribute == "enduser.id"
    # By default every span is kept: no retention reaches the job.
    default = render_set("defaults").get("CronJob", "spanmill-store-upkeep")
    default_env = env_of(
        default["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    )
    assert "SPANMILL_STORE_RETENTION_DAYS" not in default_env
