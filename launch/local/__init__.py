"""Processes on this machine: the local cluster's PS and worker roles,
:func:`~psrec.launch.local.cluster.spawn` (the one way psrec starts a child
process), and the private network namespace.
"""
