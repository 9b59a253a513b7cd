"""Who writes checkpoint files (plain Python: the choices of
``JobConfig.checkpoint_writers``, read without TensorFlow); the writers
themselves are ``ps_cluster.checkpoint.writers``."""

WRITERS = ("auto", "tasks", "coordinator")
