"""psrec launchers, above the library: ``cli`` (the ``psrec`` command line),
``k8s`` (manifests and their simulation), ``supervise`` (the supervisor and
the local tf.data service), ``job`` (the job runner, its config, export and
bench), ``local`` (local role processes, network namespace) and ``monitor``
(heartbeat, progress, ``/metrics``). Nothing in the library imports this
package; the layer order is in ``docs/architecture.md``.

Importing this package does not import TensorFlow.
"""

from psrec.launch.local.cluster import LocalCluster

__all__ = ["LocalCluster"]
