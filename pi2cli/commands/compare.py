"""`pi2 compare`: not built yet."""

from pi2cli.errors import not_built

command = not_built("compare", "issue 9")
