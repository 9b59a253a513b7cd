"""Kubernetes: a training job rendered as manifests (``plain`` or ``tfjob``),
the pods they make, and a simulator that runs those pods as local
processes.
"""
