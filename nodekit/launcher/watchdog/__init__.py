"""The peer watchdog: pure decisions (decide.py), the loop beside torchrun (run.py), and who failed (failure.py)."""
