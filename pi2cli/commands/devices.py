"""`pi2 devices`: not built yet."""

from pi2cli.errors import not_built

command = not_built("devices", "issue 7")
