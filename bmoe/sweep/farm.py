"""A device farm across several hosts, on Ray: ``[sweep] executor = "ray"``.

Every host of the farm joins one Ray cluster (``ray start``) advertising one unit of a custom
resource per target it can reach (``bmoe_target_<name>``, or the target's ``resource``). The
host running ``bmoe sweep`` is the driver: it keeps the sweep folder, the manifest and resume
exactly as on one host. It schedules as :class:`~bmoe.sweep.local.LocalExecutor` does (each
target takes the next unit it may run), but a unit becomes a Ray task that requires its
target's resource: Ray places it on the host that reaches the device, and the resource keeps
a device to one unit at a time even across sweeps. On that host the task runs the same code
as the local runner (:func:`bmoe.sweep.shipping.run_unit_away`) and streams each attempt's
files and record back as a Ray generator; the driver archives them
(:class:`bmoe.sweep.shipping.Receiver`).

A task or host that dies is a failed attempt (``lost``), retried like a crash on the next
target free to run it; a target whose host left the cluster takes no more work, and what only
it could run waits for ``--resume``. A target no host advertises is refused before the sweep
starts. This module imports Ray (``pip install 'bmoe[farm]'``); nothing else in bmoe does.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import NodeDiedError, RayError, RayTaskError, WorkerCrashedError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from bmoe.errors import BmoeError
from bmoe.sweep.archive import resume_command
from bmoe.sweep.attempt import CellContext, UnitRunner
from bmoe.sweep.plan import Unit
from bmoe.sweep.sessions import SESSIONS
from bmoe.sweep.shipping import Delivery, Receiver, host_state_dir, run_unit_away
from bmoe.sweep.targets import Target, open_target
from bmoe.sweep.units import run_unit as run_unit_here

#: How long the hosts may take to check their targets before the sweep starts.
CHECK_TIMEOUT_S = 300.0
#: How often the driver looks at which hosts are in the cluster.
VIEW_EVERY_S = 2.0
#: After a stop, how long the hosts get to end their runs (beyond the engine's grace).
STOP_WAIT_S = 60.0
#: Ray's own error reports during a sweep, in the sweep folder's ``.state``.
RAY_LOG = "ray.log"


# ----------------------------------------------------------------------------- on the hosts


def _run_unit_task(
    unit, target_spec, config, sweep_name, floors, sessions_taken, flag, run_unit, keep_going=True
):
    """One unit on the host that advertises its target's resource (a streaming generator)."""
    node = ray.get_runtime_context().get_node_id()
    asking: list[Any] = []  # the question in flight; never wait for the answer

    def stopped() -> bool:
        if not asking:
            asking.append(flag.is_set.remote())
            return False
        ready, _ = ray.wait(asking, timeout=0)
        return bool(ray.get(asking.pop())) if ready else False

    yield from run_unit_away(
        unit,
        target_spec,
        config,
        sweep_name,
        floors,
        stopped,
        sessions_taken=sessions_taken,
        node=node,
        run_unit=run_unit,
        keep_going=keep_going,
    )


def _check_target_task(target_spec, sweep_name) -> dict[str, Any]:
    """Check a target from its host (is the device there, does ``sh`` run) before the sweep."""
    error = None
    try:
        target = open_target(target_spec, host_state_dir(sweep_name))
        try:
            target.check()
        finally:
            target.close()
    except BmoeError as exc:
        error = str(exc)
    except Exception as exc:
        error = f"target {target_spec.name}: {type(exc).__name__}: {exc}"
    return {"host": socket.gethostname(), "error": error}


class _StopFlag:
    """Set by the driver when the sweep stops; the units running on the hosts ask it."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


_run_unit_remote = ray.remote(_run_unit_task)
_check_target_remote = ray.remote(_check_target_task)
_stop_flag_remote = ray.remote(_StopFlag)


# ----------------------------------------------------------------------------- the driver


@dataclass(frozen=True)
class _Node:
    id: str
    hostname: str
    resources: dict[str, float]


def _alive_nodes() -> list[_Node]:
    out = []
    for node in ray.nodes():
        if node.get("Alive"):
            name = node.get("NodeManagerHostname") or node.get("NodeManagerAddress") or "?"
            out.append(_Node(node["NodeID"], name, dict(node.get("Resources") or {})))
    return out


def _labels(nodes: Sequence[_Node]) -> dict[str, str]:
    """A host name per node; nodes sharing a host name get their node id's start appended."""
    count: dict[str, int] = {}
    for node in nodes:
        count[node.hostname] = count.get(node.hostname, 0) + 1
    return {
        n.id: n.hostname if count[n.hostname] == 1 else f"{n.hostname}/{n.id[:6]}" for n in nodes
    }


@dataclass
class _Lane:
    """A target of the farm: its resource, the node advertising it, whether it is there."""

    target: Target
    resource: str
    node: str
    host: str
    gone: bool = False


@dataclass
class _Job:
    lane: _Lane
    delivery: Delivery
    gen: Any  # ray.ObjectRefGenerator


def _reason(exc: BaseException) -> tuple[str, str]:
    """(status, text) of a task that did not finish: ``error`` when bmoe's code raised on
    the host, ``lost`` when the task, its worker or its host died."""
    if isinstance(exc, RayTaskError):
        cause = exc.cause if isinstance(exc.cause, BaseException) else None
        text = f"{type(cause).__name__}: {cause}" if cause else str(exc).strip().splitlines()[-1]
        return "error", f"the task failed on its host: {text}"
    if isinstance(exc, NodeDiedError):
        return "lost", "its host died (Ray: NodeDiedError)"
    if isinstance(exc, WorkerCrashedError):
        return "lost", "the Ray worker running it died (Ray: WorkerCrashedError)"
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return "lost", f"Ray: {type(exc).__name__}: {first}".rstrip(": ")


def _errors_to_file(path: Path) -> Callable[[], None]:
    """Ray's driver prints the cluster's error reports (a raylet that died, with its log
    tail) on stdout, through the live display; send them to `path` instead. Returns the undo.
    Leaves Ray alone when its printer is not where this expects it."""
    worker: Any = sys.modules.get("ray._private.worker")
    original = getattr(worker, "print_to_stdstream", None)
    if worker is None or not callable(original):
        return lambda: None

    def to_file(data: dict[str, Any], ignore_prefix: bool = False) -> None:
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as fh:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            for line in data.get("lines", []):
                fh.write(f"{stamp} ({data.get('pid')}) {line}\n")

    path.parent.mkdir(parents=True, exist_ok=True)
    worker.print_to_stdstream = to_file

    def undo() -> None:
        worker.print_to_stdstream = original

    return undo


def _join_command(resource: str) -> str:
    return f"ray start --address=<head>:6379 --resources='{{\"{resource}\": 1}}'"


class RayExecutor:
    """Runs each unit as a Ray task on the host that advertises its target's resource, with
    `run_unit` (by default :func:`bmoe.sweep.units.run_unit`, as locally) on that host."""

    def __init__(self, address: str, run_unit: UnitRunner = run_unit_here, **init_options: Any):
        self.address = address
        self.run_unit = run_unit
        self.init_options = init_options
        self._owns_connection = False
        self._restore_printer: Callable[[], None] = lambda: None
        self._lanes: dict[str, _Lane] = {}
        self._checked = False

    # -- connection
    def _connect(self, log: Path) -> None:
        if ray.is_initialized():
            return
        if self.address.startswith("ray://"):
            raise BmoeError(
                f"Ray address {self.address}: run bmoe sweep on a host of the cluster (the "
                'head) with address = "auto" or "<head>:6379"; Ray Client is not supported'
            )
        options = {"logging_level": logging.WARNING, "log_to_driver": False, **self.init_options}
        try:
            ray.init(address=self.address, **options)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BmoeError(f"cannot join the Ray cluster at {self.address}: {detail}") from None
        self._owns_connection = True
        self._restore_printer = _errors_to_file(log)

    def _disconnect(self) -> None:
        if self._owns_connection:
            with contextlib.suppress(Exception):
                ray.shutdown()
            self._owns_connection = False
            self._restore_printer()

    # -- before the sweep
    def check(self, targets: Sequence[Target], ctx: CellContext) -> None:
        """Every target must be advertised by exactly one live host, with one unit of its
        resource, and pass its check there; otherwise one error naming each target."""
        if not targets:  # nothing left to run (a resumed sweep that was complete)
            self._checked = True
            return
        self._connect(ctx.archive.state_dir / RAY_LOG)
        try:
            self._lanes = self._place(targets)
            self._check_on_hosts(ctx.archive.root.name)
        except BaseException:
            self._disconnect()
            raise
        self._checked = True
        ctx.sink.target_hosts({name: lane.host for name, lane in self._lanes.items()})

    def _place(self, targets: Sequence[Target]) -> dict[str, _Lane]:
        nodes = _alive_nodes()
        labels = _labels(nodes)
        problems: list[str] = []
        lanes: dict[str, _Lane] = {}
        missing: str | None = None
        for target in targets:
            resource = target.spec.ray_resource
            having = [n for n in nodes if n.resources.get(resource, 0) > 0]
            if not having:
                missing = missing or resource
                problems.append(
                    f"target {target.name}: no host in the Ray cluster at "
                    f"{self.address} advertises its resource {resource!r}"
                )
            elif len(having) > 1:
                hosts = ", ".join(labels[n.id] for n in having)
                problems.append(
                    f"target {target.name}: hosts {hosts} all advertise its resource "
                    f"{resource!r}; a device hangs off one host"
                )
            elif having[0].resources[resource] != 1:
                amount = having[0].resources[resource]
                problems.append(
                    f"target {target.name}: host {labels[having[0].id]} advertises "
                    f"{amount:g} units of {resource!r}; a device runs one run at a "
                    "time: advertise 1"
                )
            else:
                node = having[0]
                lanes[target.name] = _Lane(target, resource, node.id, labels[node.id])
        if problems:
            hint = f" (start a host with: {_join_command(missing)})" if missing else ""
            raise BmoeError("; ".join(problems) + hint)
        return lanes

    def _check_on_hosts(self, sweep_name: str) -> None:
        refs = {
            name: _check_target_remote.options(
                num_cpus=0,
                max_retries=0,
                name=f"bmoe check {name}",
                scheduling_strategy=NodeAffinitySchedulingStrategy(lane.node, soft=False),
            ).remote(lane.target.spec, sweep_name)
            for name, lane in self._lanes.items()
        }
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=CHECK_TIMEOUT_S)
        problems = []
        for name, ref in refs.items():
            host = self._lanes[name].host
            if ref not in ready:
                ray.cancel(ref, force=True)
                problems.append(
                    f"target {name}: its host {host} did not answer within {CHECK_TIMEOUT_S:.0f} s"
                )
                continue
            try:
                answer = ray.get(ref)
            except RayError as exc:
                problems.append(f"target {name}: on host {host}: {_reason(exc)[1]}")
                continue
            if answer["error"]:
                problems.append(f"{answer['error']} (on host {host})")
        if problems:
            raise BmoeError("; ".join(problems))

    # -- the sweep
    def execute(
        self, units: Sequence[Unit], targets: Sequence[Target], ctx: CellContext
    ) -> Iterator[dict[str, Any]]:
        interrupted = False
        flag = None
        try:
            if not units:
                return
            if not self._checked:
                self.check(targets, ctx)
            lanes = {t.name: self._lanes[t.name] for t in targets}
            driver_node = ray.get_runtime_context().get_node_id()
            flag = _stop_flag_remote.options(
                num_cpus=0,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(driver_node, soft=True),
            ).remote()
            receiver = Receiver(ctx.archive, ctx.config, ctx.sink)
            state = _Sweep(
                ctx, lanes, receiver, flag, ray.put(ctx.config), list(units), self.run_unit
            )
            # The loop (Ray calls, archiving) runs in a thread, so that Ctrl-C in this one
            # only stops the sweep and never cuts an attempt's archiving in half.
            results: queue.Queue = queue.Queue()
            finished = object()

            def loop() -> None:
                try:
                    while state.step():
                        for record in state.take_records():
                            results.put(record)
                    for record in state.take_records():
                        results.put(record)
                except BaseException as exc:  # surfaced in the driver thread
                    results.put(exc)
                finally:
                    state.abandon()
                    results.put(finished)

            thread = threading.Thread(target=loop, name="bmoe-farm", daemon=True)
            thread.start()
            try:
                while True:
                    try:
                        item = results.get(timeout=0.25)
                    except queue.Empty:
                        continue
                    except KeyboardInterrupt:
                        interrupted = True
                        ctx.stop.set()
                        continue
                    if item is finished:
                        break
                    if isinstance(item, BaseException):
                        ctx.stop.set()
                        raise item
                    yield item
            finally:
                if thread.is_alive():
                    ctx.stop.set()
                    thread.join(timeout=ctx.stop_grace_s + STOP_WAIT_S)
            state.report_left()
            if receiver.cell_failed is not None:
                from bmoe.sweep.attempt import CellFailed

                raise CellFailed(receiver.cell_failed)
        finally:
            if flag is not None:
                with contextlib.suppress(Exception):
                    ray.kill(flag)
            self._lanes, self._checked = {}, False
            self._disconnect()
        if interrupted:
            raise KeyboardInterrupt


class _Sweep:
    """The driver's loop state: units waiting, one job per busy target, hosts seen."""

    def __init__(self, ctx, lanes, receiver, flag, config_ref, units, run_unit: UnitRunner):
        self.ctx = ctx
        self.lanes: dict[str, _Lane] = lanes
        self.receiver: Receiver = receiver
        self.flag = flag
        self.config_ref = config_ref
        self.run_unit = run_unit
        self.pending: list[Unit] = sorted(units, key=lambda u: u.runs[0].order)
        self.jobs: dict[str, _Job] = {}
        self.failures: dict[str, int] = {}
        self.dead_nodes: set[str] = set()
        self.records: list[dict[str, Any]] = []
        self.stop_deadline: float | None = None
        self.next_view = 0.0

    # -- one turn of the loop; False when nothing runs and nothing can be started
    def step(self) -> bool:
        ctx = self.ctx
        now = time.monotonic()
        if ctx.stop.is_set() and self.stop_deadline is None:
            self.stop_deadline = now + ctx.stop_grace_s + STOP_WAIT_S
            self.flag.set.remote()
            for name, job in list(self.jobs.items()):
                if job.delivery.host is None:  # still waiting for its device: never began
                    ray.cancel(job.gen, force=True)
                    del self.jobs[name]
        if now >= self.next_view:
            self.next_view = now + VIEW_EVERY_S
            self._watch_hosts()
        if not ctx.stop.is_set():
            self._dispatch()
        if not self.jobs:
            return False
        if self.stop_deadline is not None and now > self.stop_deadline:
            for name in list(self.jobs):
                self._end(name, ("interrupted", "stopped; the host did not end the run in time"))
            return False
        gens = [job.gen for job in self.jobs.values()]
        ready, _ = ray.wait(gens, num_returns=len(gens), timeout=0.2)
        ready_ids = {id(g) for g in ready}
        for name, job in list(self.jobs.items()):
            if id(job.gen) in ready_ids:
                self._drain(name, job)
        return True

    def take_records(self) -> list[dict[str, Any]]:
        records, self.records = self.records, []
        return records

    def _drain(self, name: str, job: _Job) -> None:
        while True:
            ready, _ = ray.wait([job.gen], timeout=0)
            if not ready:
                return
            try:
                item = ray.get(next(job.gen))
            except StopIteration:
                self._end(name, None)
                return
            except RayError as exc:
                self._end(name, _reason(exc))
                if isinstance(exc, NodeDiedError):
                    self._retire(job.lane.node)
                return
            self.records.extend(self.receiver.receive(job.delivery, item))
            if self.receiver.cell_failed is not None:
                self.ctx.stop.set()

    def _end(self, name: str, failure: tuple[str, str] | None) -> None:
        """A job is over: archive its attempts in flight when it failed, requeue what is
        left of its unit (lost attempts count against the retries)."""
        job = self.jobs.pop(name)
        delivery = job.delivery
        if failure is not None:
            with contextlib.suppress(Exception):
                ray.cancel(job.gen, force=True)
            status, error = failure
            if delivery.host is None:  # it never began: where it was sent
                delivery.host, delivery.node = job.lane.host, job.lane.node
            self.records.extend(self.receiver.fail(delivery, status, error))
        if self.ctx.stop.is_set() or failure is None:
            return
        again = []
        for run in delivery.to_retry():
            if run.id in delivery.lost:
                self.failures[run.id] = self.failures.get(run.id, 0) + 1
                if self.failures[run.id] > self.ctx.config.settings.retries:
                    continue
            again.append(run)
        if again:
            unit = delivery.unit
            self.pending.append(Unit(tuple(again), unit.tags, unit.session))
            self.pending.sort(key=lambda u: u.runs[0].order)

    def _retire(self, node: str) -> None:
        """A node died: its targets take no more work until their resource shows up on a
        live node (its jobs end on their own, each with its error)."""
        self.dead_nodes.add(node)
        for name, lane in self.lanes.items():
            if lane.node == node and not lane.gone:
                lane.gone = True
                self.ctx.sink.message(f"target {name}: its host {lane.host} died")

    def _watch_hosts(self) -> None:
        """Targets whose host left the cluster stop taking work (their running job is a lost
        attempt); a target whose resource shows up again (a host that came back) returns."""
        try:
            nodes = [n for n in _alive_nodes() if n.id not in self.dead_nodes]
        except Exception:  # the cluster did not answer this time; look again later
            return
        labels = _labels(nodes)
        changed = False
        for name, lane in self.lanes.items():
            having = [n for n in nodes if n.resources.get(lane.resource, 0) > 0]
            if len(having) != 1:
                if not lane.gone:
                    lane.gone = True
                    self.ctx.sink.message(
                        f"target {name}: its host {lane.host} left the "
                        f"cluster (no {lane.resource!r})"
                    )
                if name in self.jobs:
                    self._end(name, ("lost", f"host {lane.host} left the Ray cluster"))
            elif lane.gone or having[0].id != lane.node:
                if name in self.jobs:  # still bound to the old node; let it end first
                    continue
                lane.node, lane.host, lane.gone = having[0].id, labels[having[0].id], False
                changed = True
                self.ctx.sink.message(f"target {name}: on host {lane.host}")
        if changed:
            self.ctx.sink.target_hosts({name: lane.host for name, lane in self.lanes.items()})

    def _dispatch(self) -> None:
        archive = self.ctx.archive
        for name, lane in self.lanes.items():
            if lane.gone or name in self.jobs:
                continue
            unit = next((u for u in self.pending if lane.target.spec.can_run(u.tags)), None)
            if unit is None:
                continue
            self.pending.remove(unit)
            floors = {run.id: archive.next_attempt(run.id) for run in unit.runs}
            sessions_dir = archive.root / SESSIONS
            taken = []
            if unit.session and sessions_dir.is_dir():
                taken = sorted(p.name for p in sessions_dir.iterdir() if p.name[0] != ".")
            gen = _run_unit_remote.options(
                num_cpus=0, max_retries=0, num_returns="streaming",
                resources={lane.resource: 1}, name=f"bmoe {name} {unit.runs[0].id}",
            ).remote(unit, lane.target.spec, self.config_ref, archive.root.name, floors, taken,
                     self.flag, self.run_unit, self.ctx.keep_going)  # fmt: skip
            self.jobs[name] = _Job(lane, Delivery(unit, lane.target.spec), gen)

    def abandon(self) -> None:
        """Leaving (an error, or the deadline after a stop): cancel what still runs."""
        for job in self.jobs.values():
            with contextlib.suppress(Exception):
                ray.cancel(job.gen, force=True)
        self.jobs.clear()

    def report_left(self) -> None:
        runs = sum(len(u.runs) for u in self.pending)
        if not runs or self.ctx.stop.is_set():
            return
        gone = sorted(name for name, lane in self.lanes.items() if lane.gone)
        why = f" (targets whose host left the cluster: {', '.join(gone)})" if gone else ""
        self.ctx.sink.message(f"{runs} runs wait for a target that may run them{why}; resume "
                              f"with: {resume_command(self.ctx.archive.root)}")  # fmt: skip
