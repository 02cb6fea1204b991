"""The :class:`Engine`: the one dispatcher of events.

On each event it runs, in this order: the algorithms whose ``match`` is true (ordered by
the algorithm passes of :mod:`~cadence.core.passes`; reversed on ``AFTER_*``
events), then the callbacks, then the logger destinations. On ``INIT`` the order is the
other way round, as in Composer: logger destinations first (so they are ready before
anything logs), then callbacks, then algorithms. Source: Composer's ``Engine.run_event``
(``composer/core/engine.py``).

Dispatch is precomputed per event: a callback whose class does not override an event's
method is never called for that event, and an algorithm that names its ``events`` is
never asked to ``match`` others, so an idle callback costs nothing per step. Algorithms
need only ``match`` and ``apply`` (duck typing, as in Composer): ``events`` is read only from
:class:`~cadence.core.algorithm.Algorithm` subclasses, so any object with ``match`` and
``apply`` (a ``unittest.mock.Mock`` too) is asked to ``match`` on every event.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from cadence.core.algorithm import Algorithm
from cadence.core.callback import Callback
from cadence.core.event import Event
from cadence.core.passes import DEFAULT_PASSES, AlgorithmPass
from cadence.core.state import State

__all__ = ["Engine", "Trace", "Traces"]

log = logging.getLogger(__name__)


@dataclass
class Trace:
    """Record of one algorithm's run on one event (Composer's ``Trace``).

    Attributes:
        name: the algorithm's class name.
        event: the event.
        exit_code: what ``apply`` returned (usually ``None``).
        order: its position among the algorithms that ran on the event.
        run: whether it ran.
    """

    name: str = ""
    event: Optional[Event] = None
    exit_code: Optional[int] = None
    order: Optional[int] = None
    run: bool = False


#: ``run_event``'s result: ``"<AlgorithmClass>/<EVENT>"`` (``"EMA/BATCH_END"``) -> :class:`Trace`,
#: in run order.
Traces = dict[str, Trace]

PassSpec = Union[AlgorithmPass, tuple[AlgorithmPass, int]]

_INIT = Event.INIT
_CHECKPOINT_EVENTS = frozenset({Event.BATCH_CHECKPOINT, Event.EPOCH_CHECKPOINT})


def _overrides(callback: Any, event: Event) -> bool:
    """Whether ``callback`` does anything on ``event`` (overrides its method or run_event)."""
    cls = type(callback)
    if not isinstance(callback, Callback):
        return True  # duck-typed: it has run_event; let it decide
    if cls.run_event is not Callback.run_event:
        return True
    return getattr(cls, event.value) is not getattr(Callback, event.value)


def _may_match(algorithm: Any, event: Event) -> bool:
    """Whether ``algorithm`` is asked to ``match`` ``event``: a real Algorithm names its
    ``events`` (``None``: any); any other object with ``match``/``apply`` is always asked."""
    if not isinstance(algorithm, Algorithm) or "match" in vars(algorithm):
        return True  # duck-typed, or its match replaced on the instance (a test's Mock)
    events = algorithm.events
    return events is None or event in events


def _close(obj: Any, state: State, logger: Any) -> None:
    """``obj.close(state, logger)`` (Composer's signature) or ``obj.close()`` (cadence's)."""
    close = getattr(obj, "close", None)
    if close is None:
        return
    try:
        takes_args = len(inspect.signature(close).parameters) >= 2
    except (TypeError, ValueError):
        takes_args = False
    if takes_args:
        close(state, logger)
    else:
        close()


#: Callbacks and destinations between an engine's ``INIT`` and its ``close`` (Composer's
#: rule: one open run per callback object, so its state is reset by ``close`` first).
_OPEN_CALLBACKS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _claim_open(objects: Sequence[Any]) -> None:
    """Mark ``objects`` open, refusing any another engine still has open.

    Raises:
        RuntimeError: Composer's message, naming the objects.
    """
    still_open = [obj for obj in objects if _is_open(obj)]
    if still_open:
        names = ", ".join(type(obj).__name__ for obj in still_open)
        raise RuntimeError(
            f"Cannot create a new trainer with an open callback or logger from a previous "
            f"trainer ({names}). To fix, call trainer.close() before creating this new "
            f"trainer so every callback and logger shuts down (and resets) first.")
    for obj in objects:
        try:
            _OPEN_CALLBACKS.add(obj)
        except TypeError:  # not weak-referenceable or not hashable: not tracked
            pass


def _is_open(obj: Any) -> bool:
    try:
        return obj in _OPEN_CALLBACKS
    except TypeError:
        return False


class Engine:
    """Runs algorithms, callbacks and logger destinations on each event.

    On ``BATCH_CHECKPOINT`` and ``EPOCH_CHECKPOINT`` every callback and destination runs
    even when one before it raises (the first error is raised after), so a failing callback
    never costs the checkpoint due at that event.

    Composer's lifetime rules: ``INIT`` refuses a callback or destination still open in
    another engine (not yet closed); :meth:`close` closes them (once), and so does dropping
    the engine without closing it.

    Args:
        state: the run's :class:`State`; its ``algorithms`` and ``callbacks`` are read here
            and by :meth:`refresh`.
        logger: passed to every ``apply`` and callback method (a :class:`~cadence.Logger`).
        algorithm_passes: extra passes, after the default ones (Composer's argument): a pass,
            a ``(pass, index)`` pair (inserted at ``index``), or a list of these.
        destinations: logger destinations (callbacks too), run after the callbacks (before
            them on ``INIT``).
        passes: replaces the default passes (``reverse_on_after_events``,
            ``warn_if_multiple_loss_interpolation``).

    Raises:
        ValueError: an ``algorithm_passes`` entry that is neither a pass nor a
            ``(pass, index)`` pair.
    """

    def __init__(
        self,
        state: State,
        logger: Any,
        algorithm_passes: Optional[Union[PassSpec, Sequence[PassSpec]]] = None,
        *,
        destinations: Sequence[Any] = (),
        passes: Sequence[AlgorithmPass] = DEFAULT_PASSES,
    ) -> None:
        self.state = state
        self.logger = logger
        self.algorithm_passes: list[AlgorithmPass] = list(passes)
        self._open_spans: set[str] = set()  # BEFORE_* ... AFTER_* spans being profiled
        for spec in _pass_specs(algorithm_passes):
            self.register_pass(*spec)
        self.refresh(destinations)
        self._closed = False  # last: an engine whose __init__ raised has nothing to close
        ref = weakref.ref(self)
        atexit.register(lambda: (e := ref()) is not None and e.close())

    @property
    def passes(self) -> tuple[AlgorithmPass, ...]:
        """The algorithm passes, in the order they are applied."""
        return tuple(self.algorithm_passes)

    def register_pass(self, algorithm_pass: AlgorithmPass, index: int = -1) -> None:
        """Add ``algorithm_pass``; at ``index`` in the list of passes, or last (``-1``)."""
        if index == -1:
            index = len(self.algorithm_passes)
        self.algorithm_passes.insert(index, algorithm_pass)

    def refresh(self, destinations: Sequence[Any] | None = None) -> None:
        """Recompute the per-event dispatch tables (after adding algorithms or callbacks)."""
        if destinations is not None:
            self.destinations = list(destinations)
        algorithms = list(self.state.algorithms)
        self._algorithms: dict[Event, list[Any]] = {}
        self._callbacks: dict[Event, list[Any]] = {}
        self._loggers: dict[Event, list[Any]] = {}
        for event in Event:
            self._algorithms[event] = [a for a in algorithms if _may_match(a, event)]
            self._callbacks[event] = [c for c in self.state.callbacks if _overrides(c, event)]
            self._loggers[event] = [d for d in self.destinations if _overrides(d, event)]
        self._plan = {event: (self._algorithms[event], self._callbacks[event], self._loggers[event])
                      for event in Event}

    def run_event(self, event: Union[Event, str]) -> Traces:
        """Fire ``event`` (an :class:`Event` or its value, ``"batch_end"``): matching
        algorithms, then callbacks, then logger destinations (on ``INIT``: destinations,
        callbacks, algorithms).

        Returns:
            The :data:`Traces` of the algorithms that ran (empty when none did).

        Raises:
            RuntimeError: the engine was closed; make a new Engine (or Trainer).
        """
        if self._closed:
            raise RuntimeError(
                f"The engine was already closed, so it cannot run {event!r}; make a new Engine "
                f"(or Trainer) to run again."
            )
        if type(event) is not Event:
            event = Event(event)
        if getattr(self.state, "profiler", None) is not None:
            return self._run_profiled(event)
        return self._dispatch(event)

    def _run_profiled(self, event: Event) -> Traces:
        """:meth:`_dispatch`, recorded in the profiler's traces: the event's own time
        (``event/<event>``) and, from a ``BEFORE_*`` event to its ``AFTER_*``, the step
        between (``event/forward``, ``event/dataloader``, ...), category ``event``."""
        profiler = self.state.profiler
        pair = event.value.replace("before_", "").replace("after_", "")
        if event.is_after_event and pair in self._open_spans:
            self._open_spans.remove(pair)
            profiler.marker(f"event/{pair}", categories=("event",)).finish()
        marker = profiler.marker(f"event/{event.value}", categories=("event",))
        marker.start()
        try:
            traces = self._dispatch(event)
        finally:
            marker.finish()
        if event.is_before_event:
            span = profiler.marker(f"event/{pair}", categories=("event",))
            if pair in self._open_spans:  # an exception skipped its AFTER_* event
                span.finish()
            span.start()
            self._open_spans.add(pair)
        return traces

    def _dispatch(self, event: Event) -> Traces:
        algorithms, callbacks, destinations = self._plan[event]
        state, logger = self.state, self.logger
        if event is _INIT:
            _claim_open([*self.state.callbacks, *self.destinations])
            for destination in destinations:
                destination.run_event(event, state, logger)
            for callback in callbacks:
                callback.run_event(event, state, logger)
            return self._run_algorithms(event)
        traces = self._run_algorithms(event)  # cheap when none may match and no pass was added
        if event in _CHECKPOINT_EVENTS:
            self._run_all_then_raise(event, [*callbacks, *destinations])
            return traces
        for callback in callbacks:
            callback.run_event(event, state, logger)
        for destination in destinations:
            destination.run_event(event, state, logger)
        return traces

    def _run_all_then_raise(self, event: Event, receivers: Sequence[Any]) -> None:
        """Every receiver runs ``event`` even when one before it fails; the first error is
        raised after. On the checkpoint events this keeps a failing callback (a generation,
        a metric) from costing the checkpoint due there."""
        error: Optional[BaseException] = None
        for receiver in receivers:
            try:
                receiver.run_event(event, self.state, self.logger)
            except Exception as exc:
                if error is None:
                    error = exc
                else:
                    log.error("%s also failed at %s", type(receiver).__name__, event.value,
                              exc_info=exc)
        if error is not None:
            raise error

    def _run_algorithms(self, event: Event) -> Traces:
        state = self.state
        matched = [a for a in self._algorithms[event] if a.match(event, state)]
        if not matched and all(p in DEFAULT_PASSES for p in self.algorithm_passes):
            return {}  # a registered pass may add algorithms even where none matched
        for algorithm_pass in self.algorithm_passes:
            matched = algorithm_pass(matched, event)
        traces: Traces = {}
        for order, algorithm in enumerate(matched):
            exit_code = algorithm.apply(event, state, self.logger)
            name = type(algorithm).__name__
            key = f"{name}/{event.name}"
            if key in traces:  # two instances of one class: each its own trace
                key = f"{name}#{order}/{event.name}"
            traces[key] = Trace(name=name, event=event, exit_code=exit_code, order=order,
                                run=True)
        return traces

    def close(self) -> None:
        """Close every algorithm, callback and destination once (``close(state, logger)`` or
        ``close()``, then ``post_close()`` where defined). Safe to call again; after it,
        :meth:`run_event` raises. Re-raises the first error after closing the rest."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        closed: list[Any] = []
        for obj in [*self.state.algorithms, *self.state.callbacks, *self.destinations]:
            try:
                _close(obj, self.state, self.logger)
                closed.append(obj)
            except Exception as exc:  # close the rest, then re-raise the first
                log.error("Error closing %s", type(obj).__name__, exc_info=exc)
                errors.append(exc)
        for obj in closed:
            post_close = getattr(obj, "post_close", None)
            if post_close is not None:
                try:
                    post_close()
                except Exception as exc:
                    errors.append(exc)
                    continue
            if _is_open(obj):
                _OPEN_CALLBACKS.discard(obj)
        if errors:
            raise errors[0]

    def __del__(self) -> None:
        """An engine dropped without :meth:`close` closes its callbacks (Composer's)."""
        if getattr(self, "_closed", True):
            return
        try:
            self.close()
        except Exception as exc:  # nowhere to raise to from a finalizer
            log.error("Error closing a dropped Engine", exc_info=exc)


def _pass_specs(algorithm_passes: Any) -> list[tuple[AlgorithmPass, int]]:
    """Normalize Composer's forms: a pass, ``(pass, index)``, or a list of these."""
    if algorithm_passes is None:
        return []
    if callable(algorithm_passes) or (
        isinstance(algorithm_passes, (tuple, list)) and len(algorithm_passes) == 2
        and callable(algorithm_passes[0]) and isinstance(algorithm_passes[1], int)
    ):
        algorithm_passes = [algorithm_passes]
    specs: list[tuple[AlgorithmPass, int]] = []
    for spec in algorithm_passes:
        if callable(spec):
            specs.append((spec, -1))
        elif (isinstance(spec, (tuple, list)) and len(spec) == 2 and callable(spec[0])
              and isinstance(spec[1], int)):
            specs.append((spec[0], spec[1]))
        else:
            raise ValueError(
                f"algorithm_passes: {spec!r} is neither a pass (a function (algorithms, event) "
                f"-> algorithms) nor a (pass, index) pair."
            )
    return specs
