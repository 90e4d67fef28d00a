"""Plugins found by name through entry points: tasks, evaluators.

A distribution lists what it provides in an entry-point group (``name =
"module:object"``); a :class:`Plugins` registry lists the group on first use and
loads each entry only when it is first asked for, so a broken plugin fails only
the lookups that need it, with an error naming it, the entry point and what is
installed. Objects defined in-process (tests) can be registered beside them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from spanmill.errors import SpanmillError

T = TypeVar("T")


class Plugins(Mapping[str, T], Generic[T]):
    """Every ``kind`` by name: the ``group`` entry points of the installed distributions,
    and those registered in-process. ``check(name, loaded)`` returns the plugin or raises
    ``error`` saying what is wrong with it."""

    def __init__(
        self,
        group: str,
        kind: str,
        check: Callable[[str, Any], T],
        error: type[SpanmillError] = SpanmillError,
    ) -> None:
        self.group = group
        self.kind = kind
        self.check = check
        self.error = error
        self._registered: dict[str, T] = {}
        self._entry_points: dict[str, EntryPoint] | None = None
        self._loaded: dict[str, T] = {}
        self._clashes: dict[str, list[EntryPoint]] = {}

    def register(self, name: str, plugin: T) -> None:
        """Make ``plugin`` available as ``name`` in this process."""
        taken = self._registered.get(name)
        if taken is not None and taken is not plugin:
            raise ValueError(
                f"{self.kind} name {name!r} is taken by {getattr(taken, '__qualname__', taken)}"
            )
        found = self.entry_points().get(name)
        if found is not None and found.value != _describe(plugin):
            raise ValueError(
                f"{self.kind} name {name!r} is taken by the installed plugin {found.value} "
                f"(entry point group {self.group!r})"
            )
        self._registered[name] = plugin

    def entry_points(self) -> dict[str, EntryPoint]:
        if self._entry_points is None:
            # Distributions come unique by name, so an editable install seen twice on
            # sys.path lists each entry once; two distributions may still claim a name.
            found: dict[str, EntryPoint] = {}
            for entry in entry_points(group=self.group):
                if entry.name in found and found[entry.name].value != entry.value:
                    self._clashes[entry.name] = [found[entry.name], entry]
                found[entry.name] = entry
            self._entry_points = found
        return self._entry_points

    def installed(self) -> str:
        """The names, for an error message."""
        return ", ".join(sorted(self)) or "none"

    def __getitem__(self, name: str) -> T:
        if name in self._registered:
            return self._registered[name]
        if name in self._loaded:
            return self._loaded[name]
        found = self.entry_points()[name]
        if name in self._clashes:
            claims = " and ".join(f"{_distribution(e)} ({e.value})" for e in self._clashes[name])
            raise self.error(
                f"{self.kind} {name!r} is claimed by {claims} in entry point group "
                f"{self.group!r}; uninstall one or rename its entry point"
            )
        self._loaded[name] = self._load(found)
        return self._loaded[name]

    def _load(self, found: EntryPoint) -> T:
        try:
            loaded = found.load()
        except Exception as exc:
            raise self.error(
                f"{self.where(found)} failed to load: {type(exc).__name__}: {exc}; is the "
                f"distribution that provides it installed with its dependencies? Installed "
                f"{self.kind}s: {self.installed()}"
            ) from exc
        return self.check(found.name, loaded)

    def where(self, found: EntryPoint) -> str:
        return f"{self.kind} {found.name!r} ({self.group} entry point {found.value!r})"

    def __iter__(self) -> Iterator[str]:
        return iter(sorted({*self.entry_points(), *self._registered}))

    def __len__(self) -> int:
        return len({*self.entry_points(), *self._registered})


def _describe(plugin: Any) -> str:
    return f"{getattr(plugin, '__module__', '?')}:{getattr(plugin, '__qualname__', plugin)}"


def _distribution(entry: EntryPoint) -> str:
    return entry.dist.name if entry.dist is not None else "an unnamed distribution"
