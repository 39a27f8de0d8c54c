"""The hardware pi2 runs on: devices, pushing files to them, and measuring a process's memory."""
