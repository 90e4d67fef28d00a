"""``spanmill pipeline``: compile the flywheel, run it locally, send it to Kubeflow."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from spanmill.cli.console import console, handle_errors

app = typer.Typer(help="The flywheel pipeline on Kubeflow (or locally).", no_args_is_help=True)


@app.callback()
def pipeline() -> None:
    """The flywheel pipeline on Kubeflow (or locally)."""


@app.command("compile")
@handle_errors
def compile_cmd(
    out: Path = typer.Option(
        None, help="Where to write the YAML (default: pipelines/flywheel.yaml)."
    ),
) -> None:
    """Compile the flywheel pipeline to YAML."""
    from spanmill.pipeline.build import DEFAULT_PACKAGE, compile_pipeline

    path = compile_pipeline(out or DEFAULT_PACKAGE)
    console.print(f"[green]✓[/] compiled {path}")


@app.command()
@handle_errors
def run(
    local: bool = typer.Option(..., "--local", help="Run with kfp's local runner (required)."),
    root: Path = typer.Option(Path(".cache/pipeline-root"), help="Local pipeline root."),
    params: str = typer.Option("{}", help='Pipeline parameters as JSON, e.g. {"max_steps": 30}.'),
) -> None:
    """Run the flywheel on this machine against the embedded stack."""
    from spanmill.errors import ConfigError
    from spanmill.pipeline.build import run_local

    if not local:
        raise ConfigError("only --local runs are started from here; use `upload` for Kubeflow")
    try:
        values = json.loads(params)
    except ValueError as exc:
        raise ConfigError(f"--params must be a JSON object: {exc}") from None
    with console.status("running the flywheel locally…"):
        run_local(root, **values)
    console.print(f"[green]✓[/] flywheel finished; artifacts under {root}")


_SA_TOKEN = typer.Option(
    False,
    "--sa-token",
    help="Sign requests with the pod's projected service-account token (audience "
    "pipelines.kubeflow.org), as multi-user Kubeflow wants; read from --token-file.",
)
_TOKEN_FILE = typer.Option(
    None,
    help="The token's file, read again for every request (default with --sa-token: "
    "/var/run/secrets/kubeflow/pipelines/token).",
)


def _token_file(sa_token: bool, token_file: Path | None) -> Path | None:
    from spanmill.pipeline.kubeflow import SA_TOKEN_PATH

    return token_file or (SA_TOKEN_PATH if sa_token else None)


@app.command()
@handle_errors
def upload(
    endpoint: str = typer.Option(
        ..., help="Kubeflow Pipelines API, e.g. http://ml-pipeline-ui:80."
    ),
    file: Path = typer.Option(None, help="Compiled pipeline (default: pipelines/flywheel.yaml)."),
    name: str = typer.Option("flywheel", help="Pipeline name in Kubeflow."),
    sa_token: bool = _SA_TOKEN,
    token_file: Path = _TOKEN_FILE,
    image: str = typer.Option(
        None, help="Image of every step but training (default: as compiled)."
    ),
    train_image: str = typer.Option(
        None, help="Image of the training steps (default: as compiled)."
    ),
    model_claim: str = typer.Option(
        None,
        help="PersistentVolumeClaim of a model repository on a volume: mounted in the "
        "evaluation steps, which stage their candidates there.",
    ),
    model_path: str = typer.Option("/models", help="Where --model-claim is mounted."),
) -> None:
    """Upload the compiled pipeline as a new version (token from SPANMILL_KFP_TOKEN, or
    the service-account token with --sa-token), its steps' images replaced where given."""
    from spanmill.pipeline.build import DEFAULT_PACKAGE
    from spanmill.pipeline.kubeflow import upload as send

    result = send(
        endpoint, file or DEFAULT_PACKAGE, name, token_file=_token_file(sa_token, token_file),
        image=image, train_image=train_image, model_claim=model_claim, model_path=model_path,
    )  # fmt: skip
    what = "new pipeline" if result.new_pipeline else "new version"
    console.print(f"[green]✓[/] {what} {result.version_name} ({result.version_id})")
    typer.echo(json.dumps(result.__dict__))


@app.command()
@handle_errors
def schedule(
    endpoint: str = typer.Option(..., help="Kubeflow Pipelines API."),
    pipeline_id: str = typer.Option(..., help="Pipeline id (printed by upload)."),
    version_id: str = typer.Option(None, help="Version id (default: the pipeline's latest)."),
    cron: str = typer.Option("0 0 2 * * *", help="6-field cron, seconds first."),
    name: str = typer.Option("flywheel-nightly", help="Recurring run name."),
    experiment: str = typer.Option("spanmill", help="Kubeflow experiment."),
    params: str = typer.Option("{}", help="Pipeline parameters as JSON."),
    sa_token: bool = _SA_TOKEN,
    token_file: Path = _TOKEN_FILE,
) -> None:
    """Create a recurring run of the flywheel, replacing one of the same name (run it
    again after an upload to move the nightly run onto the new version)."""
    from spanmill.pipeline.kubeflow import schedule as create

    run_id = create(
        endpoint, pipeline_id=pipeline_id, version_id=version_id, cron=cron, job_name=name,
        experiment=experiment, params=json.loads(params),
        token_file=_token_file(sa_token, token_file),
    )  # fmt: skip
    console.print(f"[green]✓[/] recurring run {run_id} ({cron})")
