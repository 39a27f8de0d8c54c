"""llama.cpp: driver.py, server.py (llama-server here, and how it measures), device.py (on an adb device)."""
