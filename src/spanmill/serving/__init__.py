"""Serving models through Triton: the tensor protocol, generation, and the model repository."""
