"""spanmill: a data flywheel for agents.

Production agents emit spans; Kafka carries them; a collector stores them; a
pipeline builds a dataset, fine-tunes a LoRA adapter, evaluates it against the
model in service, registers it in MLflow and rolls it out to Triton.
"""

import os

__version__ = "0.1.0"

# Torch's OpenMP threads spin on a busy core while they wait for work. On a machine
# shared with other processes (the local stack's Triton instances beside a training
# step, two training steps, the collector) the spinning takes the cores the others
# need: two SmolLM2 training steps side by side on two cores ran at half the speed
# with spinning threads than with sleeping ones, and a step alone runs as fast either
# way (README, Development). Set here, before any module imports torch, so every
# process of the project and every process it starts sleeps its idle threads; a
# value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
