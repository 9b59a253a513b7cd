"""The supervisor behind ``psrec train`` on a local cluster: it watches every
role process and the coordinator's heartbeat, names the failed role and
restarts it within per-role budgets.
"""
