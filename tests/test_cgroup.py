"""Memory budgets: page-cache eviction, and a cgroup that really caps an mmapped file's residency."""

import os
import sys
import textwrap

import pytest

from pi2cli.errors import Pi2Error
from pi2cli.hw import cgroup

MiB = 2**20

# mmaps the file, touches every page twice, prints the bytes this process read from storage
READER = textwrap.dedent(
    """
    import mmap, sys
    with open(sys.argv[1], "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        total = 0
        for _ in range(2):
            for off in range(0, len(m), 4096):
                total += m[off]
    for line in open("/proc/self/io"):
        if line.startswith("read_bytes:"):
            print(int(line.split()[1]))
    """
)


def _write_file(path, size):
    block = os.urandom(MiB)
    with open(path, "wb") as f:
        for _ in range(size // MiB):
            f.write(block)
    return path


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    # On the disk, not in tmpfs: a tmpfs file cannot be evicted and reads never reach storage.
    base = tmp_path_factory.mktemp("budget")
    return _write_file(base / "weights.bin", 300 * MiB)


def test_eviction_empties_the_page_cache(big_file):
    with open(big_file, "rb") as f:
        while f.read(8 * MiB):
            pass
    assert cgroup.resident_bytes(big_file) > 200 * MiB
    record = cgroup.evict_from_page_cache(big_file)
    assert record["resident_before"] > 200 * MiB
    assert record["resident_after"] < 4 * MiB


def test_no_budget_is_recorded_as_not_enforced(tmp_path):
    run = cgroup.run_budgeted([sys.executable, "-c", "print(42)"], None)
    assert run.returncode == 0 and run.stdout.strip() == "42"
    assert run.budget["enforced"] is False
    assert "not enforced" in run.budget["how"]


def test_missing_cgroup_support_is_said_not_pretended(tmp_path, monkeypatch):
    support = cgroup.detect_cgroup(root=tmp_path)
    assert not support.usable and "no memory cgroup" in support.reason
    monkeypatch.setattr(cgroup, "detect_cgroup", lambda: support)
    run = cgroup.run_budgeted([sys.executable, "-c", "pass"], 100 * MiB)
    assert run.budget["enforced"] is False and "no memory cgroup" in run.budget["how"]
    with pytest.raises(Pi2Error, match="cannot enforce"):
        cgroup.run_budgeted([sys.executable, "-c", "pass"], 100 * MiB, required=True)


def test_v2_parent_that_keeps_memory_to_itself_is_not_usable(tmp_path, monkeypatch):
    # a container's cgroup v2 with the memory controller but not enabled for children: a child made
    # there has no memory.max (writing it is refused), so no budget can be set there
    own = tmp_path / "box"
    own.mkdir()
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text("cpu pids\n")
    monkeypatch.setenv("PI2_CGROUP_PARENT", "/box")
    support = cgroup.detect_cgroup(root=tmp_path)
    assert not support.usable and "subtree_control" in support.reason
    (own / "cgroup.subtree_control").write_text("cpu memory pids\n")
    assert cgroup.detect_cgroup(root=tmp_path).parent == own


def test_tiny_budget_is_refused():
    with pytest.raises(Pi2Error, match="too small"):
        cgroup.MemoryCgroup(1024, cgroup.CgroupSupport(1, None))


@pytest.mark.slow
def test_cgroup_caps_an_mmapped_file_and_reads_go_to_storage(big_file, tmp_path):
    support = cgroup.detect_cgroup()
    if not support.usable:
        pytest.skip(f"memory cgroups not writable here: {support.reason}")
    reader = tmp_path / "reader.py"
    reader.write_text(READER)
    cmd = [sys.executable, str(reader), str(big_file)]

    free = cgroup.run_budgeted(cmd, None, evict=[big_file])
    assert free.returncode == 0, free.stderr
    free_read = int(free.stdout)

    capped = cgroup.run_budgeted(cmd, 100 * MiB, evict=[big_file])
    assert capped.returncode == 0, capped.stderr
    capped_read = int(capped.stdout)
    record = capped.budget

    assert record["enforced"] is True and record["limit_bytes"] == 100 * MiB
    assert record["evicted"][0]["resident_after"] < 4 * MiB
    # the cgroup's peak (page cache counted) never passed the limit although 300 MB were touched
    assert 0 < record["peak_bytes"] <= 100 * MiB
    # without a limit one pass from storage suffices; under it the second pass must read again
    assert free_read >= 290 * MiB and free_read < 400 * MiB
    assert capped_read >= 500 * MiB
    assert record["major_faults"] is None or record["major_faults"] > 0
    assert not os.path.exists(record["cgroup"])  # removed afterwards


def test_cgroup_is_removed_when_the_run_is_interrupted(tmp_path):
    import subprocess

    support = cgroup.detect_cgroup()
    if not support.usable:
        pytest.skip(f"memory cgroups not writable here: {support.reason}")
    mine = f"pi2-budget-{os.getpid()}-"
    with pytest.raises(subprocess.TimeoutExpired):
        cgroup.run_budgeted([sys.executable, "-c", "import time; time.sleep(30)"], 64 * MiB, timeout=0.5)
    assert not [p for p in os.listdir(support.parent) if p.startswith(mine)]
