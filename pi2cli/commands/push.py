"""`pi2 push`: not built yet."""

from pi2cli.errors import not_built

command = not_built("push", "issue 7")
