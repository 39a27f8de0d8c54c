"""`pi2 results`: not built yet."""

from pi2cli.errors import not_built

command = not_built("results", "issue 9")
