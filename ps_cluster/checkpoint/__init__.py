"""Checkpoints: who writes them, streamed saves and restores verified by value,
lookup tables in checkpoints, delta checkpoints (the rows changed since the
last save, flagged on each PS) and their chains, the best checkpoint of a
run and the dynamic tables' state read from files.
"""

# The choices of ``JobConfig.checkpoint_writers`` (read without TensorFlow);
# the writers themselves are ``ps_cluster.checkpoint.writers``.
WRITERS = ("auto", "tasks", "coordinator")
