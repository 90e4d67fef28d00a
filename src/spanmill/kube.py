"""The Kubernetes API as every spanmill part reaches it: one way to build a client, and one
bound on how long a call may wait.

The ``kubernetes`` client waits for ever by default. An API server that takes a
connection and never answers (a control plane failing over, a proxy dropping packets)
would hold the caller for good, and its work with it: a rollout controller's pass, a
pipeline step waiting for a TrainJob. Every call passes ``_request_timeout`` as
:func:`request_timeout` gives it; a test reads the source and fails on one that does not.
"""

from __future__ import annotations

import os
from typing import Any

from spanmill.errors import ConfigError

# How long one call may wait for its answer (a watch gives its own, longer bound).
API_TIMEOUT_S = 10.0


def request_timeout(seconds: float | None = None) -> tuple[float, float]:
    """A call's ``_request_timeout``: ``seconds`` (default API_TIMEOUT_S) to connect, and as
    long for each read. The client takes a bare number only as an int and ignores a float
    without a word (kubernetes/client/rest.py), so the bound is always given as a pair."""
    bound = API_TIMEOUT_S if seconds is None else seconds
    return (bound, bound)


def kube_api_client() -> Any:
    """An API client from the pod's service account, or else from the kubeconfig."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        try:
            # Read KUBECONFIG now: the client reads it once, when first imported.
            config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG") or None,
                client_configuration=configuration,
            )
        except (config.ConfigException, OSError) as exc:
            raise ConfigError(
                f"no Kubernetes configuration: not running in a cluster and no usable kubeconfig "
                f"({exc}); set KUBECONFIG or run inside the cluster"
            ) from None
    # One try a call: urllib3 would try a GET or a PUT that timed out three more times,
    # four bounds in all. Every caller tries again on its own clock (the next pass, the
    # next renewal of the Lease, the next poll).
    configuration.retries = 0
    return client.ApiClient(configuration)
