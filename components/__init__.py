"""Kubeflow Pipelines components of the flywheel: thin shells over spanmill.pipeline.steps.

The training step runs in the CUDA image (services/train/Dockerfile); every other
component runs in the CPU pipeline image (services/pipeline/Dockerfile).
tests/charts/test_dockerfiles.py checks that each image holds what its components import.
"""

import os

# The images the components run in; set SPANMILL_PIPELINE_IMAGE and
# SPANMILL_PIPELINE_TRAIN_IMAGE when compiling for your registry.
IMAGE = os.environ.get("SPANMILL_PIPELINE_IMAGE", "spanmill/pipeline:0.1.0")
TRAIN_IMAGE = os.environ.get("SPANMILL_PIPELINE_TRAIN_IMAGE", "spanmill/train:0.1.0")
