"""pi2-probe, the hardware profiler: its JSON output is complete and consistent, and bad input gives one
error line and a non-zero exit. Runs are tiny (a few MiB, fractions of a second): correctness only."""

import json
import subprocess
from pathlib import Path

import pytest
from engine_helpers import built


def probe_bin() -> Path:
    return built("pi2-probe")


def run_probe(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([str(probe_bin()), *map(str, args)], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("probe") / "store.bin"
    path.write_bytes(bytes(range(256)) * (4 * 4096))  # 4 MiB
    return path


def test_membw_json():
    done = run_probe("membw", "--threads", 2, "--mib", 4, "--passes", 3, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["probe"] == "membw" and out["threads"] == 2 and out["mib_per_thread"] == 4
    assert len(out["passes_gb_per_s"]) == 3 and all(x > 0 for x in out["passes_gb_per_s"])
    assert sorted(out["passes_gb_per_s"])[1] == out["gb_per_s"]  # the median


def test_membw_text():
    done = run_probe("membw", "--mib", 2, "--passes", 1)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("memory read bandwidth: ") and "GB/s (1 thread x 2 MiB" in done.stdout


def test_gemv_json():
    """The decode GEMV through the engine's pool and kernels: 18 MiB is two 4096 x 4096 Q4_0 matrices."""
    done = run_probe("gemv", "--threads", 2, "--mib", 18, "--reps", 3, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["probe"] == "gemv" and out["threads"] == 2 and out["matrices"] == 2
    assert out["bytes"] == 2 * 4096 * 4096 // 32 * 18 and isinstance(out["x4"], bool) and out["level"]
    assert len(out["passes_gb_per_s"]) == 3 and all(x > 0 for x in out["passes_gb_per_s"])
    assert sorted(out["passes_gb_per_s"])[1] == out["gb_per_s"]


def test_gemv_prefetch():
    done = run_probe("gemv", "--mib", 9, "--reps", 1, "--prefetch", 0, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["x4_prefetch"] == 0
    assert json.loads(run_probe("gemv", "--mib", 9, "--reps", 1, "--json").stdout)["x4_prefetch"] == 512


def test_gemv_streams(monkeypatch):
    """The engine's stream count unless given (PI2_X4_STREAMS, else 1); the probe's flag wins over it."""
    done = run_probe("gemv", "--mib", 9, "--reps", 1, "--streams", 4, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["x4_streams"] == 4
    assert json.loads(run_probe("gemv", "--mib", 9, "--reps", 1, "--json").stdout)["x4_streams"] == 1
    text = run_probe("gemv", "--mib", 9, "--reps", 1, "--streams", 4).stdout
    assert ("prefetch 512 B ahead, 4 streams" in text) == json.loads(done.stdout)[
        "x4"
    ]  # said where it applies
    monkeypatch.setenv("PI2_X4_STREAMS", "2")
    assert json.loads(run_probe("gemv", "--mib", 9, "--reps", 1, "--json").stdout)["x4_streams"] == 2
    assert (
        json.loads(run_probe("gemv", "--mib", 9, "--reps", 1, "--streams", 8, "--json").stdout)["x4_streams"]
        == 8
    )


def test_membw_streams():
    done = run_probe("membw", "--mib", 4, "--passes", 1, "--streams", 3, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["streams"] == 3 and out["gb_per_s"] > 0
    assert ", 3 streams each" in run_probe("membw", "--mib", 4, "--passes", 1, "--streams", 3).stdout


def test_gemv_rows_layout():
    done = run_probe("gemv", "--mib", 9, "--reps", 1, "--layout", "rows", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["x4"] is False


def test_gemv_text():
    done = run_probe("gemv", "--mib", 9, "--reps", 1)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.startswith("decode GEMV (")
        and "GB/s (1 thread, 1 matrices of 4096 x 4096 Q4_0" in done.stdout
    )


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("auto", {"io_uring", "pread", "buffered"}),
        ("uring", {"io_uring"}),
        ("pread", {"pread", "buffered"}),
        ("buffered", {"buffered"}),
    ],
)
def test_storage_json(store, method, expected):
    done = run_probe(
        "storage", "--file", store, "--block", 4096, "--qd", 8, "--seconds", 0.2, "--method", method, "--json"
    )
    if method == "uring" and "io_uring unavailable" in done.stderr:
        pytest.skip(done.stderr.strip())  # the kernel refuses io_uring here: nothing to measure
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["method"] in expected
    assert out["page_cache_bypassed"] is out["o_direct"]
    if out["method"] == "buffered":
        assert out["o_direct"] is False
    assert out["file"] == str(store) and out["file_bytes"] == 4 << 20
    assert out["block"] == 4096 and out["qd"] == 8
    assert out["reads"] > 0 and out["bytes"] == out["reads"] * 4096
    assert out["iops"] > 0 and out["mb_per_s"] > 0 and 0 < out["lat_p50_us"] <= out["lat_p99_us"]
    assert out["seconds"] >= 0.2
    assert out["wave"] == 0 and out["range"] == 0


def test_storage_waves_json_says_the_span_read_within(store):
    # callers time a wave by its share of the span (the planner's wave_read_time): the probe says which
    done = run_probe("storage", "--file", store, "--block", 4096, "--qd", 8, "--seconds", 0.1, "--method", "pread",
                     "--wave", 16, "--range", "1M", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["wave"] == 16 and out["range"] == 1 << 20 and out["reads"] % 16 == 0
    done = run_probe("storage", "--file", store, "--block", 4096, "--qd", 8, "--seconds", 0.1, "--method", "pread",
                     "--wave", 16, "--range", "1G", "--json")  # fmt: skip
    assert done.returncode == 0 and json.loads(done.stdout)["range"] == 4 << 20  # no more than the file


def test_storage_text_says_whether_the_page_cache_is_bypassed(store):
    done = run_probe("storage", "--file", store, "--seconds", 0.1, "--method", "buffered")
    assert done.returncode == 0, done.stderr
    assert "buffered: through the page cache" in done.stdout and "IOPS" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["storage"], "storage: --file is required"),
        (["storage", "--file", "/nonexistent/x"], "/nonexistent/x: No such file or directory"),
        (["storage", "--file", "STORE", "--method", "mmap"], "--method needs auto, uring, pread or buffered"),
        (["storage", "--file", "STORE", "--block", 8 << 20], "smaller than one block"),
        (["storage", "--file", "STORE", "--qd", 0], "--qd needs an integer"),
        (["storage", "--file", "STORE", "--seconds", -1], "--seconds needs a value"),
        (["storage", "--file", "STORE", "--bogus", 1], "unknown option '--bogus'"),
        (["membw", "--threads"], "--threads needs an integer"),
        (["membw", "--mib", "lots"], "--mib needs an integer"),
        (["gemv", "--mib", 8], "--mib needs an integer"),
        (["gemv", "--reps", 0], "--reps needs an integer"),
        (["gemv", "--bogus"], "unknown option '--bogus'"),
        (["gemv", "--layout", "x8"], "--layout needs x4 or rows"),
        (["gemv", "--prefetch", -64], "--prefetch needs an integer"),
        (["gemv", "--streams", 3], "--streams takes 1, 2, 4 or 8, got 3"),
        (["gemv", "--streams", 16], "--streams needs an integer"),
        (["membw", "--streams", 9], "--streams needs an integer"),
    ],
)
def test_bad_input_is_one_error_line(store, args, message):
    done = run_probe(*[store if a == "STORE" else a for a in args])
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("pi2-probe: ") and message in done.stderr


def test_unaligned_block_with_o_direct(store):
    done = run_probe("storage", "--file", store, "--block", 1000, "--method", "pread", "--seconds", 0.1)
    if "buffered" in done.stdout:  # this file system refused O_DIRECT, so any block size works
        return
    assert done.returncode == 1 and "not a multiple of the O_DIRECT alignment" in done.stderr


def test_help_and_unknown_command():
    assert run_probe("--help").returncode == 0
    assert "storage --file F" in run_probe("storage", "--help").stdout
    assert "gemv [--threads N]" in run_probe("gemv", "--help").stdout
    done = run_probe("bogus")
    assert done.returncode == 2 and "unknown command 'bogus'" in done.stderr
