"""DSpark speculative decoding: drafter (drafter.py), checkpoint format (checkpoint.py),
planner (planner.py, sps.py, sts.py), accept rule (accept.py), device kernels (kernels.py) and
statistics (stats.py). Submodules are imported on use: the planner's host half is torch-free.
"""
