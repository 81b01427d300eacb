r"""Simulation of the particle flow on $(S^{d-1})^n$ with diffrax (docs/math/particles.md).

Fixed-step solvers ``"euler"``, ``"rk2"`` (projected Heun, the paper's scheme) and
``"rk4"`` are diffrax Runge--Kutta solvers wrapped so that every step ends with
the radial projection $x \leftarrow x / \|x\|$ (the construction recommended by the
diffrax maintainer for manifolds, diffrax issues 277 and 462). Adaptive
``"tsit5"``, ``"dopri5"`` and ``"heun"`` (Heun's step, Euler's its error estimate: also the
adaptive step of a noisy run) integrate the tangent field $P_x F(x)$ with
required ``rtol``/``atol``; saved states are renormalised.

Step rule of ``"euler"`` (``step=``): ``"projected"`` (default) steps along the tangent field,
$x \leftarrow \operatorname{normalize}(x + h P_x F(x))$; ``"renormalize"`` is the published
simulation code's update (github.com/borjanG/2023-transformers-rotf), the unprojected field
``model.field`` then the radial projection, $x \leftarrow \operatorname{normalize}(x + h F(x))$:
the projected step of length $h / (1 + h \langle F_i, x_i\rangle)$ per particle, the same flow to
first order ($O(h^2)$ apart per step), not the same numbers.

Observables are computed at the save times by ``SaveAt(fn=...)``: states are
only stored when ``save_states=True`` (the default, ``Trajectory.xs``).

Early stop (App. B.1): with ``early_stop=tol`` the run stops at the first time
$t$ (checked every time unit) where $|E(t) - E(t - 1)| \le \text{tol}\, |E(t)|$. Saved
values after the stop repeat the final state (the flow is stationary to ``tol``).

Failures never pass silently: ``Trajectory.failed`` is true when the state went non-finite
(the run stops there: saved values after ``stop_time`` are NaN), when a token of a scheme with
a radius passed through or near the origin (likewise; below), when the solver failed
(``max_steps`` exhausted: likewise), or when any saved value -- the energy, the collapse gap,
an observable -- is NaN or infinite (e.g. ``beta`` so small that $e^\beta / (2 \beta)$
overflows while the states stay finite; the run is not stopped then, and the saved values
are kept as computed so that the failure can be located). ``Trajectory.failure`` says which
(``FAILURES``). For tokens in $\mathbb R^d$ (``geometry="euclidean"``) the collapse gap, an
observable of the directions, is NaN while a token sits at the origin: that is not a failure.

Tokens through the origin (``normalization`` ``"pre"``, ``"mix"``, ``"peri"``: $x_i = r_i \theta_i$
in $\mathbb R^d$): the direction of a token at the origin is undefined (``LN(0)``) and near it it
turns at the angular speed $|P_\theta \dot x_i| / r_i$. A step $x \to x'$ fails the run when, for
some token, it is at least as long as the token's closest approach to the origin along it,
$\|x'_i - x_i\| \ge \min_{s \in [0, 1]} \|x_i + s (x'_i - x_i)\|$: the token reached or passed
the origin, or its direction turned by 45 degrees or more within one step (every turn of 90
degrees or more counts). A run whose steps resolve the turning, $h |\dot x_i| \ll r_i$ (every
run with radii of order 1 and the steps the solvers need), is never flagged; a token that
passes the origin more slowly than the step resolves is integrated as the flow.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeAlias, cast

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, DTypeLike, Float, PyTree

from . import _brownian, metrics, normalization, sphere
from ._checks import (
    RealScalarLike,
    check_choice,
    check_flag,
    check_int,
    check_positive,
    check_scalar,
    is_concrete,
    traced_nonnegative,
)
from ._spelling import Spelling, radius_problem, say_python
from .energy import check_states
from .geometry import geometry_of
from .kernels import Kernel
from .kernels._exp import _entry_backend, _scope_backend
from .masks import energy_problem
from .steps import STEPS as _STEPS
from .steps import StepRule

__all__ = [
    "simulate",
    "RunTime",
    "Trajectory",
    "RK4",
    "SOLVERS",
    "FIXED_STEP_SOLVERS",
    "ADAPTIVE_SOLVERS",
    "STEPS",
    "step_grid_problem",
    "PROGRESS_MARKS",
    "FAILURES",
    "uniform_saves_problem",
    "check_tolerances",
    "r0_range",
    "check_r0",
    "FixedStep",
    "ADAPTIVE_NOISE_LEVELS",
    "ADAPTIVE_NOISE_REJECTED",
]

FIXED_STEP_SOLVERS = ("euler", "rk2", "rk4")
#: the adaptive solvers: Tsitouras' and Dormand-Prince's 5(4) pairs, and Heun's 2(1) pair (Heun's
#: step with Euler's as its error estimate: the adaptive Stratonovich step of a noisy run)
ADAPTIVE_SOLVERS = ("tsit5", "dopri5", "heun")
SOLVERS = FIXED_STEP_SOLVERS + ADAPTIVE_SOLVERS
#: Step rules' names (``simulate(step=)``, the phase-diagram sweeps, the sweep key ``time.step``):
#: ``"projected"``: $x + h P_x F$ then normalise; ``"renormalize"``: $x + h F$ then normalise
#: (the published code's update; Euler only). The rules are ``mf.steps.StepRule`` objects.
STEPS = _STEPS

_rk4_tableau = diffrax.ButcherTableau(
    c=np.array([0.5, 0.5, 1.0]),
    b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
    b_error=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]) - np.array([0.0, 0.0, 0.0, 1.0]),
    a_lower=(np.array([0.5]), np.array([0.0, 0.5]), np.array([0.0, 0.0, 1.0])),
)


class RK4(diffrax.AbstractERK):
    """Classical 4th-order Runge--Kutta (diffrax has none built in).

    $k_1 = f(y)$, $k_2 = f(y + h k_1 / 2)$, $k_3 = f(y + h k_2 / 2)$, $k_4 = f(y + h k_3)$,
    $y' = y + h (k_1 + 2 k_2 + 2 k_3 + k_4) / 6$; selected by ``simulate(..., solver="rk4")``.

    Example:
        >>> from meanfield.integrate import RK4
        >>> RK4().order(None)
        4
    """

    tableau: ClassVar[diffrax.ButcherTableau] = _rk4_tableau
    interpolation_cls: ClassVar[Callable] = diffrax.ThirdOrderHermitePolynomialInterpolation.from_k

    def order(self, terms: PyTree[diffrax.AbstractTerm]) -> int:
        return 4


def _inner_solver(name: str) -> diffrax.AbstractSolver:
    return {
        "euler": diffrax.Euler,
        "rk2": diffrax.Heun,
        "rk4": RK4,
        "tsit5": diffrax.Tsit5,
        "dopri5": diffrax.Dopri5,
        "heun": diffrax.Heun,
    }[name]()


#: Why a run failed, by ``Trajectory.failure`` code (0: it did not): ``FAILURES[code]``.
#: 1: the state went non-finite; 2: a token passed through the origin (a scheme with a radius:
#: a step turned a token's direction by 90 degrees or more, ``simulate``'s docstring); 3: the
#: solver failed (``max_steps`` reached); 4: a saved value (energy, collapse gap, observable)
#: is NaN or infinite while the state stayed finite. The first reason found, in that order.
FAILURES = (
    "",
    "non-finite state",
    "token through the origin",
    "solver failed (max_steps reached)",
    "non-finite saved value",
)
_NONFINITE, _ORIGIN, _SOLVER_FAILED, _SAVED_NONFINITE = 1, 2, 3, 4

# The ODE state: (x, flags) with flags = [E_ref, t_ref, stopped, failed, switched] as floats,
# so that the Runge--Kutta combinations leave them untouched (their derivative is 0) and the
# post-step map updates them. ``failed`` holds the failure code (``FAILURES``; 0 while the run is
# sound). ``switched`` (Mix-LN only; the others have 4 flags): past the switch time (set by the
# step that ends at it, so that every stage of a step uses one scheme: the step controllers put
# the switch time among the step points, ``_Args.switch_from``).
_E_REF, _T_REF, _STOP, _FAIL, _SWITCHED = range(5)
_State: TypeAlias = tuple[Float[Array, "n d"], Float[Array, " flags"]]
# a time as diffrax's solvers and controllers take it (diffrax's own ``RealScalarLike``)
_Time: TypeAlias = int | float | Array | np.ndarray


class _Args(eqx.Module):
    model: Any  # a Kernel or a models.SelfAttention: has field(x, aux, block_size=) (and energy)
    aux: Array
    tol: Array  # early-stop tolerance (ignored when early stop is off)
    block_size: int | None = eqx.field(static=True)
    project: bool = eqx.field(static=True)
    early_stop: bool = eqx.field(static=True)
    tangent: bool = eqx.field(
        static=True, default=True
    )  # False: step="renormalize" (unprojected F)
    backend: str = eqx.field(
        static=True, default="auto"
    )  # of the exp-kernel evaluation (mf.kernels.BACKENDS)
    # the tokens carry a radius (mf.normalization.RADIAL): the state is x = r theta in R^d
    radial: bool = eqx.field(static=True, default=False)
    # geometry="euclidean": the state is the tokens in R^d, the field evaluated on them, no projection
    euclidean: bool = eqx.field(static=True, default=False)
    # simulate(progress=True): the bar's number in _BARS and the run's end time (None: no bar)
    meter: Array | None = None
    t_end: Array | None = None
    # Mix-LN: the step that ends at or after this time switches (the switch time less the step
    # grid's merging tolerance: a step point within it of the switch time is the switch point)
    switch_from: Array | None = None
    # simulate(frequencies=): (n, d, d) skew-symmetric Omega_i, the field gains Omega_i x_i
    omega: Array | None = None


def _rotation(omega: Array, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
    """``Omega_i x_i`` for every token (``omega`` ``(n, d, d)``, skew: tangent to the sphere)."""
    return jnp.einsum("nij,nj->ni", omega, x, precision=jax.lax.Precision.HIGHEST)


def _vector_field(t: _Time, y: _State, args: _Args) -> _State:
    x, flags = y
    model = args.model.at_time(t)
    if args.euclidean:
        with _scope_backend(args.backend):
            F = model.field(x, args.aux, block_size=args.block_size)
        if args.omega is not None:
            F = F + _rotation(args.omega, x)
        return F, jnp.zeros_like(flags)
    xh = sphere.normalize(x)
    with _scope_backend(args.backend):
        F = model.field(xh, args.aux, block_size=args.block_size)
    scheme = normalization.scheme_of(model)
    if args.radial:
        switched = flags[_SWITCHED] > 0.5 if scheme.switch_at() is not None else True
        v = scheme.radial_velocity(x, F, switched=switched)
        return v, jnp.zeros_like(flags)
    v = sphere.project(xh, F) if args.tangent else F
    v = scheme.scale_velocity(v, t)  # LN-scaling: 1 / sqrt(t + 1)
    if args.omega is not None:  # natural frequencies: a rotation of each token, tangent already
        v = v + _rotation(args.omega, xh)
    return v, jnp.zeros_like(flags)


def _energy(args: _Args, x: Float[Array, "n d"]) -> Float[Array, ""]:
    with _scope_backend(args.backend):
        return args.model.energy(x, args.aux, block_size=args.block_size)


def _near_origin(x0: Float[Array, "n d"], x1: Float[Array, "n d"]) -> Bool[Array, " n"]:
    r"""Whether each token's step $x_0 \to x_1$ is at least as long as its closest approach to the
    origin: $\|x_1 - x_0\| \ge \delta = \min_{s \in [0, 1]} \|x_0 + s (x_1 - x_0)\|$ (the schemes with a
    radius: the token reached or passed the origin, where it has no direction, or came closer to
    it than the step is long, so that its direction turned by 45 degrees or more within the
    step, a step that does not resolve the direction's angular speed $|P_\theta \dot x| / r$).

    A step that turns a direction by 90 degrees or more always counts ($\delta \le \min(r_0, r_1)$
    and then $\|x_1 - x_0\|^2 \ge r_0^2 + r_1^2$); a step of length $h |\dot x| \ll r$ never does.
    """
    dx = x1 - x0
    L2 = jnp.sum(dx * dx, axis=-1)
    s = jnp.clip(-jnp.sum(x0 * dx, axis=-1) / jnp.where(L2 > 0, L2, 1.0), 0.0, 1.0)
    closest = x0 + s[:, None] * dx
    return L2 >= jnp.sum(closest * closest, axis=-1)


def _post_step(t1: _Time, y: _State, args: _Args, x_prev: Array | None = None) -> _State:
    """Projection after the step, failure flag, early-stop window bookkeeping.

    ``x_prev``: the state at the step's start (the schemes with a radius: a step that took a
    token through or near the origin, ``_near_origin``, is a failure ``_ORIGIN``)."""
    x, flags = y
    if args.project and not (args.radial or args.euclidean):
        x = sphere.normalize(x)
    bad = ~jnp.all(jnp.isfinite(x))
    code = jnp.where(bad, float(_NONFINITE), 0.0)
    if args.radial:  # a token at (or through) the origin has no direction
        origin = jnp.any(jnp.sum(x * x, axis=-1) <= 0)
        if x_prev is not None:
            origin = origin | jnp.any(_near_origin(x_prev, x))
        code = jnp.where(bad, code, jnp.where(origin, float(_ORIGIN), 0.0))
    flags = flags.at[_FAIL].set(jnp.where(code > 0, code.astype(flags.dtype), flags[_FAIL]))
    switch = normalization.scheme_of(args.model).switch_at() if args.radial else None
    if switch is not None:
        tau = jnp.asarray(switch, flags.dtype)
        if args.switch_from is not None:
            tau = args.switch_from.astype(flags.dtype)
        flags = flags.at[_SWITCHED].set(jnp.where(t1 >= tau, 1.0, flags[_SWITCHED]))
    if args.early_stop:
        due = (t1 - flags[_T_REF]) >= 1.0 - 1e-6
        E = jax.lax.cond(
            due,
            lambda: _energy(args, sphere.normalize(x)).astype(flags.dtype),
            lambda: flags[_E_REF],
        )
        rel = jnp.abs(E - flags[_E_REF]) / jnp.maximum(jnp.abs(E), jnp.finfo(flags.dtype).tiny)
        stop = due & (rel <= args.tol)
        flags = flags.at[_STOP].set(jnp.where(stop, 1.0, flags[_STOP]))
        flags = flags.at[_E_REF].set(jnp.where(due, E, flags[_E_REF]))
        flags = flags.at[_T_REF].set(jnp.where(due, t1, flags[_T_REF]))
    return x, flags


class _EndpointInterpolation(diffrax.LocalLinearInterpolation):
    """Linear interpolation that returns the step's endpoints exactly.

    Saves sit on step times, so this makes saved states bit-identical to the
    stepped ones (and keeps a finite ``y0`` when ``y1`` went non-finite).
    """

    def evaluate(self, t0: _Time, t1: _Time | None = None, left: bool = True) -> PyTree[Array]:
        if t1 is not None:
            return super().evaluate(t0, t1, left)
        lin = super().evaluate(t0)
        return jax.tree.map(
            lambda a, b, c: jnp.where(t0 == self.t0, a, jnp.where(t0 == self.t1, b, c)),
            self.y0,
            self.y1,
            lin,
        )


class _PostStepSolver(diffrax.AbstractSolver):
    """Wraps a diffrax solver and applies ``_post_step`` after every step.

    Dense output is the linear interpolation between the post-processed endpoints
    (saves are placed on step times, so it is only used at step ends).
    """

    inner: diffrax.AbstractSolver
    term_structure: ClassVar = diffrax.AbstractTerm
    interpolation_cls: ClassVar = _EndpointInterpolation

    def order(self, terms: PyTree[diffrax.AbstractTerm]) -> int | None:
        return self.inner.order(terms)

    def strong_order(self, terms: PyTree[diffrax.AbstractTerm]) -> _Time | None:
        return None

    def error_order(self, terms: PyTree[diffrax.AbstractTerm]) -> _Time | None:
        return self.inner.error_order(terms)

    def init(
        self,
        terms: PyTree[diffrax.AbstractTerm],
        t0: _Time,
        t1: _Time,
        y0: _State,
        args: _Args,
    ) -> Any:
        return self.inner.init(terms, t0, t1, y0, args)

    def step(
        self,
        terms: PyTree[diffrax.AbstractTerm],
        t0: _Time,
        t1: _Time,
        y0: _State,
        args: _Args,
        solver_state: Any,
        made_jump: bool | Array | np.ndarray,
    ) -> tuple[_State, PyTree[Array] | None, dict[str, _State], Any, diffrax.RESULTS]:
        y1, y_error, _, solver_state, result = self.inner.step(
            terms, t0, t1, y0, args, solver_state, made_jump
        )
        y1 = _post_step(t1, y1, args, x_prev=y0[0])
        if args.meter is not None and args.t_end is not None:  # simulate(progress=True)
            _report_progress(args.meter, t0, t1, args.t_end)
        return y1, y_error, dict(y0=y0, y1=y1), solver_state, result

    def func(
        self, terms: PyTree[diffrax.AbstractTerm], t0: _Time, y0: _State, args: _Args
    ) -> _State:
        return self.inner.func(terms, t0, y0, args)


# ----------------------------------------------------------------------------
# one step of the engine, for studies that drive their own loop
# ----------------------------------------------------------------------------


class FixedStep(eqx.Module):
    r"""One step of ``mf.simulate``'s fixed-step integration of ``model`` (one system): the same
    vector field (the model's field at the step's start time, projected per the step rule, the
    velocity of its normalisation scheme), the same solver stages and the same post-step (the
    radial projection, the failure flags: a non-finite state, a token through the origin; Mix-LN's
    switch flag), for studies that drive their own loop over steps: the phase diagrams' batched
    sweeps (``mf.phase_diagram``) and the random-batch integrator (``mf.random_batch``) step with
    it, so a new model, scheme, attention kind or step rule reaches them with no edit.

    The state is ``(x, flags)`` (``init``); ``__call__(t0, t1, y)`` is one solver step from
    ``t0`` to ``t1`` (simulate's step between two step points), ``grid(k, y)`` the step from
    ``k h`` to ``(k + 1) h`` of the uniform grid of step ``h`` as simulate takes it (two steps
    when Mix-LN's switch time lies inside, more than ``h / 1000`` from both ends: simulate puts
    it among its step points), ``failed(y)`` whether the system has failed (its state is then
    not a result). vmap it over systems: every field is traced but the solver and the flags.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> from meanfield.integrate import FixedStep
        >>> model = mf.models.SelfAttention(2.0)
        >>> x0 = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> stepper = FixedStep.of(model, x0, solver="euler", h=0.1)
        >>> y = stepper.init(x0)
        >>> for k in range(5):
        ...     y = stepper.grid(k, y)
        >>> traj = mf.simulate(model, x0, t1=0.5, dt=0.1, solver="euler")
        >>> bool(jnp.allclose(y[0], traj.xs[-1], atol=1e-6)), bool(stepper.failed(y))
        (True, False)
    """

    args: _Args
    h: Array
    solver: _PostStepSolver = eqx.field(static=True)
    noise: Any = None
    path: Any = None

    @classmethod
    def of(
        cls,
        model: Any,
        x: ArrayLike,
        aux: Any = None,
        *,
        solver: str = "euler",
        step: str | StepRule = "projected",
        h: RealScalarLike,
        backend: str = "auto",
        block_size: int | None = None,
        noise: Any = None,
        key: Any = None,
        t1: float | None = None,
        ts: Any = None,
        store: bool | None = None,
    ) -> FixedStep:
        """The step of ``mf.simulate(model, x, aux, solver=solver, step=step, dt=h)``; ``x``: the
        ``(n, d)`` states (or ones of their shape and dtype: for ``aux``'s default), ``h`` the
        grid's step (Mix-LN's switch tolerance ``h / 1000``; ``grid``).

        With ``noise`` (``mf.noise``): the step of ``mf.simulate(..., t1=t1, ts=ts, noise=noise,
        key=key)``, the Stratonovich Heun step driven by the same Brownian path of ``key`` (chosen
        from ``t1``, ``h`` and the save times ``ts``, default ``[0, t1]``, as simulate chooses it: the same path,
        so a loop of ``grid`` steps gives simulate's numbers); ``t1`` concrete. ``store``: whether
        a grid path keeps its increments as one array (default: up to ``_brownian.STORE_LIMIT``
        numbers) or descends its levels at each step (the same numbers; what a batch of many
        systems wants)."""
        if noise is not None:
            if t1 is None or not is_concrete(t1):
                raise TypeError("FixedStep.of(noise=...) needs the run's end time t1 (a number)")
            check_positive("t1", t1)
            run_time = RunTime(float(t1), h, solver, None, None, None, None, step=step)
            noise = _check_noise(noise, key, run_time, model)
        check_choice("solver", solver, FIXED_STEP_SOLVERS)
        check_scalar("h", h)
        if is_concrete(h):
            check_positive("h", h)
            if not np.isfinite(float(h)):
                raise ValueError(f"h must be finite, got {h!r}")
        rule = StepRule.coerce(step)
        scheme = normalization.scheme_of(model)
        geometry = geometry_of(model)
        rule.check(solver=solver, scheme=scheme, geometry=geometry)
        x = jnp.asarray(x)
        if aux is None:
            aux = model.default_aux(x.shape[-2])
        radial = normalization.uses_radius(model)
        switch = scheme.switch_at() if radial else None
        hh = jnp.asarray(h, x.dtype)
        args = _Args(
            model,
            jnp.asarray(aux),
            jnp.zeros((), x.dtype),
            block_size,
            True,
            False,
            rule.tangent,
            backend,
            radial,
            not geometry.on_sphere,
            switch_from=None if switch is None else jnp.asarray(switch, x.dtype) - 1e-3 * hh,
        )
        if noise is None:
            return cls(args, hh, _PostStepSolver(_inner_solver(solver)))
        n, d = x.shape[-2:]
        saves = np.array([0.0, float(t1)]) if ts is None else np.asarray(ts, np.float64)  # type: ignore[arg-type]
        sigma = jnp.asarray(noise.sigma, x.dtype)
        noise = eqx.tree_at(
            lambda z: z.sigma, noise, traced_nonnegative(sigma, "sigma", noise.sigma)
        )
        path = _brownian_path(
            key,
            jnp.asarray(t1, x.dtype),
            jax.ShapeDtypeStruct(noise.control_shape(n, d), x.dtype),
            _noise_steps(float(t1), h, saves, x.dtype),  # type: ignore[arg-type]
            lambda: _noise_tol(float(t1), hh, saves, x.dtype),  # type: ignore[arg-type]
            store=store,
        )
        return cls(args, hh, _PostStepStratonovich(_inner_solver(solver)), noise, path)

    def _switch(self) -> Any:
        return normalization.scheme_of(self.args.model).switch_at() if self.args.radial else None

    def init(self, x: Float[Array, "n d"]) -> _State:
        """The state ``(x, flags)`` of ``x`` (tokens with a radius: ``x = r theta``)."""
        return x, jnp.zeros(5 if self._switch() is not None else 4, x.dtype)

    def __call__(self, t0: _Time, t1: _Time, y: _State) -> _State:
        """One step of the solver from ``t0`` to ``t1``, then the post-step."""
        term: diffrax.AbstractTerm = diffrax.ODETerm(_vector_field)
        if self.noise is not None:  # simulate's SDE: the drift and the noise's term
            term = diffrax.MultiTerm(
                term, _NoiseTerm(self.noise, self.path, not self.args.euclidean)
            )
        state = self.solver.init(term, t0, t1, y, self.args)
        y1, _, _, _, _ = self.solver.step(term, t0, t1, y, self.args, state, False)
        return y1

    def _bounds(self, k: ArrayLike, dtype: Any) -> tuple[Array, Array]:
        k = jnp.asarray(k, dtype)
        return k * self.h, (k + 1) * self.h

    def _splits(self, k: ArrayLike, dtype: Any) -> Array:
        """Whether the switch time lies inside step ``k``, more than ``h / 1000`` from both ends."""
        t0, t1 = self._bounds(k, dtype)
        tau, tol = jnp.asarray(self._switch(), dtype), 1e-3 * self.h
        return (t0 + tol < tau) & (tau < t1 - tol)

    def grid(self, k: ArrayLike, y: _State) -> _State:
        """The step over ``[k h, (k + 1) h]``, split at Mix-LN's switch time when it lies inside."""
        if self._switch() is None:
            return self.whole(k, y)
        return jax.lax.cond(
            self._splits(k, y[0].dtype), lambda: self.split(k, y), lambda: self.whole(k, y)
        )

    def whole(self, k: ArrayLike, y: _State) -> _State:
        """The step over ``[k h, (k + 1) h]`` as one solver step: ``grid``'s step ``k`` for every
        ``k`` but ``split_index()``."""
        t0, t1 = self._bounds(k, y[0].dtype)
        return self(t0, t1, y)

    def split(self, k: ArrayLike, y: _State) -> _State:
        """The step over ``[k h, (k + 1) h]`` as two solver steps, to Mix-LN's switch time and from
        it: ``grid``'s step ``k = split_index()``."""
        dtype = y[0].dtype
        t0, t1 = self._bounds(k, dtype)
        tau = jnp.asarray(self._switch(), dtype)
        return self(tau, t1, self(t0, tau, y))

    def split_index(self, dtype: Any) -> Array | None:
        """The grid step that ``grid`` splits at Mix-LN's switch time (an int32 scalar, ``-1`` when
        no step is split), ``None`` for a scheme without a switch. A loop over steps that runs
        ``whole`` at every other step and ``split`` at this one gives ``grid``'s numbers without a
        ``lax.cond`` in its body."""
        switch = self._switch()
        if switch is None:
            return None
        k = jnp.floor(jnp.asarray(switch, dtype) / self.h)
        # floor(tau / h) is the step up to its rounding: the neighbours are looked at too
        found = jnp.int32(-1)
        for cand in (k - 1, k + 1, k):
            found = jnp.where(
                self._splits(cand, dtype) & (cand >= 0), cand.astype(jnp.int32), found
            )
        return found

    def failed(self, y: _State) -> Array:
        """Whether the run has failed (``FAILURES``: a non-finite state, a token through the origin)."""
        return y[1][_FAIL] > 0.5

    def directions(self, y: _State) -> Float[Array, "n d"]:
        """The tokens' directions (tokens in R^d and on the sphere: the state itself)."""
        x = y[0]
        return sphere.normalize(x) if self.args.radial else x


class _PostStepStratonovich(_PostStepSolver, diffrax.AbstractStratonovichSolver):
    """``_PostStepSolver`` of a Stratonovich solver (the Heun step of a noisy run), marked as such:
    diffrax warns about an SDE solver marked neither Ito nor Stratonovich."""


# ----------------------------------------------------------------------------
# the progress bar of simulate(progress=True)
# ----------------------------------------------------------------------------

#: Marks on the simulated time axis at which a run with ``progress=True`` reports to its bar
#: (the host is called when a step crosses one: at most about this many calls a run).
PROGRESS_MARKS = 1000

# the open bars by number (a traced argument of the run: one compilation serves every bar)
_BARS: dict[int, Any] = {}
_BARS_LOCK = threading.Lock()
_BAR_COUNT = itertools.count(1)


def _show_progress(meter: ArrayLike, t: ArrayLike) -> None:
    """Host side of ``_report_progress``: move bar ``meter`` to simulated time ``t`` (the slowest
    system of a batch)."""
    with _BARS_LOCK:
        bar = _BARS.get(int(np.asarray(meter).ravel()[0]))
        if bar is None:
            return
        t_now = min(float(np.min(t)), float(bar.total))
        if bar.n == 0:  # the first report: the run has started, the compilation is over
            bar.reset(total=bar.total)
        if t_now > bar.n:
            bar.update(t_now - bar.n)


def _report_progress(meter: Array, t0: _Time, t1: _Time, t_end: Array) -> None:
    """Call the host (``_show_progress``) when the step ``[t0, t1]`` crosses one of
    ``PROGRESS_MARKS`` marks ``k t_end / PROGRESS_MARKS``: the state is not touched, so the run's
    numbers are those of the run without a bar."""
    k0 = jnp.floor(t0 * PROGRESS_MARKS / t_end)
    k1 = jnp.floor(t1 * PROGRESS_MARKS / t_end)
    jax.lax.cond(k1 > k0, lambda: jax.debug.callback(_show_progress, meter, t1), lambda: None)


def _open_bar(t1: float) -> int:
    """A tqdm bar over simulated time ``[0, t1]`` on stderr, registered in ``_BARS``: its number."""
    import sys

    from tqdm import tqdm

    bar = tqdm(
        total=t1,
        desc="simulate",
        file=sys.stderr,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| t = {n:.4g}/{total:.4g} [{elapsed}<{remaining}]",
        mininterval=0.5,
        dynamic_ncols=True,
        disable=False,  # asked for: shown even when stderr is not a terminal
    )
    with _BARS_LOCK:
        number = next(_BAR_COUNT)
        _BARS[number] = bar
    return number


def _close_bar(number: int) -> None:
    with _BARS_LOCK:
        bar = _BARS.pop(number, None)
    if bar is not None:
        bar.close()


class Trajectory(eqx.Module):
    """Result of ``simulate``.

    Attributes:
        ts: ``(T,)`` save times.
        xs: ``(T, n, d)`` states at ``ts`` (``None`` when ``save_states=False``).
        energy: ``(T,)`` energy at ``ts`` (``None`` for models without an energy).
        collapse_gap: ``(T,)`` $G_x$ at ``ts`` (of the directions: with ``geometry="euclidean"``
            NaN while a token sits at the origin, which is not a failure of the run).
        observables: dict name -> ``(T, ...)`` user observables at ``ts``.
        stop_time: time at which the run ended (``t1`` unless stopped early or failed).
        stopped: the early-stop rule fired (saved values after ``stop_time`` repeat the
            final state's).
        failed: the state went non-finite, a token of a scheme with a radius passed through
            the origin or the solver failed (the run ends at ``stop_time``; saved values after it
            are NaN), or a saved energy, collapse gap or observable is NaN or infinite (the
            values are kept as computed); ``failure`` says which.
        num_steps: number of accepted steps.
        radius: ``(T, n)`` radii $r_i = |x_i|$ of the tokens at ``ts`` for the schemes with a
            radius (``normalization`` in ``mf.normalization.RADIAL``; ``xs`` holds the directions
            ``theta_i``), ``None`` for the others.
        failure: why the run failed, an int32 code: ``FAILURES[failure]`` is the reason (0, ``""``:
            it did not; 1: non-finite state, 2: a token through the origin, 3: the solver failed,
            4: a non-finite saved value); ``failed == (failure > 0)``. ``None`` from engines that
            record no reason.

    Example:
        >>> import jax, meanfield as mf
        >>> x0 = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> traj = mf.simulate(mf.kernels.USA(1.0), x0, t1=0.5, dt=0.1)
        >>> traj.ts.shape, traj.xs.shape, bool(traj.failed)
        ((2,), (2, 8, 3), False)
    """

    ts: Float[Array, " T"]
    xs: Float[Array, "T n d"] | None
    energy: Float[Array, " T"] | None
    collapse_gap: Float[Array, " T"]
    observables: dict
    stop_time: Float[Array, ""]
    stopped: Bool[Array, ""]
    failed: Bool[Array, ""]
    num_steps: Array
    radius: Float[Array, "T n"] | None = None
    failure: Array | None = None

    def failure_reason(self) -> str:
        """``FAILURES[failure]``: why the run failed, ``""`` when it did not (a concrete, unbatched
        trajectory).

        Example:
            >>> import jax, meanfield as mf
            >>> x0 = mf.sphere.uniform(jax.random.key(0), 4, 3)
            >>> mf.simulate(mf.kernels.USA(1.0), x0, t1=0.2, dt=0.1).failure_reason()
            ''
        """
        if self.failure is None:
            return "failed (no reason recorded)" if bool(self.failed) else ""
        return FAILURES[int(np.asarray(self.failure))]

    def to_xarray(
        self, model: Any = None, *, aux: Any = None, attrs: Mapping[str, Any] | None = None
    ) -> Any:
        """The run as an ``xarray.Dataset``, the format of a run and of a sweep point: ``x`` over
        the coordinates ``(time, token, dim)`` (``time`` = ``ts``), ``radius``, ``collapse_gap``,
        ``energy`` and every observable over ``time``, ``stop_time``, ``num_steps``,
        ``stopped``, ``failure`` and ``status`` (1 ok, 2 failed); the attributes record the
        ``model`` (its registry name and ``model.<param>`` parameters), ``n``, ``d``, the settings
        in ``attrs`` (``t1``, ``dt``, ``solver``, ...: numbers, strings, bools, lists) and the
        versions of meanfield and JAX (``meanfield._labelled``). ``aux``: the token labels, stored
        over ``token``. The arrays are this trajectory's, unchanged (a concrete, unbatched one).
        ``meanfield simulate --out DIR`` writes the same Dataset to ``DIR/run.zarr``, which
        ``mf.sweep.load`` opens.

        Example:
            >>> import jax, meanfield as mf
            >>> x0 = mf.sphere.uniform(jax.random.key(0), 8, 3)
            >>> model = mf.kernels.USA(1.0)
            >>> ds = mf.simulate(model, x0, t1=0.5, dt=0.1).to_xarray(model, attrs={"t1": 0.5})
            >>> dict(ds["x"].sizes), ds.attrs["model"], ds.attrs["model.beta"], ds.attrs["t1"]
            ({'time': 2, 'token': 8, 'dim': 3}, 'usa', 1.0, 0.5)
        """
        from ._labelled import trajectory_dataset  # an edge: xarray only when asked for

        return trajectory_dataset(self, model, aux=aux, attrs=attrs, failures=FAILURES)


def _check_times(t1: Any, dt: Any, ts: Any, solver: str, say: Spelling = say_python) -> np.ndarray:
    N = say.name
    check_scalar(N("t1"), t1)
    if not is_concrete(t1):
        raise TypeError(
            f"{N('t1')} must be concrete (a Python float: the save and step grids depend on it), not a "
            "traced value; inside jit/vmap pass it as a static argument (a traced dt is accepted)"
        )
    check_positive(N("t1"), t1)
    if dt is not None:
        check_scalar(N("dt"), dt)
    if dt is not None and not is_concrete(dt):
        if solver not in FIXED_STEP_SOLVERS:
            raise TypeError(
                f"a traced {N('dt')} needs a fixed-step solver {FIXED_STEP_SOLVERS}, got {solver!r}"
            )
        if jnp.ndim(dt) != 0:
            raise ValueError(f"{N('dt')} must be a scalar, got shape {jnp.shape(dt)}")
    elif solver in FIXED_STEP_SOLVERS or dt is not None:
        check_positive(N("dt"), dt)
    if ts is None:
        return np.array([0.0, float(t1)])
    if not is_concrete(ts):
        raise TypeError(
            f"{N('ts')} must be concrete (a list or numpy array of save times), not a traced value"
        )
    ts = np.asarray(ts, dtype=np.float64)
    if ts.ndim != 1 or ts.size == 0:
        raise ValueError(
            f"{N('ts')} must be a non-empty 1-d array of save times, got shape {ts.shape}"
        )
    if not np.all(np.isfinite(ts)) or ts.min() < 0 or ts.max() > float(t1) * (1 + 1e-12):
        raise ValueError(
            f"{N('ts')} must lie in [0, {N('t1')}] = [0, {float(t1):g}], got range "
            f"[{ts.min():g}, {ts.max():g}]"
        )
    if np.any(np.diff(ts) <= 0):
        raise ValueError(f"{N('ts')} must be strictly increasing")
    return ts


def _unset(value: Any, default: Any) -> bool:
    """``value`` is the keyword's default (not given)."""
    if value is default:
        return True
    plain = isinstance(value, (str, int, float)) and not isinstance(value, bool)
    return plain and value == default


@dataclasses.dataclass(frozen=True)
class RunTime:
    r"""A run's time: what ``mf.simulate`` integrates over and how, the one description that
    ``simulate``'s keywords, ``meanfield simulate``'s flags (``--t1 --dt --solver --saves --rtol
    --atol --early-stop --step``) and a sweep's ``[time]`` table (``Spec.run_time``) build.

    ``t1``: the final time (``> 0``, concrete); ``dt``: the fixed step (``> 0``; a traced scalar
    for the fixed-step solvers; the first step of an adaptive one, or None); ``solver``: one of
    ``SOLVERS``; ``ts``: the save times (increasing, in ``[0, t1]``; None: ``0`` and ``t1``);
    ``rtol``, ``atol``: the adaptive solvers' tolerances (both required there, refused elsewhere);
    ``early_stop``: the tolerance of the energy-plateau stop, or None; ``max_steps``: a bound on the
    steps, or None; ``step``: the step rule (``mf.steps.StepRule`` or its name).

    ``check(say)`` applies every rule of these settings with one text each, spelled as the caller's
    surface spells its settings (``meanfield._spelling``: ``ts`` in Python, ``time.save`` in a spec,
    ``--saves`` on the command line), and returns the save times.

    Example:
        >>> from meanfield.integrate import RunTime
        >>> RunTime(t1=1.0, dt=0.25, ts=[0.0, 0.5, 1.0]).check()
        array([0. , 0.5, 1. ])
        >>> try:
        ...     RunTime(t1=1.0, solver="tsit5").check()
        ... except ValueError as e:
        ...     print(e)
        solver='tsit5' is adaptive: give both rtol and atol (no silent defaults)
    """

    t1: Any
    dt: Any = 1e-2
    solver: str = "rk2"
    ts: Any = None
    rtol: Any = None
    atol: Any = None
    early_stop: Any = None
    max_steps: Any = None
    step: Any = "projected"

    @property
    def rule(self) -> StepRule:
        """The step rule as an object (``mf.steps.StepRule``)."""
        return StepRule.coerce(self.step)

    @property
    def adaptive(self) -> bool:
        """Whether the solver chooses its steps (``ADAPTIVE_SOLVERS``)."""
        return self.solver in ADAPTIVE_SOLVERS

    def replace(self, **changes: Any) -> RunTime:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def check(self, say: Spelling = say_python, *, grid: bool = True) -> np.ndarray:
        """Every rule of the settings, one text each (``say``: the surface's spelling); returns the
        save times (``[0, t1]`` when ``ts`` is None) as float64. ``grid=False`` leaves out the
        step grid's rule (``check_grid``: ``simulate`` applies it once the run's memory is
        accepted, so a run past the machine is refused for its size first)."""
        N = say.name
        check_choice(N("solver"), self.solver, SOLVERS)
        if isinstance(self.step, str):
            check_choice(N("step"), self.step, StepRule.names())
        self.rule.check(solver=self.solver, say=say)
        ts = _check_times(self.t1, self.dt, self.ts, self.solver, say)
        fixed = (
            self.solver in FIXED_STEP_SOLVERS
        )  # an adaptive solver's dt: its first step, clipped
        if (
            fixed
            and self.dt is not None
            and is_concrete(self.dt)
            and float(self.dt) > float(self.t1)
        ):
            raise ValueError(
                f"{N('dt')} = {float(self.dt):g} must be <= {N('t1')} = {float(self.t1):g}"
            )
        check_tolerances(self.solver, self.rtol, self.atol, say)
        if not self.adaptive and (self.rtol is not None or self.atol is not None):
            raise ValueError(
                f"{N('rtol')}/{N('atol')} apply to the adaptive solvers "
                f"{', '.join(ADAPTIVE_SOLVERS)}, not {say('solver', self.solver)}"
            )
        if self.early_stop is not None:
            check_scalar(N("early_stop"), self.early_stop)
            check_positive(N("early_stop"), self.early_stop)
        if self.max_steps is not None:
            check_int(N("max_steps"), self.max_steps, minimum=1)
        if grid:
            self.check_grid(ts, say)
        return ts

    def check_grid(self, ts: np.ndarray, say: Spelling = say_python) -> None:
        """``ValueError`` when the fixed-step grid of ``dt`` cannot hold the save times ``ts``
        (``step_grid_problem``; nothing to check for an adaptive solver or a traced ``dt``)."""
        if not self.adaptive and is_concrete(self.dt):
            problem = step_grid_problem(float(self.t1), float(self.dt), ts)
            if problem is not None:
                raise ValueError(f"{say.name('ts')}: {problem}")


class _UniformSteps(diffrax.AbstractStepSizeController):
    """Fixed steps of a traced length ``h`` on the grid ``k h``, landing on the save times.

    The step targets are the next grid point ``k h`` and the next save time, whichever
    comes first (the grid ``_step_grid`` builds for a concrete ``dt``, with the same
    rule for grid points within ``h / 1000`` after the current time). The grid index
    ``k`` is the controller state, so the targets are exact products ``k h`` whatever the
    step count (no ``floor(t / h)``, whose rounding in float32 reaches ``1e-3`` after
    ~4000 steps). Because ``h`` is traced, one compiled program serves every step
    length: a vmapped batch of points that share a step count runs exactly that many
    steps (``simulate`` with a traced ``dt``).
    """

    h: Array
    ts: Array
    t_end: Array
    # Mix-LN's switch time: a step point too, unless a step point lies within h / 1000 of it
    tau: Array | None = None

    def wrap(self, direction: ArrayLike) -> _UniformSteps:
        return self

    def _next(self, t: _Time, k: Array) -> tuple[Array, Array]:
        """Next grid index (skipping grid points reached or within ``h / 1000``) and target."""
        k = jnp.where(k * self.h <= t + 1e-3 * self.h, k + 1, k)
        j = jnp.searchsorted(self.ts, t, side="right")
        t_save = jnp.where(
            j < self.ts.shape[0], self.ts[jnp.minimum(j, self.ts.shape[0] - 1)], self.t_end
        )
        target = jnp.minimum(k * self.h, t_save)
        if self.tau is not None:
            tau = jnp.where(self.tau > t + 1e-3 * self.h, self.tau, self.t_end)
            target = jnp.minimum(target, tau)
        return k, jnp.minimum(target, self.t_end)

    def init(
        self,
        terms: PyTree[diffrax.AbstractTerm],
        t0: _Time,
        t1: _Time,
        y0: _State,
        dt0: _Time | None,
        args: _Args,
        func: Callable[..., Any],
        error_order: _Time | None,
    ) -> tuple[Array, Array]:
        del terms, t1, y0, dt0, args, func, error_order
        k, target = self._next(t0, jnp.zeros((), self.h.dtype))
        return target, k

    def adapt_step_size(
        self,
        t0: _Time,
        t1: _Time,
        y0: _State,
        y1_candidate: _State,
        args: _Args,
        y_error: PyTree[Array] | None,
        error_order: _Time,
        controller_state: Array,
    ) -> tuple[bool, _Time, Array, bool, Array, diffrax.RESULTS]:
        del t0, y0, y1_candidate, args, y_error, error_order
        k, target = self._next(t1, controller_state)
        # diffrax's RESULTS members are typed as str by its enumeration metaclass
        return True, t1, target, False, k, diffrax.RESULTS.successful  # type: ignore[return-value]


class _GridSteps(diffrax.AbstractStepSizeController):
    """Steps to the points of a step grid given as data: ``grid[1], grid[2], ..`` (state: the index).

    ``diffrax.StepTo`` without its runtime checks (``equinox.error_if`` on the traced grid,
    host callbacks that keep a program out of JAX's persistent cache): ``simulate`` builds
    the grid with ``_step_grid`` and checks it in Python before tracing (strictly increasing
    in the state's dtype; ``grid[0] = 0`` and ``grid[-1] = t1`` by construction). The grid is
    padded with ``t1`` to a bucketed length (``_grid_bucket``) so that nearby ``t1``/``dt``
    share a compiled program; the run ends when it reaches ``t1`` (``_simulate``'s event), so
    the padding is never stepped to. The step points, hence the numbers, are StepTo's on the
    same grid.
    """

    grid: Array
    # Mix-LN's switch time and the grid's merging tolerance (dt / 1000): the switch time is a
    # step point between two grid points further than ``tol`` from both (else the nearer grid
    # point is the switch point); ``None``: the grid alone, as before
    tau: Array | None = None
    tol: Array | None = None

    def wrap(self, direction: ArrayLike) -> _GridSteps:
        return self

    def _at(self, k: int | Array) -> Array:
        return self.grid[jnp.minimum(k, self.grid.shape[0] - 1)]

    def _target(self, t: _Time, k: Array) -> tuple[Array, Array]:
        """From time ``t`` with grid point ``k`` ahead: the next step point and the next ``k``."""
        assert self.tau is not None and self.tol is not None
        g = self._at(k)
        take = (self.tau > t + self.tol) & (self.tau < g - self.tol)
        return jnp.where(take, self.tau, g), jnp.where(take, k, k + 1)

    def init(
        self,
        terms: PyTree[diffrax.AbstractTerm],
        t0: _Time,
        t1: _Time,
        y0: _State,
        dt0: _Time | None,
        args: _Args,
        func: Callable[..., Any],
        error_order: _Time | None,
    ) -> tuple[Array, int | Array]:
        del terms, t1, y0, dt0, args, func, error_order
        if self.tau is not None:
            return self._target(t0, jnp.ones((), jnp.int32))
        return self.grid[1], 2

    def adapt_step_size(
        self,
        t0: _Time,
        t1: _Time,
        y0: _State,
        y1_candidate: _State,
        args: _Args,
        y_error: PyTree[Array] | None,
        error_order: _Time,
        controller_state: int | Array,
    ) -> tuple[bool, _Time, Array, bool, int | Array, diffrax.RESULTS]:
        del t0, y0, y1_candidate, args, y_error, error_order
        if self.tau is not None:
            target, k = self._target(t1, jnp.asarray(controller_state))
            # diffrax's RESULTS members are typed as str by its enumeration metaclass
            return True, t1, target, False, k, diffrax.RESULTS.successful  # type: ignore[return-value]
        return (
            True,
            t1,
            self._at(controller_state),
            False,
            controller_state + 1,
            # diffrax's RESULTS members are typed as str by its enumeration metaclass
            diffrax.RESULTS.successful,  # type: ignore[return-value]
        )


def _grid_bucket(n: int) -> int:
    """Padded length of a step grid of ``n`` points: the next power of two (at least 16).

    Every grid of ``n`` in ``(2^(k-1), 2^k]`` points -- ``t1 / dt`` within a factor of 2 --
    reuses one compiled program; the padding costs ``< n`` floats and no steps.
    """
    return max(16, 1 << (int(n) - 1).bit_length())


def _grid_argument(grid: np.ndarray, t1: float, dt: float, dtype: DTypeLike) -> np.ndarray:
    """The step grid as the compiled program's argument: cast to ``dtype``, checked, padded with ``t1``.

    Raises ``ValueError`` when two step points coincide in ``dtype`` (``dt`` or the distance
    of a save time to a step point below the resolution of ``dtype`` at that time), which
    ``diffrax.StepTo`` reported at run time.
    """
    g = np.asarray(grid, dtype=dtype)
    same = np.flatnonzero(np.diff(g) <= 0)
    if same.size:
        i = int(same[0])
        raise ValueError(
            f"the step grid (dt={dt:g} merged with ts) has points {float(grid[i]):.17g} and "
            f"{float(grid[i + 1]):.17g} that coincide in {np.dtype(dtype).name} (its resolution at "
            f"t = {float(grid[i]):g} is {float(np.spacing(np.abs(g[i]))):.3g}): use a larger dt, save times "
            f"further from the step points, or float64 states"
        )
    pad = np.full(_grid_bucket(len(g)) - len(g), np.asarray(t1, dtype=dtype), dtype=dtype)
    return np.concatenate([g, pad])


def _merged(points: np.ndarray, dt: float, t1: float) -> np.ndarray:
    """``points`` (sorted, unique, ending at ``t1``) less the points closer than ``dt / 1000`` to
    their predecessor (rounding duplicates of a step and a save time), ``t1`` kept."""
    keep = np.concatenate([[True], np.diff(points) > dt * 1e-3])
    grid = points[keep]
    grid[-1] = t1
    return grid


def _wanted(t1: float, dt: float, ts: np.ndarray, steps: np.ndarray) -> np.ndarray:
    return np.union1d(steps, np.append(np.asarray(ts, dtype=np.float64), t1))


def step_grid_problem(t1: float, dt: float, ts: np.ndarray) -> str | None:
    """Why the fixed-step grid of ``dt`` merged with the save times ``ts`` cannot honour them,
    or ``None``: the grid keeps one point of each run of points closer than ``dt / 1000`` to
    their predecessor (rounding duplicates of a step and a save time), so save times closer
    than that to each other would remove step points too and the run would take steps longer
    than ``dt`` (100,002 save times on [0, 1] with ``dt = 0.01`` left one step). The rule of
    ``simulate``, the CLI and a sweep's ``[time]`` alike; O(len(ts)) whatever ``t1 / dt``
    (runs of close points hold save times and the step points next to them, nothing else)."""
    t1, dt = float(t1), float(dt)
    ts = np.asarray(ts, dtype=np.float64)
    k = int(np.floor(t1 / dt + 1e-9))
    j = np.floor(ts / dt)
    near = np.unique(np.concatenate([j - 1, j, j + 1, j + 2, [0.0, float(k)]]))
    near = near[(near >= 0) & (near <= k)]
    wanted = _wanted(t1, dt, ts, near * dt)
    grid = _merged(wanted, dt, t1)
    tol = dt * 1e-3
    # every step point and save time of these within dt/1000 of a point the grid keeps
    i = np.clip(np.searchsorted(grid, wanted), 1, max(len(grid) - 1, 1))
    gap = np.minimum(
        np.abs(wanted - grid[i - 1]), np.abs(grid[np.minimum(i, len(grid) - 1)] - wanted)
    )
    lost = np.flatnonzero(gap > tol)
    if lost.size == 0:
        return None
    close = np.diff(ts)
    spacing = float(close[close > 0].min()) if np.any(close > 0) else 0.0
    return (
        f"{len(ts)} save times as close as {spacing:.3g} apart are closer than dt / 1000 = "
        f"{tol:.3g} to each other: the step grid of dt = {dt:g} cannot hold them ({lost.size} "
        f"step and save points would be dropped and steps would exceed dt); save at most every "
        f"dt / 1000 or use a smaller dt"
    )


def check_tolerances(solver: str, rtol: object, atol: object, say: Spelling = say_python) -> None:
    """An adaptive solver needs both ``rtol`` and ``atol``, each a positive scalar (no silent
    defaults; ``say``: the caller's spelling). Nothing is checked for a fixed-step solver here:
    ``RunTime.check`` refuses tolerances given to one. ``simulate``'s rule, which front ends (the CLI)
    apply before their estimate is printed, so a bad command line is one line."""
    if solver not in ADAPTIVE_SOLVERS:
        return
    if rtol is None or atol is None:
        raise ValueError(
            f"{say('solver', solver)} is adaptive: give both {say.name('rtol')} and "
            f"{say.name('atol')} (no silent defaults)"
        )
    for name, tol in (("rtol", rtol), ("atol", atol)):
        check_scalar(say.name(name), tol)
        check_positive(say.name(name), tol)


def uniform_saves_problem(t1: float, dt: float, saves: int) -> str | None:
    """``step_grid_problem`` of ``saves`` evenly spaced save times on ``[0, t1]`` without making
    them: the problem when their spacing ``t1 / (saves - 1)`` is at most ``dt / 1000`` (then the
    grid would drop step and save points), else ``None`` (``step_grid_problem`` of the save times
    decides the rest). O(1) memory: for a front end (``meanfield simulate --saves``) before it
    allocates the save times.

    Example:
        >>> uniform_saves_problem(0.1, 0.01, 101) is None, uniform_saves_problem(0.1, 0.01, 10**8)[:40]
        (True, '100000000 save times 1e-09 apart are clo')
    """
    t1, dt, saves = float(t1), float(dt), int(saves)
    if saves < 2:
        return None
    spacing, tol = t1 / (saves - 1), dt * 1e-3
    if spacing > tol:
        return None
    return (
        f"{saves} save times {spacing:.3g} apart are closer than dt / 1000 = {tol:.3g} to each "
        f"other: the step grid of dt = {dt:g} cannot hold them (step and save points would be "
        f"dropped and steps would exceed dt); save at most every dt / 1000 or use a smaller dt"
    )


def _step_grid(t1: float, dt: float, ts: np.ndarray) -> np.ndarray:
    """Uniform grid ``0, dt, 2 dt, ..`` up to ``t1``, merged with the save times; ``ValueError``
    when it cannot hold them (``step_grid_problem``)."""
    problem = step_grid_problem(t1, dt, ts)
    if problem is not None:
        raise ValueError(problem)
    k = int(np.floor(t1 / dt + 1e-9))
    return _merged(_wanted(t1, dt, ts, np.arange(k + 1) * dt), dt, t1)


def simulate(
    model: Any,
    x0: ArrayLike,
    aux: Any = None,
    *,
    t1: RealScalarLike | None = None,
    dt: RealScalarLike | None = 1e-2,
    solver: str = "rk2",
    ts: Any = None,
    rtol: RealScalarLike | None = None,
    atol: RealScalarLike | None = None,
    observables: Mapping[str, Any] | None = None,
    save_states: bool = True,
    early_stop: RealScalarLike | None = None,
    max_steps: Any = None,
    block_size: Any = None,
    adjoint: diffrax.AbstractAdjoint | None = None,
    backend: str | None = None,
    step: str | StepRule = "projected",
    r0: ArrayLike | None = None,
    progress: bool = False,
    time: RunTime | None = None,
    noise: Any = None,
    key: Any = None,
    frequencies: Any = None,
) -> Trajectory:
    r"""Integrate $d x_i / dt = P_{x_i} F_i$ on $(S^{d-1})^n$ from ``x0``.

    A model's ``normalization`` (``mf.normalization``) regulates the speed: Pre-, Mix- and
    Peri-LN give each token a radius ($x_i = r_i \theta_i$, ``r0``, ``Trajectory.radius``),
    nGPT and LN-scaling stay on the sphere. ``SelfAttention(geometry="euclidean")`` integrates
    the tokens in $\mathbb R^d$ without projection.

    Args:
        model: a kernel (``mf.kernels``) or a model (``mf.models.SelfAttention``).
        x0: ``(n, d)`` floating initial state with unit rows, validated like the states of
            ``mf.energy`` (``from meanfield.energy import check_states``: finite, rows within 1e-3
            of the sphere); any finite tokens for ``geometry="euclidean"`` (``SelfAttention``: the
            unprojected flow $\dot x_i = F_i(x)$ in $\mathbb R^d$, saved as they are).
        aux: ``(n,)`` labels; ``None`` means ``mf.positions(n)`` (prompt blocks for ``Prompt``).
        t1: final time (``> 0``; or ``time``).
        dt: step of the fixed-step solvers (``> 0``); initial step for adaptive ones. A
            traced scalar (e.g. a beta-dependent step inside ``vmap``) is accepted by the
            fixed-step solvers: one compilation serves every step length, the grid is
            ``k dt`` merged with ``ts``, and ``max_steps`` must bound the step count.
        solver: ``"euler"``, ``"rk2"`` (projected Heun), ``"rk4"``, ``"tsit5"``, ``"dopri5"``,
            ``"heun"`` (Heun's step with adaptive steps: its embedded Euler step is the error estimate).
        ts: save times in ``[0, t1]``, increasing (default ``[0, t1]``). Steps land on them
            (and on Mix-LN's ``switch_time``, where the scheme switches, unless a step point lies
            within ``dt / 1000`` of it: that step point is the switch point; for the adaptive
            solvers the switch time is a jump of the field, stepped to the float before it);
            a save time within ``dt / 1000`` of a step point is that step point, and save times
            closer than ``dt / 1000`` to each other are refused (``ValueError``: the grid could
            not hold them without steps longer than ``dt``; ``step_grid_problem``).
            Save times, ``t1`` and the fixed-step grid are data, arguments of the compiled
            program (never constants folded into it): a new ``ts`` of the same length, or
            another ``t1`` whose step grid pads to the same length (the next power of two
            of the number of step points: ``t1 / dt`` within a factor of 2), reuses the
            compilation; long or logarithmic ``ts`` cost no more to compile than short ones
            of the same length.
        rtol, atol: required for the adaptive solvers, refused for the fixed-step ones.
        observables: dict name -> ``f(x) -> array`` evaluated at ``ts`` on the state (the
            directions $\theta$; the tokens in $\mathbb R^d$ for ``geometry="euclidean"``); a
            callable with a parameter named ``radius`` also gets the ``(n,)`` radii (models with a
            radius only), one named ``t`` the save time (e.g. ``lambda x, t: model.rescaled_states(x, t)``).
        save_states: store ``xs`` (``(T, n, d)``); ``False`` keeps only observables.
        early_stop: tolerance of the paper's rule (relative energy increment over a
            window of length 1, App. B.1), e.g. ``1e-8``; ``None`` (default) is off.
        max_steps: cap on steps, an int ``>= 1`` (with a traced ``dt``: ``t1 / dt + len(ts)``,
            plus 1 for Mix-LN's switch time); ``None`` (the default) means the padded grid
            length + 1 for fixed steps (at least the step count), 100000 for adaptive ones
            (``0`` is an error, not the default). A run that needs more steps ends early with
            ``failed`` set.
        block_size: row tile of the field evaluation for large ``n``.
        adjoint: a diffrax adjoint (default ``RecursiveCheckpointAdjoint``) for gradients.
        backend: the exp-kernel evaluation of the field and energy (``mf.kernels.BACKENDS``):
            ``"auto"`` (the fused C kernel where it was measured faster on this machine),
            ``"native"`` (the fused C kernel on the CPU; an error where it cannot run) or
            ``"xla"``; ``None`` (default): the enclosing ``mf.kernels.use_backend``, else
            ``"auto"``. A static argument of the compiled run.
        step: ``"projected"`` (default: every solver integrates the tangent field $P_x F$) or
            ``"renormalize"`` (``solver="euler"`` only: $x \leftarrow \operatorname{normalize}(x + h F(x))$
            with the unprojected ``model.field``, the published code's update; see the module docstring),
            or a step rule object (``mf.steps.StepRule``: ``Projected()``, ``Renormalize()``, a
            registered rule of your own).
        r0: initial radii of a model whose tokens carry one (``normalization`` in
            ``mf.normalization.RADIAL``: ``"pre"``, ``"mix"``, ``"peri"``), a
            scalar or ``(n,)``, every entry finite and within ``r0_range(x0.dtype)`` (float32:
            ``[3.1e-16, 6.4e15]``; ``ValueError`` outside it); ``None``: 1. The state is
            $x_i = r_i \theta_i$ with $\theta_i$ = ``x0[i]``.
        progress: show a tqdm bar over simulated time $[0, t_1]$ on stderr while the run executes
            (default ``False``). The run reports to the host only when a step crosses one of
            ``PROGRESS_MARKS`` marks $k\, t_1 / \text{PROGRESS\_MARKS}$ (a host callback under a
            ``lax.cond``; the state is untouched): the numbers are bit for bit those of the run
            without a bar. ``simulate`` then returns once the run has finished (the bar is closed);
            ``x0`` must be concrete (a call outside ``jit``/``vmap``: ``TypeError`` otherwise). One
            more compilation: the program with the callback.
        time: the run's time as one object (``RunTime``: ``t1``, ``dt``, ``solver``, ``ts``,
            ``rtol``, ``atol``, ``early_stop``, ``max_steps``, ``step``), instead of those
            keywords (``TypeError`` when both are given): what a sweep's ``[time]`` table
            (``Spec.run_time``) and ``meanfield simulate``'s flags build. Either way the same rules
            apply (``RunTime.check``).
        noise: a ``mf.noise.Noise`` (``Independent(sigma)``, ``Common(sigma)``): the run is the
            Stratonovich SDE $dx = v(x)\,dt + $ the noise's increment (tangent on the sphere),
            integrated by the Heun step (``solver="rk2"``: fixed steps; ``"heun"``: adaptive, along
            a ``diffrax.VirtualBrownianTree`` of resolution $t_1 2^{-20}$ revisiting rejected step
            times) along a Brownian path of ``key`` on $[0, t_1]$: when ``dt`` is a number
            dividing $t_1$ and every save time is on the grid, the grid path of
            ``meanfield._brownian`` (one normal a step, a Lévy construction over the grid: the runs
            with $N$ and $2N$ steps read one path); else a ``diffrax.VirtualBrownianTree``
            (resolution at most a quarter of the shortest step, a dyadic fraction of $t_1$:
            ``_noise_tol``); each
            step ending with the projection as without noise (``mf.noise``; docs/math/noise.md).
            ``sigma`` may be traced (vmap, grad). What a noise refuses is its own check
            (``Noise.check``: other solvers, tokens with a radius, ``step="renormalize"``);
            ``early_stop`` is refused (a stationary energy is a deterministic notion).
        key: the ``jax.random`` key of the noise's Brownian motion (required with ``noise``,
            refused without it): the same key, ``t1``, ``dt`` and save times give the same path, bit
            for bit, also under ``vmap`` over keys (the grid path, or the tree when a save time is off
            the grid or ``dt`` is traced: another path of the same law). An adaptive run
            (``"heun"``) is reproduced bit for bit by the same compiled program only
            (docs/math/noise.md, "Adaptive steps").
        frequencies: natural frequencies, the field gains $\Omega_i x_i$: ``(n,)`` angular
            velocities $\omega_i$ in ``d = 2`` ($\Omega_i = \omega_i J$, $J$ the rotation by
            $+\pi/2$) or ``(n, d, d)`` skew-symmetric matrices (a rotation of each token, tangent
            to the sphere); traced values are accepted (vmap over draws). Refused for tokens with a
            radius and with ``early_stop`` (the energy is no longer a Lyapunov function).

    Returns:
        ``Trajectory`` with ``.ts``, ``.xs``, ``.energy``, ``.collapse_gap``,
        ``.observables``, ``.stop_time``, ``.stopped``, ``.failed``, ``.num_steps``, ``.radius``,
        ``.failure`` (why it failed: ``FAILURES``; module docstring).

    Before anything of the run's size is allocated, its memory is estimated from the shapes
    (``meanfield._resources.run_cost``, the estimate of ``meanfield simulate``: step grid, saved
    states and observables, the field's working set; concrete even under ``jit``/``vmap``, where
    it counts one system) and a run that needs more than this machine has available is refused
    (``ResourceLimitError``, a ``ValueError``). A traced ``dt`` is counted by ``max_steps``.

    jit- and vmap-compatible in ``x0`` and in the model's traced parameters: a
    ``vmap`` over seeds and ``beta`` compiles once. Concrete bad values raise ``ValueError``
    or ``TypeError`` (wrong types: a bool ``t1``, a vector ``dt``, ``save_states=1``; step
    points that coincide in the state's dtype) before tracing; traced ones (states off the
    sphere or non-finite, ``beta <= 0``, prompt labels out of range) stop the program with
    an ``equinox.error_if`` error naming them.

    Example:
        >>> import jax, meanfield as mf
        >>> x0 = mf.sphere.uniform(jax.random.key(0), 32, 3)
        >>> traj = mf.simulate(mf.kernels.USA(1.0), x0, t1=1.0, dt=0.1)
        >>> traj.xs.shape, bool(traj.energy[-1] >= traj.energy[0])
        ((2, 32, 3), True)
    """
    if time is None:
        if t1 is None:
            raise TypeError("simulate needs the final time t1 (or time=RunTime(...))")
        time = RunTime(t1, dt, solver, ts, rtol, atol, early_stop, max_steps, step)
    else:
        if not isinstance(time, RunTime):
            raise TypeError(f"time must be a meanfield.integrate.RunTime, got {time!r}")
        given = dict(t1=t1, dt=dt, solver=solver, ts=ts, rtol=rtol, atol=atol)
        given.update(early_stop=early_stop, max_steps=max_steps, step=step)
        defaults = dict(t1=None, dt=1e-2, solver="rk2", step="projected")
        twice = [k for k, v in given.items() if not _unset(v, defaults.get(k))]
        if twice:
            raise TypeError(
                f"simulate takes the run's time once: time=RunTime(...) or {twice[0]}= and the "
                f"other keywords, not both"
            )
    ts_np = time.check(grid=False)  # every rule of the run's time (RunTime: one text each)
    t1, dt, solver, ts = time.t1, time.dt, time.solver, time.ts
    rtol, atol, early_stop, max_steps = time.rtol, time.atol, time.early_stop, time.max_steps
    rule = time.rule
    backend = _entry_backend(backend)
    x0, aux = check_states(model, x0, aux, "x0")
    radial = normalization.uses_radius(model)
    geometry = geometry_of(model)
    euclidean = not geometry.on_sphere
    rule.check(scheme=normalization.scheme_of(model), geometry=geometry)
    if euclidean and early_stop is not None:
        raise TypeError("early_stop needs an energy on the sphere; geometry='euclidean' has none")
    noise = _check_noise(noise, key, time, model)
    omega = _check_frequencies(frequencies, x0, normalization.scheme_of(model), time)
    x0 = _initial_radius(model, x0, r0) if radial else _no_radius(model, r0, x0)
    save_states = check_flag("save_states", save_states)
    progress = check_flag("progress", progress)
    if progress and not is_concrete(x0):
        raise TypeError(
            "progress=True shows a bar while the run executes: call simulate outside jit/vmap "
            "(x0 is a traced value)"
        )
    if max_steps is not None:
        max_steps = check_int("max_steps", max_steps, minimum=1)
    if block_size is not None:
        block_size = check_int("block_size", block_size, minimum=1)
    has_energy = isinstance(model, Kernel) and bool(model.has_energy)  # a masked kernel has none
    if early_stop is not None and not has_energy:
        why = energy_problem(model.mask) if isinstance(model, Kernel) else None
        raise TypeError(
            f"early_stop needs an energy; {type(model).__name__} has none"
            + (f" ({why})" if why is not None else "")
        )
    adaptive = time.adaptive
    if observables is not None and not isinstance(observables, Mapping):
        raise TypeError(
            f"observables must be a dict name -> callable x -> array, got {observables!r}"
        )
    if adjoint is not None and not isinstance(adjoint, diffrax.AbstractAdjoint):
        raise TypeError(
            f"adjoint must be a diffrax adjoint (e.g. diffrax.RecursiveCheckpointAdjoint()), got {adjoint!r}"
        )
    observables = dict(observables or {})
    for name, fn in observables.items():
        if not isinstance(name, str):
            raise TypeError(f"observable names must be strings, got {name!r}")
        if not callable(fn):
            raise TypeError(f"observable {name!r} must be a callable x -> array, got {fn!r}")
        if _takes(fn, "radius") and not radial:
            raise TypeError(
                f"observable {name!r} reads the radius, but {type(model).__name__} with "
                f"normalization={normalization.scheme_of(model).name!r} has none "
                f"(schemes with a radius: {', '.join(normalization.radial_names())})"
            )

    _check_memory(
        model,
        x0,
        t1=float(t1),
        dt=dt,
        saves=int(ts_np.shape[0]),
        solver=solver,
        save_states=save_states,
        observables=len(observables),
        max_steps=max_steps,
        block_size=block_size,
        noise=0 if noise is None else math.prod(noise.control_shape(*x0.shape[-2:])),
    )
    time.check_grid(ts_np)  # the step grid's rule, once the run's size is accepted
    t1f = float(t1)
    h_traced = None  # traced fixed step (``_UniformSteps``)
    grid_tol = None  # the grid's merging tolerance dt / 1000 (Mix-LN's switch point)
    if adaptive:
        grid = None
        dt0 = float(dt) if dt is not None else None
        steps = int(max_steps or 100_000)
    elif not is_concrete(dt):
        if max_steps is None:
            raise ValueError("a traced dt needs max_steps (a bound on t1 / dt + len(ts))")
        grid, dt0, h_traced = None, None, jnp.asarray(dt, x0.dtype)
        steps = int(max_steps)
    else:
        dtf = float(cast(float, dt))
        grid = _grid_argument(_step_grid(t1f, dtf, ts_np), t1f, dtf, x0.dtype)
        if radial and normalization.scheme_of(model).switch_at() is not None:
            grid_tol = np.asarray(dtf * 1e-3, x0.dtype)
        dt0 = None
        # the bucketed grid length, not the step count: one program serves nearby t1 / dt
        steps = int(max_steps or grid.shape[0] + 1)
    # Python numbers in the model become arrays: a loop over beta (or lam, omega, ...)
    # then reuses one compilation instead of retracing on each static float.
    model = jax.tree.map(
        lambda leaf: (
            jnp.asarray(leaf)
            if isinstance(leaf, (int, float)) and not isinstance(leaf, bool)
            else leaf
        ),
        model,
    )
    meter = _open_bar(t1f) if progress else None
    try:
        traj = _simulate(
            model,
            x0,
            aux,
            jnp.asarray(early_stop if early_stop is not None else 0.0, x0.dtype),
            h_traced,
            # save times, end time and step grid are data (arguments of the compiled program,
            # never constants that XLA folds): one compilation per length of ts. filter_jit traces
            # NumPy arrays: _simulate's body sees JAX arrays (the casts say so to the type checker)
            cast(Array, np.asarray(ts_np, x0.dtype)),
            cast(Array, np.asarray(t1f, x0.dtype)),
            cast(Array | None, grid),
            cast(Array | None, grid_tol),
            solver=solver,
            dt0=dt0,
            rtol=rtol,
            atol=atol,
            observables=tuple(sorted(observables.items())),
            save_states=save_states,
            early_stop=early_stop is not None,
            max_steps=steps,
            block_size=block_size,
            has_energy=has_energy,
            adjoint=adjoint if adjoint is not None else diffrax.RecursiveCheckpointAdjoint(),
            tangent=rule.tangent,
            backend=backend,
            radial=radial,
            euclidean=euclidean,
            meter=None if meter is None else jnp.asarray(meter, jnp.int32),
            noise=None if noise is None else _traced_floats(noise, x0.dtype),
            key=key,
            noise_tol=None
            if noise is None
            else (
                jnp.asarray(t1f * 2.0**-ADAPTIVE_NOISE_LEVELS, x0.dtype)
                if adaptive
                else _noise_tol(t1f, dt, ts_np, x0.dtype)
            ),
            noise_steps=None
            if noise is None or adaptive
            else _noise_steps(t1f, dt, ts_np, x0.dtype),
            omega=omega,
        )
        if meter is not None:  # the bar lives as long as the run: wait for its end
            jax.block_until_ready(traj)
    finally:
        if meter is not None:
            _close_bar(meter)
    return traj


#: Runs whose estimate (``_resources.run_cost``) stays below this many bytes skip the memory
#: check (which reads the machine's memory from /proc): 64 MiB.
_MEMORY_CHECK_BYTES = 1 << 26


def _check_memory(
    model: Any,
    x0: Array,
    *,
    t1: float,
    dt: Any,
    saves: int,
    solver: str,
    save_states: bool,
    observables: int,
    max_steps: int | None,
    block_size: int | None,
    noise: int = 0,
) -> None:
    """The resource guard of ``meanfield simulate`` for the Python API: ``ResourceLimitError`` (a
    ``ValueError``, one line) when the run's estimated memory (``_resources.run_cost`` from the
    shapes, which are always concrete, even under ``jit``/``vmap``: one system) exceeds the memory
    available on this machine, before the step grid or the saved trajectory is allocated. No
    arithmetic limit (a long run is the user's choice); a traced ``dt`` is counted by its
    ``max_steps`` bound."""
    from . import _resources

    n, d = int(x0.shape[0]), int(x0.shape[1])
    adaptive = solver in ADAPTIVE_SOLVERS
    step_grid = not adaptive and is_concrete(dt)
    if step_grid:
        dtf = float(cast(float, dt))
    else:  # a traced dt runs at most max_steps steps (required), an adaptive solver the same
        dtf = t1 / float(max_steps or 100_000)
    footprint = getattr(model, "footprint", None)
    fp = (
        footprint(n, d, block_size=block_size)
        if callable(footprint)
        else _resources.Footprint(3.0 * n * n, float(n * n))
    )
    cost = _resources.run_cost(
        n=n,
        d=d,
        t1=t1,
        dt=dtf,
        saves=saves,
        itemsize=int(np.dtype(x0.dtype).itemsize),
        solver=solver,
        footprint=fp,
        save_states=save_states,
        observables=observables + 2,  # the collapse gap and the energy beside the user's
        clusters=False,
        step_grid=step_grid,
        max_steps=max_steps,
        noise=noise,
    )
    if cost.bytes < _MEMORY_CHECK_BYTES:
        return
    _resources.check_cost(cost, what="simulate", max_work=float("inf"), force_hint=None)


def _takes(fn: Callable[..., Any], name: str) -> bool:
    """Whether an observable declares a parameter ``name`` (``radius``, ``t``: then passed by keyword)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def _no_radius(model: Any, r0: Any, x0: Array) -> Array:
    if r0 is not None:  # called for the models whose tokens carry no radius
        takes = getattr(model, "normalization", None) is not None
        raise ValueError(
            radius_problem(
                normalization.scheme_of(model).name if takes else None,
                normalization.radial_names(),
                type(model).__name__,
            )
        )
    return x0


def r0_range(dtype: DTypeLike) -> tuple[float, float]:
    r"""The initial radii ``r0`` that states of ``dtype`` carry: $[\sqrt{\text{tiny} / \epsilon},
    \sqrt{\text{max}\, \epsilon}]$ with the dtype's smallest normal number, largest number and
    machine epsilon: the squared radius $r^2$ (what the norms of the engine compute) keeps a
    margin of $1 / \epsilon$ from underflow and overflow, room for a sum over $d$ coordinates
    and for the radius to grow or shrink during a run. Float32: about ``[3.1e-16, 6.4e15]``;
    float64: about ``[1e-146, 2e146]``. ``simulate(r0=)`` and ``sa_phase_diagram(r0=)`` refuse
    radii outside it (``ValueError``).

    Example:
        >>> import numpy as np
        >>> lo, hi = r0_range(np.float32)
        >>> f"{lo:.2g} {hi:.2g}"
        '3.1e-16 6.4e+15'
    """
    info = np.finfo(np.dtype(dtype))
    tiny, big, eps = float(info.tiny), float(info.max), float(info.eps)
    return float(np.sqrt(tiny / eps)), float(np.sqrt(big * eps))


def check_r0(r0: Any, dtype: DTypeLike) -> None:
    """``ValueError`` unless every concrete radius in ``r0`` is finite and within ``r0_range(dtype)``
    (one line naming ``r0``, the value and the range)."""
    rn = np.asarray(r0, dtype=float)
    lo, hi = r0_range(dtype)
    ok = np.isfinite(rn) & (rn >= lo) & (rn <= hi)
    if not np.all(ok):
        bad = float(rn[~ok].ravel()[0])
        raise ValueError(
            f"every radius r0 must be finite and > 0, in [{lo:.2g}, {hi:.2g}] for "
            f"{np.dtype(dtype).name} states (r0_range), got {bad!r}"
        )


def _initial_radius(model: Any, x0: Array, r0: Any) -> Array:
    """``r0[:, None] * x0``: the state ``x_i = r_i theta_i``, after checking ``r0``."""
    if r0 is None:
        return x0
    if isinstance(r0, (str, bytes, bool)):
        raise TypeError(f"r0 must be a positive number or an (n,) array of them, got {r0!r}")
    r = jnp.asarray(r0)
    if not jnp.issubdtype(r.dtype, jnp.number) or jnp.issubdtype(r.dtype, jnp.complexfloating):
        raise TypeError(f"r0 must be real, got dtype {r.dtype}")
    n = x0.shape[0]
    if r.ndim > 1 or (r.ndim == 1 and r.shape[0] != n):
        raise ValueError(
            f"r0 must be a scalar or have shape ({n},) (one radius per token), got shape {r.shape}"
        )
    if is_concrete(r):
        check_r0(r0, x0.dtype)  # the values as given, before a cast to the state's dtype
    else:
        lo, hi = r0_range(x0.dtype)
        r = eqx.error_if(
            r,
            ~jnp.all(jnp.isfinite(r) & (r >= lo) & (r <= hi)),
            f"r0: every radius must be finite and > 0, in [{lo:.2g}, {hi:.2g}] for "
            f"{np.dtype(x0.dtype).name} states (r0_range)",
        )
    return jnp.broadcast_to(r.astype(x0.dtype), (n,))[:, None] * x0


def _traced_floats(tree: Any, dtype: Any) -> Any:
    """The Python numbers of ``tree`` (a noise's ``sigma``: a declared float, given as ``1`` too) as
    arrays of ``dtype``: traced, one compilation for all values."""
    return jax.tree.map(
        lambda leaf: (
            jnp.asarray(leaf, dtype)
            if isinstance(leaf, (int, float)) and not isinstance(leaf, bool)
            else leaf
        ),
        tree,
    )


def _check_noise(noise: Any, key: Any, time: RunTime, model: Any) -> Any:
    """``simulate``'s rules for ``noise`` and ``key`` (the noise's own refusals: ``Noise.check``)."""
    from .noise import Noise  # noise imports nothing of the engine's: no cycle, loaded when used

    if noise is None:
        if key is not None:
            raise TypeError(
                "key= drives the noise's Brownian motion: give noise= too "
                "(mf.noise.Independent(sigma) or Common(sigma)); a deterministic run takes no key"
            )
        return None
    if not isinstance(noise, Noise):
        raise TypeError(
            f"noise must be a meanfield.noise.Noise (mf.noise.Independent(sigma), "
            f"mf.noise.Common(sigma)), got {noise!r}"
        )
    noise.check(
        solver=time.solver,
        scheme=normalization.scheme_of(model),
        step=time.rule,
        early_stop=time.early_stop,
    )
    if key is None:
        raise TypeError(
            f"noise={noise!r} needs key= (a jax.random key, e.g. jax.random.key(0)): the same key "
            f"gives the same path"
        )
    typed = hasattr(key, "dtype") and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    raw = hasattr(key, "shape") and tuple(key.shape) == (2,) and key.dtype == jnp.uint32
    if not (typed and tuple(key.shape) == ()) and not raw:
        raise TypeError(
            f"key must be one jax.random key (jax.random.key(seed); vmap over a batch of keys), "
            f"got {key!r}"
        )
    return noise


def _check_frequencies(frequencies: Any, x0: Array, scheme: Any, time: RunTime) -> Array | None:
    """``simulate``'s rules for ``frequencies``: the ``(n, d, d)`` skew matrices, or None."""
    if frequencies is None:
        return None
    from .frequencies import check_run  # the rule of every surface

    n, d = x0.shape
    check_run(scheme=scheme, early_stop=time.early_stop)
    if isinstance(frequencies, (str, bytes, bool)):
        raise TypeError(f"frequencies must be an array, got {frequencies!r}")
    w = jnp.asarray(frequencies)
    if not jnp.issubdtype(w.dtype, jnp.floating) and not jnp.issubdtype(w.dtype, jnp.integer):
        raise TypeError(f"frequencies must be real, got dtype {w.dtype}")
    w = w.astype(x0.dtype)
    if is_concrete(w) and not bool(jnp.all(jnp.isfinite(w))):
        raise ValueError("frequencies must be finite")
    if w.shape == (n,):
        if d != 2:
            raise ValueError(
                f"frequencies of shape (n,) are angular velocities in d = 2; in d = {d} give "
                f"(n, d, d) = ({n}, {d}, {d}) skew-symmetric matrices"
            )
        J = jnp.array([[0.0, -1.0], [1.0, 0.0]], x0.dtype)
        return w[:, None, None] * J
    if w.shape != (n, d, d):
        raise ValueError(
            f"frequencies must have shape ({n},) (d = 2) or ({n}, {d}, {d}), got {w.shape}"
        )
    if is_concrete(w):
        asym = float(jnp.max(jnp.abs(w + jnp.swapaxes(w, 1, 2))))
        scale = float(jnp.max(jnp.abs(w))) or 1.0
        if asym > 1e-6 * scale:
            raise ValueError(
                f"frequencies must be skew-symmetric matrices (Omega^T = -Omega), got "
                f"max |Omega + Omega^T| = {asym:.3g}"
            )
        return w
    return 0.5 * (w - jnp.swapaxes(w, 1, 2))  # traced: its skew part (a rotation, whatever given)


def _noise_tol(t1: float, dt: Any, ts: np.ndarray, dtype: Any) -> Array:
    r"""The Brownian tree's resolution: $t_1 2^{-m}$ with $m = \lceil \log_2 (4 t_1 / h) \rceil$, $h$
    the shortest step of the run (``dt``, or shorter where a save time off the step grid cuts a step:
    the step points are ``0, dt, 2 dt, ..`` merged with ``ts``). At most a quarter of every step
    (diffrax's advice: two step points never share the tree's finest interval, where the path is
    interpolated), and for the steps ``dt = t1 / 2^j`` with saves on the grid every step point is a
    dyadic point of the tree, so the runs of one key and ``t1`` read one path (to rounding: the
    value at a dyadic point is summed level by level), the path a strong-order fit needs. A traced
    ``dt`` too: ``h`` and ``m`` are computed in the program."""
    step = jnp.asarray(dt, dtype)
    saves = np.unique(np.concatenate([[0.0], np.asarray(ts, np.float64), [t1]]))
    h = step
    if saves.size > 1:  # saves closer to each other than a step
        h = jnp.minimum(h, jnp.asarray(np.diff(saves).min(), dtype))
    r = jnp.mod(jnp.asarray(saves, dtype), step)  # a save inside a grid step cuts it in two
    for part in (r, step - r):
        h = jnp.minimum(h, jnp.min(jnp.where(part > 1e-3 * step, part, jnp.inf)))
    m = jnp.maximum(0.0, jnp.ceil(jnp.log2(4.0 * t1 / h) - 1e-6))
    return jnp.asarray(t1 * jnp.exp2(-m), dtype)


#: The Brownian tree of an adaptive noisy run: resolution ``t1 * 2^-ADAPTIVE_NOISE_LEVELS`` (steps
#: shorter than it read the tree's bridge interpolation), and the rejected step times it revisits.
ADAPTIVE_NOISE_LEVELS = 20
ADAPTIVE_NOISE_REJECTED = 16


def _noise_steps(t1: float, dt: Any, ts: Any, dtype: Any = np.float64) -> int | None:
    """The step count ``N`` of a run whose step points are the grid ``k t_1 / N`` (a concrete ``dt``
    dividing ``t_1``, every save time on the grid): its noise is ``_brownian.GridBrownianPath``;
    ``None`` otherwise (a traced ``dt``, a save time off the grid: the virtual Brownian tree)."""
    if not is_concrete(dt):
        return None
    dtf = float(dt)
    saves = np.asarray(ts, np.float64)
    if step_grid_problem(t1, dtf, saves) is not None:
        return None  # simulate raises its error about the grid
    return _brownian.grid_steps(t1, dtf, _step_grid(t1, dtf, saves), dtype)


def _brownian_path(
    key: Any,
    t1: Array,
    shape: jax.ShapeDtypeStruct,
    steps: int | None,
    tol: Callable[[], Any],
    store: bool | None = None,
) -> diffrax.AbstractBrownianPath:
    """The noise's Brownian path on ``[0, t1]``: the grid path of ``steps`` steps
    (``_brownian.GridBrownianPath``: one normal per step) or, without a grid, diffrax's virtual
    Brownian tree of resolution ``tol()`` (``_noise_tol``)."""
    if steps is not None:
        return _brownian.GridBrownianPath(key, t1, steps, shape, store=store)
    return diffrax.VirtualBrownianTree(
        jnp.zeros((), shape.dtype), t1, tol=tol(), shape=shape, key=key
    )


class _NoiseTerm(diffrax.AbstractTerm):
    """The noise's term of the SDE: ``prod(vf, dW)`` is the noise's increment of the state
    (``Noise.increment``, at the state's directions on the sphere), zero for the flags."""

    noise: Any
    path: diffrax.AbstractPath
    on_sphere: bool = eqx.field(static=True)

    def vf(self, t: _Time, y: _State, args: Any) -> _State:
        return y  # the increment depends on the state through prod (linear in the control)

    def contr(self, t0: _Time, t1: _Time, **kwargs: Any) -> Any:
        # clamped to the path's interval: under vmap the adaptive loop also steps the lanes that have
        # ended (past t1, results discarded), where the Brownian tree would raise its range error
        lo, hi = self.path.t0, self.path.t1
        return self.path.evaluate(jnp.clip(t0, lo, hi), jnp.clip(t1, lo, hi), **kwargs)

    def prod(self, vf: _State, control: Any) -> _State:
        x, flags = vf
        xh = sphere.normalize(x) if self.on_sphere else x
        return self.noise.increment(xh, control, self.on_sphere), jnp.zeros_like(flags)


@eqx.filter_jit
def _simulate(
    model: Any,
    x0: Float[Array, "n d"],
    aux: Array,
    tol: Float[Array, ""],
    h_traced: Float[Array, ""] | None,
    ts_arr: Float[Array, " T"],
    t1: Float[Array, ""],
    grid: Float[Array, " grid"] | None,
    grid_tol: Float[Array, ""] | None = None,
    *,
    solver: str,
    dt0: float | None,
    rtol: RealScalarLike | None,
    atol: RealScalarLike | None,
    observables: tuple[tuple[str, Callable[..., Any]], ...],
    save_states: bool,
    early_stop: bool,
    max_steps: int,
    block_size: int | None,
    has_energy: bool,
    adjoint: diffrax.AbstractAdjoint,
    tangent: bool,
    backend: str,
    radial: bool = False,
    euclidean: bool = False,
    meter: Array | None = None,
    noise: Any = None,
    key: Any = None,
    noise_tol: Array | None = None,
    noise_steps: int | None = None,
    omega: Array | None = None,
) -> Trajectory:
    dtype = x0.dtype
    adaptive = solver in ADAPTIVE_SOLVERS
    # Mix-LN's switch time is a step point (the controllers below): the switch falls on it
    switch = normalization.scheme_of(model).switch_at() if radial else None
    mix = switch is not None
    tau = jnp.asarray(switch, dtype) if mix else None
    switch_from = None
    if tau is not None:
        if adaptive:
            switch_from = jnp.nextafter(tau, jnp.asarray(-jnp.inf, dtype))
        elif h_traced is not None:
            switch_from = tau - 1e-3 * h_traced
        else:
            assert grid_tol is not None  # simulate passes the grid's tolerance for Mix-LN
            switch_from = tau - grid_tol
    args = _Args(
        model,
        aux,
        tol,
        block_size,
        not adaptive,
        early_stop,
        tangent,
        backend,
        radial,
        euclidean,
        meter,
        None if meter is None else t1,
        switch_from,
        omega,
    )
    E0 = _energy(args, sphere.normalize(x0)).astype(dtype) if early_stop else jnp.zeros((), dtype)
    # the switch flag only for Mix-LN: adaptive step control measures every state entry, flags too
    flags0 = jnp.zeros(5 if mix else 4, dtype).at[_E_REF].set(E0)
    y0 = (x0, flags0)

    def save_fn(t: _Time, y: _State, args: _Args) -> dict[str, Array]:
        theta = sphere.normalize(y[0])
        x = y[0] if euclidean else theta  # the tokens in R^d, or their directions
        out = {"collapse_gap": metrics.collapse_gap(theta), "_flags": y[1]}
        extra: dict[str, Any] = {}
        if radial:
            extra["radius"] = out["radius"] = jnp.linalg.norm(y[0], axis=-1)
        if has_energy:
            out["energy"] = _energy(args, x)
        if save_states:
            out["xs"] = x
        for name, fn in observables:
            kw = {k: v for k, v in (*extra.items(), ("t", t)) if _takes(fn, k)}
            v = jnp.asarray(fn(x, **kw))
            # diffrax pre-fills unreached saves with inf: keep observables floating
            out["obs:" + name] = v if jnp.issubdtype(v.dtype, jnp.inexact) else v.astype(dtype)
        return out

    if adaptive:
        assert rtol is not None and atol is not None  # simulate requires both
        # steps land on the save times and on t1 (the run's end, below diffrax's horizon);
        # NumPy scalar tolerances were traced by filter_jit: JAX arrays here
        # and Mix-LN's switch time is a jump of the field: the step before it ends on the float
        # before it (``switch_from``), the next one starts after it with a fresh first stage
        # (an FSAL solver would otherwise carry the Post-LN field over the switch)
        controller = diffrax.ClipStepSizeController(
            diffrax.PIDController(rtol=cast(_Time, rtol), atol=cast(_Time, atol)),
            step_ts=jnp.append(ts_arr, t1),
            jump_ts=None if tau is None else tau[None],
            # a noisy run (non-commuting noise fields on the sphere) revisits the times of its
            # rejected steps, else the rejections bias the law (diffrax's condition for adaptive SDEs)
            store_rejected_steps=None if noise is None else ADAPTIVE_NOISE_REJECTED,
        )
    elif h_traced is not None:
        controller = _UniformSteps(h_traced, ts_arr, t1, tau)
    else:
        assert grid is not None  # a concrete dt: simulate built the grid
        controller = _GridSteps(grid, tau, grid_tol)
    # The run ends at the traced t1 by the event (every controller lands on t1 exactly).
    # diffrax's own end time is a static horizon that is never reached: from a traced t1,
    # diffrax would compute its end-clipping threshold (t1 less 100 ulps, a chain of 100
    # nextafter) in the program, about a second more of XLA compilation.
    event = diffrax.Event(
        lambda t, y, args, **kw: (y[1][_STOP] > 0.5) | (y[1][_FAIL] > 0.5) | (t >= t1)
    )
    terms: diffrax.AbstractTerm = diffrax.ODETerm(_vector_field)
    if noise is not None:  # Stratonovich SDE: the drift and the noise's term, one Brownian path
        n, d = x0.shape
        # a traced sigma < 0 or not finite: the error (or, under EQX_ON_ERROR=nan, a failed run)
        sigma = jnp.asarray(noise.sigma)
        noise = eqx.tree_at(
            lambda z: z.sigma, noise, traced_nonnegative(sigma, "sigma", noise.sigma)
        )
        path = _brownian_path(
            key,
            t1,
            jax.ShapeDtypeStruct(noise.control_shape(n, d), dtype),
            noise_steps,
            lambda: noise_tol,
        )
        terms = diffrax.MultiTerm(terms, _NoiseTerm(noise, path, not euclidean))
    wrap = _PostStepSolver if noise is None else _PostStepStratonovich
    sol = diffrax.diffeqsolve(
        terms,
        wrap(_inner_solver(solver)),
        t0=0.0,
        t1=float(jnp.finfo(dtype).max),
        dt0=dt0,
        y0=y0,
        args=args,
        saveat=diffrax.SaveAt(ts=ts_arr, t1=True, fn=save_fn),
        stepsize_controller=controller,
        event=event,
        max_steps=max_steps,
        adjoint=adjoint,
        throw=False,
    )
    # With an event, diffrax writes the terminal (t1) save right after the last reached
    # ts save and leaves the remaining slots at inf: locate it.
    last = jnp.sum(jnp.isfinite(sol.ts)) - 1
    t_end = sol.ts[last]
    reached = ts_arr <= t_end + 1e-9 * jnp.maximum(1.0, jnp.abs(t_end))
    saved = dict(sol.ys)
    flags_end = saved.pop("_flags")[last]
    final = jax.tree.map(lambda a: a[last], saved)
    solver_failed = (sol.result != diffrax.RESULTS.successful) & (
        sol.result != diffrax.RESULTS.event_occurred
    )
    code = jnp.round(flags_end[_FAIL]).astype(jnp.int32)  # _post_step's failure code
    failure = jnp.where(code > 0, code, jnp.where(solver_failed, _SOLVER_FAILED, 0))
    failed = failure > 0
    stopped = (flags_end[_STOP] > 0.5) & ~failed
    fill = jax.tree.map(
        lambda f: jnp.where(failed, jnp.nan, f) if jnp.issubdtype(f.dtype, jnp.inexact) else f,
        final,
    )
    ys = jax.tree.map(
        lambda a, f: jnp.where(
            reached.reshape((-1,) + (1,) * (a.ndim - 1)), a[: ts_arr.shape[0]], f[None]
        ),
        saved,
        fill,
    )
    # a non-finite saved value (energy, gap, observable, state) is a failed run, never a result;
    # but for tokens in R^d the collapse gap, an observable of directions, is NaN while a token
    # sits at the origin (it has none): not a failure of the run
    nonfinite = [
        ~jnp.all(jnp.isfinite(v))
        for name, v in ys.items()
        if jnp.issubdtype(v.dtype, jnp.inexact) and not (euclidean and name == "collapse_gap")
    ]
    bad_save = functools.reduce(jnp.logical_or, nonfinite, jnp.zeros((), bool))
    failure = jnp.where((failure == 0) & bad_save, _SAVED_NONFINITE, failure).astype(jnp.int32)
    failed = failure > 0
    return Trajectory(
        ts=ts_arr,
        xs=ys.get("xs"),
        energy=ys.get("energy"),
        collapse_gap=ys["collapse_gap"],
        observables={k[4:]: v for k, v in ys.items() if k.startswith("obs:")},
        stop_time=t_end,
        stopped=stopped,
        failed=failed,
        num_steps=sol.stats["num_accepted_steps"],
        radius=ys.get("radius"),
        failure=failure,
    )
