"""The one compiled part: the collector's native OTLP decoder (see pyproject.toml for the rest).

It is optional: where no C compiler is at hand the package installs without it, and
the collector decodes every record with the span decoder and appends rows in Python
instead, the same rows more slowly (``spanmill collector`` logs which it uses).
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
