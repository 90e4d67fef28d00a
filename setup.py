"""The one compiled part: the collector's native OTLP decoder (see pyproject.toml for the rest).

It is optional: where no C compiler is at hand the package installs without it, and
the collector decodes with its Python fast path instead (``spanmill collector``
logs which one it uses).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "spanmill._native",
            ["src/spanmill/_native.c"],
            extra_compile_args=["-O3", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
