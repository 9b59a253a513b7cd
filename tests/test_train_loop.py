"""ClosureExecutor's scheduling against a stand-in coordinator: one
closure that does not finish (its worker is cut off) does not stop the
scheduling of others; results are still reported in step order."""

import threading

from psrec.ps_cluster.training.config import LoopConfig
from psrec.ps_cluster.training.loop import ClosureExecutor


class _Value:
    def __init__(self, step: int, coordinator=None) -> None:
        self.step, self.coordinator = step, coordinator

    def fetch(self):
        if self.coordinator is not None:  # the stuck closure
            self.coordinator.released = self.coordinator.release.wait(10)
        return (float(self.step), 1, 0.0, 0, 0)


class _Coordinator:
    """Closure 1 finishes only once ``scheduled_before_release`` more
    closures have been scheduled (or after 10 s: the old in-order fetch)."""

    def __init__(self, scheduled_before_release: int) -> None:
        self.release = threading.Event()
        self.count = 0
        self.needed = scheduled_before_release
        self.released_by_scheduling = False
        self.released = None  # closure 1 ended by the release, not timeout

    def create_per_worker_dataset(self, dataset_fn):
        return [None]

    def schedule(self, function, args):
        self.count += 1
        if self.count == 1 + self.needed:
            self.released_by_scheduling = True
            self.release.set()
        return _Value(self.count, self if self.count == 1 else None)

    def join(self):
        self.release.set()


def test_a_stuck_closure_does_not_stop_scheduling_and_order_is_kept():
    coordinator = _Coordinator(scheduled_before_release=6)
    executor = ClosureExecutor(
        coordinator, build=lambda steps: None, dataset_fn=None,
        num_workers=2, config=LoopConfig(steps=10, steps_per_closure=1,
                                         in_flight_per_worker=1))
    reported = []
    reached = executor.run(0, 10, lambda step, loss, n: reported.append(
        (step, loss)))
    assert reached == 10
    # 2 in flight allowed: closure 1 stuck, 2..7 finished and scheduled on
    assert coordinator.released_by_scheduling and coordinator.released
    assert reported == [(s, float(s)) for s in range(1, 11)]
