"""The hardware pi2 runs on: devices, pushing files to them, measuring a process's memory, and holding
one to a memory budget (a cgroup)."""
