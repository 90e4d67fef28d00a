"""The flywheel pipeline: compiling it, running it locally, sending it to Kubeflow."""
