"""A key/value cache that grows in place.

transformers' ``DynamicCache`` appends a decode step's keys and values with
``torch.cat``: every step copies the whole cache. For 32 rows of 700 tokens on
SmolLM2-135M that is a gigabyte a step, as much time on a CPU as the step's own
arithmetic. Here each layer keeps its keys and values in a buffer with room to spare;
a step writes its column into the room, and the layer hands the model a view of the
part in use. The buffer is reallocated (with a quarter more room) only when it is
full, or when something outside replaced the layer's tensors (a batch selection, a
crop): the cache behaves as a ``DynamicCache`` for everything else.
"""

from __future__ import annotations

from typing import Any

from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# Columns of room a buffer gets beyond what it holds, at least.
MIN_ROOM = 64


class RoomyLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views into buffers with spare columns."""

    def __init__(self) -> None:
        super().__init__()
        self._key_buffer: Any = None
        self._value_buffer: Any = None
        self._length = 0
        self._handed: Any = None  # the keys view last handed out

    def update(
        self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any
    ) -> tuple[Any, Any]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.keys is not self._handed:
            self._adopt(self.keys, self.values)
        end = self._length + int(key_states.shape[-2])
        if self._key_buffer is None or end > self._key_buffer.shape[2]:
            self._grow(key_states, value_states, end)
        self._key_buffer[:, :, self._length : end] = key_states
        self._value_buffer[:, :, self._length : end] = value_states
        self._length = end
        self.keys = self._handed = self._key_buffer[:, :, :end]
        self.values = self._value_buffer[:, :, :end]
        return self.keys, self.values

    def _adopt(self, keys: Any, values: Any) -> None:
        """Take tensors set from outside (a batch selection, a crop; or none yet) as the
        part in use."""
        if keys is None or keys.numel() == 0:
            self._key_buffer = self._value_buffer = None
            self._length = 0
        else:
            self._key_buffer, self._value_buffer = keys, values
            self._length = int(keys.shape[2])

    def _grow(self, key_states: Any, value_states: Any, needed: int) -> None:
        capacity = needed + max(MIN_ROOM, needed // 4)
        batch, heads, _, key_dim = key_states.shape
        keys = key_states.new_zeros((batch, heads, capacity, key_dim))
        values = value_states.new_zeros((batch, heads, capacity, value_states.shape[-1]))
        if self._key_buffer is not None and self._length:
            keys[:, :, : self._length] = self._key_buffer[:, :, : self._length]
            values[:, :, : self._length] = self._value_buffer[:, :, : self._length]
        self._key_buffer, self._value_buffer = keys, values


class RoomyCache(DynamicCache):
    """A ``DynamicCache`` whose full-attention layers grow in place (sliding-window and
    other layers stay transformers' own)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config=config)
        self.layers = [
            RoomyLayer() if type(layer) is DynamicLayer else layer for layer in self.layers
        ]
