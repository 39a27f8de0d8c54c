"""`pi2 workloads`: not built yet."""

from pi2cli.errors import not_built

command = not_built("workloads", "issue 8")
