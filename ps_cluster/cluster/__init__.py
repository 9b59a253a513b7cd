"""The cluster: ``TF_CONFIG`` and task addresses (plain Python), gRPC servers,
the in-process test cluster, strategies of every kind, the table
partitioner, and probes of a cluster's tasks from outside TensorFlow.
"""
