"""spanmill: a data flywheel for agents.

Production agents emit spans; Kafka carries them; a collector stores them; a
pipeline builds a dataset, fine-tunes a LoRA adapter, evaluates it against the
model in service, registers it in MLflow and rolls it out to Triton.
"""

__version__ = "0.1.0"
