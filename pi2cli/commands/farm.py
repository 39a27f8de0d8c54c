"""`pi2 farm`: not built yet."""

from pi2cli.errors import not_built

command = not_built("farm", "a later issue")
