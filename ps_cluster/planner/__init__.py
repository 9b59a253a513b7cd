"""Planning before any server starts: the bytes every PS task will hold, and
``psrec advise``, which measures which strategy suits a model here.
"""
