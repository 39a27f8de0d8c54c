"""`pi2 generate`: not built yet."""

from pi2cli.errors import not_built

command = not_built("generate", "issue 3")
