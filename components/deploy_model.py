"""Component: the new version loaded into Triton and smoke-checked, before any traffic."""

from kfp import dsl

from components import IMAGE


@dsl.component(base_image=IMAGE)
def deploy_model(
    agent: str,
    version: int,
    triton_url: str = "",
    model_repository: str = "",
    flavour: str = "",
    tracking_uri: str = "",
) -> float:
    from spanmill.pipeline.steps import deploy_step

    return deploy_step(
        agent=agent, version=version, triton_url=triton_url,
        model_repository=model_repository, flavour=flavour, tracking_uri=tracking_uri,
    )  # fmt: skip
