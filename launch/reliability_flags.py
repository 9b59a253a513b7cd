"""``psrec train``'s reliability options and the supervisor's policy built
from them."""

from __future__ import annotations

import argparse

from psrec.launch.argtypes import non_negative
from psrec.launch.argtypes import non_negative_float
from psrec.launch.argtypes import positive_float


def add_reliability_flags(group) -> None:
    """Restart budgets, watchdog, connect timeout, grace period."""
    group.add_argument("--max-restarts", type=non_negative, default=3,
                       help="restarts of the coordinator alone (it failed or "
                       "stalled while every role was healthy); also the "
                       "default of --max-worker-restarts and "
                       "--max-ps-restarts (local cluster)")
    group.add_argument("--max-worker-restarts", type=non_negative,
                       default=None,
                       help="restarts of worker tasks (default: "
                       "--max-restarts)")
    group.add_argument("--max-ps-restarts", type=non_negative, default=None,
                       help="restarts of PS tasks, each with the coordinator "
                       "from the latest checkpoint (default: --max-restarts)")
    group.add_argument("--max-data-service-restarts", type=non_negative,
                       default=None,
                       help="restarts of the local tf.data service process "
                       "(--input-mode data-service), on its port; the "
                       "training workers reconnect (default: --max-restarts)")
    group.add_argument("--restart-budget-refill", type=non_negative_float,
                       default=600.0,
                       help="seconds a role runs without failing after which "
                       "its restart budget is full again; 0: never")
    group.add_argument("--no-restart-workers", action="store_true",
                       help="keep training on the remaining workers "
                       "instead of restarting a lost one")
    group.add_argument("--stall-timeout", type=non_negative_float,
                       default=900.0,
                       help="seconds without progress (in any phase: "
                       "connecting, training, eval, checkpoint) before the "
                       "watchdog acts: the supervisor reads the coordinator's "
                       "heartbeat file, prints its phase, step and per-worker "
                       "progress, kills it and restarts what failed; the "
                       "coordinator's own watchdog dumps stacks and exits "
                       "138. 0 disables")
    group.add_argument("--connect-timeout", type=positive_float,
                       default=300.0,
                       help="seconds to wait for every PS and worker port "
                       "before failing (retryable, 138) with the unreachable "
                       "tasks named")
    group.add_argument("--grace-period", type=non_negative_float,
                       default=30.0,
                       help="after SIGTERM/SIGINT: seconds to drain the "
                       "closures in flight and save a checkpoint at the step "
                       "reached (skipped when the last save took longer than "
                       "what is left), then exit 143 (SIGTERM) or 130 "
                       "(SIGINT) with one line")


def supervisor_config(args: argparse.Namespace):
    """The :class:`SupervisorConfig` of ``psrec train``'s arguments."""
    from psrec.launch.restart_policy import RestartLimits
    from psrec.launch.restart_policy import SupervisorConfig

    def given(value):
        return args.max_restarts if value is None else value
    return SupervisorConfig(
        limits=RestartLimits(
            worker=given(args.max_worker_restarts),
            ps=given(args.max_ps_restarts), coordinator=args.max_restarts,
            data_service=given(args.max_data_service_restarts),
            refill_after=args.restart_budget_refill),
        restart_workers=not args.no_restart_workers,
        stall_timeout=args.stall_timeout or None,
        grace_period=args.grace_period)
