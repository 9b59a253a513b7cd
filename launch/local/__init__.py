"""Processes on this machine: the local cluster's PS and worker roles, the
local workers of the multi-worker mirrored strategy, the private network
namespace, and the local tf.data service.
"""
