"""`pi2 build`: not built yet."""

from pi2cli.errors import not_built

command = not_built("build", "issue 7")
