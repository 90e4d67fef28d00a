"""Run every benchmark module in this folder (``python -m bench [NAME ...]``)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path


def _explicit_only(name: str) -> bool:
    source = (Path(__file__).parent / f"{name}.py").read_text()
    return "\nEXPLICIT_ONLY = True" in source


def main(argv: list[str]) -> int:
    folder = Path(__file__).parent
    names = sorted(
        m.name for m in pkgutil.iter_modules([str(folder)]) if not m.name.startswith("_")
    )
    # Modules marked EXPLICIT_ONLY (long learning runs) run only when named.
    chosen = argv or [n for n in names if not _explicit_only(n)]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(names)}")
        return 2
    for name in chosen:
        module = importlib.import_module(f"bench.{name}")
        if not hasattr(module, "main"):
            continue
        print(f"\n=== {name} ===", flush=True)
        started = time.perf_counter()
        module.main([]) if getattr(module, "EXPLICIT_ONLY", False) else module.main()
        print(f"=== {name}: {time.perf_counter() - started:.1f}s ===", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
