"""`pi2 convert`: not built yet."""

from pi2cli.errors import not_built

command = not_built("convert", "issue 3")
