"""Choosing among routes that compute the same thing (kernels, operator sequences): an ordered list of
routes, each with a function saying why it does not take a call, as xformers' ops/fmha/dispatch.py
chooses its attention operators.

    routes = RouteDispatch("centroid route", (Route("fused", cpu_only), Route("unfused", takes_every_call)),
                           preference=lambda call: ("fused", "unfused"))
    routes.choose(RouteCall("cpu", torch.float32))       # the first preferred route that takes the call
    with routes.forced("cpu", "unfused"):                 # the one way to choose a route by hand
        ...

A route's `declines(call)` says why the route cannot run the call (the device, the dtype, a size
limit), None when it can. `preference(call)` orders the route names for a call by what was measured
fastest; a route left out of it is taken only when forced. Forcing a route on a device type puts it
first for the calls on that device inside the `with` block: a call it declines falls to the
preferred routes in order, so a forced route never makes a call fail.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator, NamedTuple

import torch


class RouteCall(NamedTuple):
    """A call as a dispatch sees it. `dtype` None: any dtype (forcing a route asks whether it takes
    some call on the device); `slots`: the cluster slots of a clustered attention's call."""
    device_type: str
    dtype: torch.dtype | None = None
    slots: int = 1


class Route(NamedTuple):
    name: str
    declines: Callable[[RouteCall], str | None]   # why the route does not take the call; None: it does


def takes_every_call(call: RouteCall) -> None:
    return None


class RouteDispatch:
    """An ordered list of routes and the routes forced per device type (see the module's docstring)."""

    def __init__(self, what: str, routes: tuple[Route, ...], preference: Callable[[RouteCall], tuple[str, ...]]):
        self.what = what
        self.routes = {route.name: route for route in routes}
        self.preference = preference
        self._forced: dict[str, str] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.routes)

    def forced_route(self, device_type: str) -> str | None:
        """The route forced on `device_type` now, None when the dispatch chooses."""
        return self._forced.get(device_type)

    def order(self, call: RouteCall) -> tuple[str, ...]:
        """The route names in the order they are tried for `call`: the forced one, then the preferred."""
        preferred = self.preference(call)
        forced = self._forced.get(call.device_type)
        return preferred if forced is None else (forced, *(name for name in preferred if name != forced))

    def reasons(self, call: RouteCall) -> dict[str, str | None]:
        """Every route's reason for declining `call` (None: it takes it), in the order they are tried."""
        tried = self.order(call)
        return {name: self.routes[name].declines(call) for name in (*tried, *(n for n in self.routes if n not in tried))}

    def choose(self, call: RouteCall) -> str:
        """The first route in `order(call)` that takes the call."""
        refusals = []
        for name in self.order(call):
            reason = self.routes[name].declines(call)
            if reason is None:
                return name
            refusals.append(f"{name}: {reason}")
        raise RuntimeError(f"no {self.what} takes a call on {call.device_type} in {call.dtype} "
                           f"({'; '.join(refusals)})")

    @contextlib.contextmanager
    def forced(self, device_type: str, name: str | None) -> Iterator[None]:
        """Inside the block, calls on `device_type` try route `name` first (None: the dispatch's own
        choice); the route forced before is restored on leaving."""
        if name is not None:
            if name not in self.routes:
                raise ValueError(f"{self.what} {name!r}: choose one of {', '.join(self.routes)}")
            reason = self.routes[name].declines(RouteCall(device_type))
            if reason is not None:
                raise ValueError(f"the {name} {self.what} cannot run on {device_type}: {reason}")
        previous = self._forced.pop(device_type, None)
        if name is not None:
            self._forced[device_type] = name
        try:
            yield
        finally:
            self._forced.pop(device_type, None)
            if previous is not None:
                self._forced[device_type] = previous
