"""`pi2 models`: not built yet."""

from pi2cli.errors import not_built

command = not_built("models", "issue 4")
