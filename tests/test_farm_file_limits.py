"""Issue 34: farm files a user or an attacker can get wrong are one line each, at `farm check` time:
deep TOML nesting (was a RecursionError), an adb_server port over 65535 (was an OverflowError later),
nan/inf numbers (nan passed every `< low` test) and n_gen/threads the engine refuses; special files."""

import os

import pytest
from click.testing import CliRunner

from pi2cli.cli import cli

HEAD = """name = "n"
[[device]]
name = "local"
[matrix]
models = ["m/model.pi2"]
"""

BAD = {
    "deep nesting": ("a = " + "[" * 5000 + "]" * 5000 + "\n" + HEAD, "nested too deeply"),
    "deep tables": ("a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n" + HEAD, "nested too deeply"),
    "adb port 99999": (
        HEAD.replace('name = "local"', 'name = "R5CT1"\nadb_server = "lab:99999"'),
        "1..65535",
    ),
    "adb port 0": (HEAD.replace('name = "local"', 'name = "R5CT1"\nadb_server = "lab:0"'), "1..65535"),
    "energy nan": (HEAD + "[limits]\nenergy_interval_s = nan\n", "energy_interval_s must be a finite number"),
    "energy inf": (HEAD + "[limits]\nenergy_interval_s = inf\n", "energy_interval_s must be a finite number"),
    "timeout nan": (HEAD + "[limits]\nreconnect_timeout_s = nan\n", "reconnect_timeout_s must be a finite"),
    "gate temp nan": (HEAD + "[gate]\nmax_cpu_temp_c = nan\n", "max_cpu_temp_c must be a finite"),
    "n_gen over the engine's": (
        HEAD + "[limits]\nn_gen = 2000000\n",
        "n_gen must be an integer in [1, 1048576]",
    ),
    "threads over the engine's": (
        HEAD + "[limits]\nthreads = 5000\n",
        "threads must be an integer in [1, 1024]",
    ),
    "seed over u64": (HEAD + "[limits]\nseed = 18446744073709551616\n", "seed must be an integer in [0, "),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_farm_files_are_one_line(tmp_path, case):
    text, words = BAD[case]
    path = tmp_path / "farm.toml"
    path.write_text(text)
    for args in (["farm", "check", str(path)], ["farm", "schedule", str(path)]):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 1, (case, r.output, r.exception)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pi2: error: ") and words in lines[0], (case, r.stderr)


def test_the_limits_the_engine_takes_are_accepted(tmp_path):
    from pi2cli.farm.file import load_farm

    path = tmp_path / "farm.toml"
    path.write_text(HEAD + "[limits]\nn_gen = 1048576\nthreads = 1024\nenergy_interval_s = 0.05\n")
    farm = load_farm(path)
    assert (farm.n_gen, farm.threads, farm.energy_interval_s) == (1 << 20, 1024, 0.05)


@pytest.mark.parametrize("kind", ["fifo", "dir", "zero"])
def test_a_farm_file_that_is_not_a_regular_file_is_one_line_not_a_hang(tmp_path, kind):
    path = tmp_path / "farm.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    from pi2cli.errors import Pi2Error
    from pi2cli.farm.file import load_farm

    with pytest.raises(Pi2Error, match="cannot read"):
        load_farm(path)


def test_a_bad_adb_server_port_in_the_environment_is_one_line(monkeypatch):
    from pi2cli.errors import Pi2Error
    from pi2cli.targets.adb import adb_server_port

    for bad in ("99999", "0", "x", "-1", "５０３７"):
        monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", bad)
        with pytest.raises(Pi2Error, match="ANDROID_ADB_SERVER_PORT"):
            adb_server_port()
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", "5038")
    assert adb_server_port() == 5038
