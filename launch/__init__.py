"""psrec launchers: the ``psrec`` CLI, role servers, local clusters.

Importing this package does not import TensorFlow.
"""

from psrec.launch.runtime import configure_environment
from psrec.launch.runtime import role_environment

__all__ = ["configure_environment", "role_environment"]
