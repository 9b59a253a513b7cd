"""psrec launchers: the ``psrec`` CLI, role servers, local clusters and the
job runner. Nothing in the library imports this package.

Importing this package does not import TensorFlow.
"""

from psrec.launch.local import LocalCluster

__all__ = ["LocalCluster"]
