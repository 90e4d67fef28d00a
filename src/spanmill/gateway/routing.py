"""The routing table: which Triton model and versions answer a requested model name.

Pure data and one decision (:meth:`Route.choose`); where the table comes from (a
file the gateway watches, the admin endpoint, a ConfigMap on Kubernetes) is the
caller's business. The rollout controller writes it.
"""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from spanmill.errors import ConfigError

log = logging.getLogger(__name__)


class Backend(BaseModel):
    """One registered version taking a share of a route's traffic.

    In the Python flavour it is the Triton version of the same number. In the vLLM
    flavour every version is served by the model's one engine: an adapter version
    by its ``lora_name``, the base model (version 1 of an agent, say) by none.
    """

    version: str = Field(pattern=r"^[1-9][0-9]*$")
    weight: float = Field(ge=0, allow_inf_nan=False)
    role: str = "champion"
    lora_name: str | None = Field(default=None, min_length=1)


class Route(BaseModel):
    triton_model: str
    backends: list[Backend] = Field(min_length=1)
    # python: spanmill's own model in Triton's Python backend, which renders the chat
    # template itself; vllm: Triton's vLLM backend, which takes text, so the gateway
    # renders the prompt with the tokenizer of ``base_model`` (a hub id, an s3://
    # folder, or a path the gateway can read).
    flavour: Literal["python", "vllm"] = "python"
    base_model: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _some_weight(self) -> Route:
        total = sum(b.weight for b in self.backends)
        if not 0 < total < math.inf:
            raise ValueError(
                "the weights of a route's backends must add up to more than 0, and to a "
                "finite number"
            )
        if self.flavour == "vllm" and self.base_model is None:
            raise ValueError("a vllm route names its base_model (the gateway renders prompts)")
        if self.flavour == "python" and any(b.lora_name for b in self.backends):
            raise ValueError("lora_name is for vllm routes; a python version is its own model")
        return self

    def choose(self, rng: random.Random) -> Backend:
        """Pick a backend in proportion to its weight."""
        return rng.choices(self.backends, weights=[b.weight for b in self.backends], k=1)[0]


class RoutingTable(BaseModel):
    """Requested model name -> route. ``revision`` grows with every change."""

    revision: int = 0
    routes: dict[str, Route] = Field(default_factory=dict)

    @classmethod
    def parse(cls, text: str | bytes, source: str = "routing table") -> RoutingTable:
        try:
            return cls.model_validate(json.loads(text))
        except (ValueError, ValidationError) as exc:
            raise ConfigError(f"{source} is invalid: {exc}") from None
        except RecursionError:
            raise ConfigError(f"{source} is invalid: JSON nested too deeply") from None

    def dumps(self) -> str:
        return self.model_dump_json(indent=2)


class RoutingFile:
    """A routing table kept in a JSON file, re-read when the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._table = RoutingTable()

    def current(self) -> RoutingTable:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return self._table
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._table = RoutingTable.parse(self.path.read_bytes(), str(self.path))
            except ConfigError as exc:
                # A bad edit keeps the last good table instead of breaking serving.
                log.error("keeping routing revision %s: %s", self._table.revision, exc)
        return self._table

    def write(self, table: RoutingTable) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(table.dumps())
        tmp.replace(self.path)
