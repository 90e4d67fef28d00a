"""The OpenAI-compatible gateway in front of Triton; every call it serves becomes a span."""
