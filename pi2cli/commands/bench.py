"""`pi2 bench`: not built yet."""

from pi2cli.errors import not_built

command = not_built("bench", "issue 7")
