"""Checkpoints: who writes them, streamed saves and restores verified by value,
lookup tables in checkpoints, the best checkpoint of a run and the dynamic
tables' state read from files.
"""
