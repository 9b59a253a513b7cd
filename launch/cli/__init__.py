"""The ``psrec`` command line, a thin, typed shell over library functions:
``main`` holds the command registry; each group of commands has a module
that builds its parsers and imports no TensorFlow (``data``, ``model``,
``plan``, ``k8s``, ``embeddings``, ``runs``, ``train``) and ``*_run``
modules that run them, imported only when their command runs, so
``--help`` never imports TensorFlow; and ``job_process``, the entry point
of the job processes psrec's own launchers start from a ``job.json`` (the
supervised coordinator, local multi-worker-mirrored workers).
"""
