"""Example task plugins for spanmill, outside its core.

Each task here is registered in the ``spanmill.tasks`` entry-point group of the
distribution that installs this package (see pyproject.toml), and spanmill finds it
by name through :func:`spanmill.tasks.get_task`, as it finds any other team's task.
Nothing in ``spanmill`` imports this package.
"""
