"""`pi2 plan`: not built yet."""

from pi2cli.errors import not_built

command = not_built("plan", "issue 6")
