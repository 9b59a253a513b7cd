"""Parquet -> sharded TFRecord conversion (``psrec convert``): its inputs and
their checks, the eval split, negative sampling, the catalogue and the shard
writers.
"""
