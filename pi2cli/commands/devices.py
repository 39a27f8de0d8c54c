"""`pi2 devices`: list targets with their hardware facts."""

import json

import click


@click.command(name="devices")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list (state and facts per target).")
@click.option("--no-facts", is_flag=True, help="Only names and states (does not talk to the devices).")
def command(as_json, no_facts):
    """List targets: this machine, qemu-arm64 and every adb device, with their facts.

    Facts: SoC/CPU, cores and max frequency per cluster, RAM, storage (UFS version where the phone
    tells), Android version, battery and temperature. adb devices that are 'unauthorized' or
    'offline' are listed with that state. Any name in the first column works as `--device`.

    \b
    Examples:
      pi2 devices
      pi2 devices --json | jq '.[].facts.clusters'
      ANDROID_ADB_SERVER_PORT=5038 pi2 devices     # another adb server
    """
    from pi2cli.hw.devices import HEADERS, gather, table_rows

    rows = gather(with_facts=not no_facts)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="pi2 targets")
    for h in HEADERS:
        table.add_column(h, overflow="fold", no_wrap=h in ("target", "state"))
    for values in table_rows(rows):
        table.add_row(*values)
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console = Console(width=200)
    console.print(table)
