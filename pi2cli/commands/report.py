"""`pi2 report`: not built yet."""

from pi2cli.errors import not_built

command = not_built("report", "issue 9")
