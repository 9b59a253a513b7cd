"""The ``psrec`` command line: one module per group of sub-commands, a thin,
typed shell over library functions (``main`` imports a command's module only
when that command runs, so ``--help`` never imports TensorFlow); and
``job_process``, the entry point of the job processes psrec's own launchers
start from a ``job.json`` (the supervised coordinator, local
multi-worker-mirrored workers).
"""
