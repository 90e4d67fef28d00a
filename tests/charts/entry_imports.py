"""What an image's entry points import, read from the source (nothing is imported).

Reachability at the granularity of functions: a module's body runs when the module is
imported, so its top-level imports count; a function's own imports (the lazy ones that
keep torch out of a start-up) count only when a reached function or class refers to
that function. A class, once reached, brings all its methods. In a module body only
what is called counts: registering a command (``app.command()(stack.up)``) does not
run it. Imports under ``if TYPE_CHECKING:`` never run, and those under
``try: ... except ImportError`` are optional.

The answer is the set of third-party top-level import names, each with the place
that first needed it, so a failing check can say why an image needs a package.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# A name bound by an import: a module, or an attribute of a module (maybe a submodule).
Binding = tuple[str, str | None]


@dataclass(frozen=True)
class Unit:
    """A module's body (``name`` None) or one of its top-level functions or classes."""

    module: str
    name: str | None = None

    def __str__(self) -> str:
        return self.module if self.name is None else f"{self.module}:{self.name}"


@dataclass
class Module:
    path: Path
    tree: ast.Module
    defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef] = field(
        default_factory=dict
    )
    bindings: dict[str, Binding] = field(default_factory=dict)


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _import_bindings(node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, Binding]]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                yield alias.asname, (alias.name, None)
            else:
                top = alias.name.split(".")[0]
                yield top, (top, None)
    elif node.module and node.level == 0:
        for alias in node.names:
            if alias.name != "*":
                yield alias.asname or alias.name, (node.module, alias.name)


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """Modules an import statement runs (the full dotted names)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module] if node.module and node.level == 0 else []


def _walk(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """ast.walk over several roots, leaving out TYPE_CHECKING blocks and annotations
    (a type named in a signature is not called)."""
    todo = list(nodes)
    while todo:
        node = todo.pop()
        if _is_type_checking(node):
            continue
        yield node
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns"):
                continue
            if isinstance(value, ast.AST):
                todo.append(value)
            elif isinstance(value, list):
                todo.extend(item for item in value if isinstance(item, ast.AST))


def _body_level(statements: Iterable[ast.stmt]) -> Iterator[ast.AST]:
    """What runs when a module or class body runs: not the bodies of its functions or
    classes, but their decorators, default values and (for classes) bases."""
    for statement in statements:
        if _is_type_checking(statement):
            continue
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _walk(statement.decorator_list)
            defaults = [*statement.args.defaults, *statement.args.kw_defaults]
            yield from _walk(d for d in defaults if d is not None)
        elif isinstance(statement, ast.ClassDef):
            yield from _walk([*statement.decorator_list, *statement.bases])
            yield from _body_level(statement.body)
        elif isinstance(statement, ast.If | ast.Try | ast.With | ast.For | ast.While):
            for name in ("body", "orelse", "finalbody"):
                yield from _body_level(getattr(statement, name, []))
            for handler in getattr(statement, "handlers", []):
                yield from _body_level(handler.body)
            for part in ("test", "items", "iter", "target"):
                value = getattr(statement, part, None)
                if isinstance(value, ast.AST):
                    yield from _walk([value])
                elif isinstance(value, list):
                    yield from _walk(item for item in value if isinstance(item, ast.AST))
        else:
            yield from _walk([statement])


def _guarded_imports(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Imports inside ``try: ... except ImportError``: optional, the code says what to
    install when they are missing (spanmill.models.pull converts catalog models only
    where torch is installed)."""
    for node in nodes:
        if not isinstance(node, ast.Try):
            continue
        caught = " ".join(ast.unparse(h.type) for h in node.handlers if h.type is not None)
        if "ImportError" in caught or "ModuleNotFoundError" in caught:
            for inner in _walk(node.body):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    yield inner


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


class ImportGraph:
    """Source modules under ``roots`` whose top-level package is one of ``local``."""

    def __init__(self, roots: Iterable[Path], local: Iterable[str]) -> None:
        self.roots = list(roots)
        self.local = set(local)

    @functools.cache  # noqa: B019 - one graph per test session, modules never change
    def module(self, name: str) -> Module | None:
        parts = name.split(".")
        for root in self.roots:
            base = root.joinpath(*parts)
            for path in (base / "__init__.py", base.with_suffix(".py")):
                if path.is_file():
                    return self._index(path)
        return None

    @staticmethod
    def _index(path: Path) -> Module:
        tree = ast.parse(path.read_text(), str(path))
        module = Module(path, tree)
        for statement in tree.body:
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                module.defs[statement.name] = statement
        for node in _body_level(tree.body):
            if isinstance(node, ast.Import | ast.ImportFrom):
                module.bindings.update(_import_bindings(node))
        return module

    def is_local(self, name: str) -> bool:
        return name.split(".")[0] in self.local

    def resolve(self, module: str, attr: str | None, seen: frozenset[str] = frozenset()) -> Unit:
        """The unit ``from module import attr`` names (its module body for a constant)."""
        if attr is None:
            return Unit(module)
        if self.module(f"{module}.{attr}") is not None:
            return Unit(f"{module}.{attr}")
        found = self.module(module)
        if found is None or module in seen:
            return Unit(module)
        if attr in found.defs:
            return Unit(module, attr)
        if attr in found.bindings:
            target, inner = found.bindings[attr]
            if self.is_local(target):
                return self.resolve(target, inner, seen | {module})
        return Unit(module)

    def third_party(self, entries: Iterable[str]) -> dict[str, str]:
        """Top-level names of the third-party modules the entries need -> the first unit
        that imports each. Entries are ``module`` or ``module:function``."""
        needed: dict[str, str] = {}
        seen: set[Unit] = set()
        # An entry point may name a definition its package re-exports (pkg:Class).
        todo = [self.resolve(*entry.split(":", 1)) if ":" in entry else Unit(entry)
                for entry in entries]  # fmt: skip
        while todo:
            unit = todo.pop()
            if unit in seen or not self.is_local(unit.module):
                continue
            seen.add(unit)
            module = self.module(unit.module)
            if module is None:
                continue
            for found, why in self._reached(unit, module):
                if isinstance(found, Unit):
                    todo.append(found)
                else:
                    needed.setdefault(found, why)
        return needed

    def _reached(self, unit: Unit, module: Module) -> Iterator[tuple[Unit | str, str]]:
        where = str(unit)
        if unit.name is None:
            parts = unit.module.split(".")
            for i in range(1, len(parts)):
                yield Unit(".".join(parts[:i])), where
            nodes = list(_body_level(module.tree.body))
            called_only = True
        else:
            yield Unit(unit.module), where
            definition = module.defs[unit.name]
            if isinstance(definition, ast.ClassDef):
                nodes = list(_body_level(definition.body))
                for statement in definition.body:
                    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                        nodes.extend(_walk([statement]))
            else:
                nodes = list(_walk([definition]))
            called_only = False
        scope = dict(module.bindings)
        optional = {id(n) for n in _guarded_imports(nodes)}
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in optional:
                scope.update(_import_bindings(node))
                for name in _imported(node):
                    if self.is_local(name):
                        yield self.resolve(name, None), where
                    elif name.split(".")[0] not in sys.stdlib_module_names | {"__future__"}:
                        yield name.split(".")[0], where
        for node in nodes:
            if called_only:
                if not isinstance(node, ast.Call):
                    continue
                node = node.func
            dotted = _dotted(node) if isinstance(node, ast.expr) else None
            if not dotted:
                continue
            target = self._lookup(unit.module, module, scope, dotted)
            if target is not None:
                yield target, where

    def _lookup(
        self, name: str, module: Module, scope: dict[str, Binding], dotted: list[str]
    ) -> Unit | None:
        head, *rest = dotted
        if head in scope:
            target, attr = scope[head]
            if not self.is_local(target):
                return None
            unit = self.resolve(target, attr)
        elif head in module.defs:
            unit = Unit(name, head)
        else:
            return None
        # Follow module.attr chains as far as they name modules or definitions.
        for attr in rest:
            if unit.name is not None:
                break
            unit = self.resolve(unit.module, attr)
        return unit
