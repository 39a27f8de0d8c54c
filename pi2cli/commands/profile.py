"""`pi2 profile`: not built yet."""

from pi2cli.errors import not_built

command = not_built("profile", "issue 6")
