"""The main job: its configuration and ``job.json`` codec, its data, the run
of every strategy (train, periodic eval, checkpoints, summary), the
coordinator's side of supervision, export and evaluation of a finished run,
and ``psrec bench``.
"""
