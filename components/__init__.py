"""Kubeflow Pipelines components of the flywheel: thin shells over spanmill.pipeline.steps.

The training step runs in the CUDA image (services/train/Dockerfile); every other
component runs in the CPU pipeline image (services/pipeline/Dockerfile).
tests/charts/test_dockerfiles.py checks that each image holds what its components import.
"""

import os

# The images the components run in, as services/pipeline/Dockerfile and
# services/train/Dockerfile tag them; set SPANMILL_PIPELINE_IMAGE and
# SPANMILL_PIPELINE_TRAIN_IMAGE when compiling for your registry, or give them to
# `spanmill pipeline upload --image --train-image` (the chart's upload Job does).
IMAGE = os.environ.get("SPANMILL_PIPELINE_IMAGE", "ghcr.io/spanmill/pipeline:0.1.0")
TRAIN_IMAGE = os.environ.get("SPANMILL_PIPELINE_TRAIN_IMAGE", "ghcr.io/spanmill/train:0.1.0")
