"""Kubeflow Pipelines components of the flywheel: thin shells over spanmill.pipeline.steps.

Every component runs in the pipeline image (services/pipeline/Dockerfile), which
has spanmill with its train, pipelines, collector and rollout extras installed.
"""

import os

# The image the components run in; set SPANMILL_PIPELINE_IMAGE when compiling for
# your registry.
IMAGE = os.environ.get("SPANMILL_PIPELINE_IMAGE", "spanmill/pipeline:0.1.0")
