"""A worker lost while TensorFlow copies a finished closure's results to the
coordinator does not end the job.

TensorFlow marks a closure's value ready once it has run, then its worker
thread copies the results to the coordinator; a fetch in that window copies
them itself. A worker SIGKILLed then makes both copies fail: TensorFlow's
worker thread puts the closure back (it runs again elsewhere), but the
fetch raised UNAVAILABLE in the training loop, and the coordinator exited
138 -- seen in ``test_data_service.py``'s worker kill, where the supervisor
then restarted the job from step 0. The race needs a process dying between
two RPCs, so here the coordinator and its values are stand-ins that replay
it: the first fetch fails as TensorFlow's did (its message, verbatim in
form), the closure's re-run completes during ``join``.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from psrec.ps_cluster.training.config import LoopConfig
from psrec.ps_cluster.training.loop import ClosureExecutor

# As the training loop saw it (UNAVAILABLE, 2 root errors).
WORKER_LOST = (
    "2 root error(s) found.\n  (0) UNAVAILABLE: {{function_node "
    "__wrapped__Identity_device_/job:chief/replica:0/task:0/device:CPU:0}} "
    "failed to connect to all addresses\nAdditional GRPC error information "
    "from remote target /job:worker/replica:0/task:1/device:CPU:0 while "
    "calling /tensorflow.eager.EagerService/RunComponentFunction:\n"
    "  (1) CANCELLED: RecvFromRemoteAsync is cancelled.")
PS_LOST = WORKER_LOST.replace("/job:worker/replica:0/task:1",
                              "/job:ps/replica:0/task:0")


class _Value:
    """A closure's value whose first fetch fails with ``error`` until the
    closure ran again (``rerun``)."""

    def __init__(self, error: str | None) -> None:
        self.error, self.fetches = error, 0

    def fetch(self):
        self.fetches += 1
        if self.error:
            raise tf.errors.UnavailableError(None, None, self.error)
        return (0.5, 64, 0.01, 1, 0)  # loss_sum, examples, s, pipeline, 0


class _Coordinator:
    def __init__(self, values: list[_Value]) -> None:
        self.values, self.joins = values, 0

    def create_per_worker_dataset(self, dataset_fn):
        return []

    def schedule(self, function, args):
        return self.values.pop(0)

    def join(self) -> None:  # the put-back closure ran on another worker
        self.joins += 1
        for value in self.lost:
            if value.error:  # the first join after the loss
                value.error, value.joined_at = None, value.fetches


def _run(errors: list[str | None]) -> tuple[list, _Coordinator, list]:
    values = [_Value(e) for e in errors]
    coordinator = _Coordinator(list(values))
    coordinator.lost = [v for v in values if v.error == WORKER_LOST]
    executor = ClosureExecutor(coordinator, lambda steps: None, None, 1,
                               LoopConfig(steps=len(values),
                                          steps_per_closure=1,
                                          in_flight_per_worker=1))
    results = []
    executor.run(0, len(values), lambda step, loss, n: results.append(step))
    return results, coordinator, values


def test_a_fetch_cut_by_a_lost_worker_takes_the_rerun_results():
    results, coordinator, values = _run([None, WORKER_LOST, None, None])
    assert results == [1, 2, 3, 4]  # every step reported, in order
    # Fetched again after a join (which waited for the closure's re-run).
    assert values[1].fetches == 2 and values[1].joined_at == 1


def test_a_lost_ps_still_ends_the_run():
    with pytest.raises(tf.errors.UnavailableError, match="/job:ps/"):
        _run([None, PS_LOST])
