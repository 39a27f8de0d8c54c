"""One module per `pi2` command group; each exports `command`."""
