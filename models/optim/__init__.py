"""Optimizers (one for the tables, one for the dense part), gradient
accumulation over micro-batches, and the bytes of a table with its slots.
"""
