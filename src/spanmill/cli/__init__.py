"""The ``spanmill`` command line: one module per command group, assembled in ``main``."""
