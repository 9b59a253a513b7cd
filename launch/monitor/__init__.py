"""What a running job shows: the heartbeat file and the local run-state folder,
the progress line and TensorBoard scalars, Prometheus ``/metrics`` and
``/healthz``, and the Grafana dashboard.
"""
