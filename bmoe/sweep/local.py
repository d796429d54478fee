"""The local executor: one thread per target on this host, each taking the next unit it may
run (by tags) from a shared queue and running it with :func:`bmoe.sweep.units.run_unit`."""

from __future__ import annotations

import queue
import threading

from bmoe.sweep.plan import Unit
from bmoe.sweep.targets import Target
from bmoe.sweep.units import run_unit


class LocalExecutor:
    """One thread per target, taking the next unit it may run (by tags) in plan order."""

    def check(self, targets, ctx):
        for target in targets:
            target.check()

    def execute(self, units, targets, ctx):
        stop = ctx.stop
        pending = list(units)
        lock = threading.Lock()
        results: queue.Queue = queue.Queue()
        done_marker = object()

        def take(target: Target) -> Unit | None:
            with lock:
                for i, unit in enumerate(pending):
                    if target.spec.can_run(unit.tags):
                        return pending.pop(i)
            return None

        def worker(target: Target) -> None:
            try:
                while not stop.is_set():
                    unit = take(target)
                    if unit is None:
                        break
                    run_unit(unit, target, ctx, results.put)
            except BaseException as exc:  # surfaced in the driver thread
                results.put(exc)
            finally:
                results.put(done_marker)

        threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in targets]
        for thread in threads:
            thread.start()
        alive = len(threads)
        interrupted = False
        failure: BaseException | None = None
        while alive:
            try:
                item = results.get(timeout=0.25)
            except queue.Empty:
                continue
            except KeyboardInterrupt:
                # Keep draining: the running attempts end as interrupted and are archived.
                interrupted = True
                stop.set()
                continue
            if item is done_marker:
                alive -= 1
            elif isinstance(item, BaseException):
                # Stop the other targets and wait for their attempts to be archived (no
                # engine left running, no thread dying mid-write); then raise the first.
                stop.set()
                failure = failure or item
            else:
                yield item
        if failure is not None:
            raise failure
        if interrupted:
            raise KeyboardInterrupt
