"""The Driver interface every engine implements (pi2cli/engines/base.py): what the bench and `pi2
generate` call, and the one budget open_chat takes under two names by type."""

import inspect
from pathlib import Path
from types import SimpleNamespace

from pi2cli.engines import DRIVERS, get_driver
from pi2cli.engines.base import Driver
from pi2cli.engines.pi2.args import sparse_flags
from pi2cli.engines.pi2.driver import Pi2Driver
from pi2cli.hw.push import collect_items

# the six the bench calls and the two `pi2 generate` adds; everything else it reads is plain data
INTERFACE = {"set_option", "supports", "configure", "files", "open_chat", "engine_info",
             "prepare_generate", "generate_extra"}  # fmt: skip


def test_the_driver_interface_is_the_eight_methods_the_callers_use():
    methods = {n for n, v in vars(Driver).items() if callable(v) and not n.startswith("_")}
    assert methods == INTERFACE
    for attr in ("name", "policy", "model_suffix", "how", "options", "budget_outside"):
        assert not callable(getattr(Driver, attr))


def test_every_open_chat_takes_the_cgroup_and_the_bytes_by_their_own_names():
    for name in DRIVERS:
        params = inspect.signature(get_driver(name).open_chat).parameters
        assert {"cgroup", "budget_bytes"} <= set(params) and "budget" not in params, name


def test_a_plan_is_read_on_the_device_where_files_pushes_it(tmp_path):
    # files() names what goes to a device; open_chat reads the plan where the push put it
    plan = tmp_path / "p.json"
    plan.write_text("{}")
    engine = tmp_path / "pi2-engine"
    engine.write_text("")
    driver = Pi2Driver()
    driver.plan_local, driver.policy = plan, "cache"
    driver.local_binary = lambda target: engine
    phone = SimpleNamespace(on_this_machine=False)
    assert Pi2Driver().files(SimpleNamespace(on_this_machine=True)) == {}
    items = collect_items(phone, "/data/local/tmp/pi2", **driver.files(phone))
    remote = {i.kind: i.remote for i in items}
    flags = sparse_flags(**driver.engine_options(None, binary_dir=str(Path(remote["engine"]).parent)))
    assert flags == ["--policy", "cache", "--plan", remote["plan"]]
    assert remote["plan"] == "/data/local/tmp/pi2/plans/p.json"
    # here the plan is read in place
    assert sparse_flags(**driver.engine_options(None))[-1] == str(plan.resolve())
