r"""The sweep kind ``"continuum"``: the mean-field density solver (``mf.continuum.solve``) as a
model of the sweep engine, a grid over ``beta`` and the initial mode perturbation.

Each point starts from ``rho_0 (1 + eps Y_mode)`` (``mf.continuum.mode_perturbation``: ``cos(mode
theta)`` on the circle, the zonal Legendre polynomial on S^2), solves the continuity equation
to ``t1`` and records the measured growth rate of the perturbed mode::

    growth_rate = log(a(t_k) / a(0)) / t_k,      a = mf.continuum.mode_amplitude(rho, d, mode),

``t_k`` the last save time with a valid density (all of them unless the solver stopped), beside
the dispersion relation ``theory_rate = mf.continuum.growth_rates(beta, d, mode)``. In the linear
regime (``|eps| e^{lambda t_k} << 1``) the two agree to ``O((eps e^{lambda t_k})^2)`` plus the
solver's tolerance. The solver is deterministic: a spec has no seeds (the store has no ``seed``
dimension). ``resolution`` and ``d`` are static (one compilation per ``(d, resolution)``),
``beta``, ``mode`` and ``eps`` are traced (``vmap``-ed); ``t1`` and the save times are the same
for every point (a traced ``t1`` per point would put diffrax's checks of the save times inside
the ``vmap``, where equinox's error callback breaks under the scoped ``enable_x64`` of a float64
sweep). Across a ``beta`` grid the original-time rates differ by orders of magnitude; with
``model.rescaled = true`` (usa) times and rates are per unit of ``s = e^beta t`` and the fastest
rate, ``max_l e^{-beta} lambda_l``, stays between 0.09 and 0.21 for ``beta`` in [1, 9] (d = 2).

This module is used by ``spec``, ``plan``, ``run`` and ``plot``; it holds the kind's schema,
program, estimates and figure.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np

from .._resources import Cost
from .spec import PointProgram, Spec, SweepKind, register_kind

__all__ = [
    "KIND",
    "OBSERVABLES",
    "parse",
    "point_program",
    "point_memory",
    "cost",
    "output_layout",
    "plot",
    "DESCRIPTIONS",
    "Continuum",
    "CONTINUUM",
]

#: The model kind of the density solver in a spec (``[model] kind = "continuum"``).
KIND = "continuum"
#: Observables of a continuum point (``[output] observables``).
OBSERVABLES = (
    "growth_rate",
    "theory_rate",
    "mass_drift",
    "min_density",
    "spectral_tail",
    "amplitude",
)
_DEFAULT_OBSERVABLES = ["growth_rate", "theory_rate", "mass_drift", "min_density"]

_MODEL_KEYS = ("kind", "model", "rescaled")
_GRID_KEYS = ("d", "resolution", "beta", "mode", "eps")
_TIME_KEYS = ("t1", "save", "rtol", "atol", "dt", "tail_tol", "max_steps")
_OUTPUT_KEYS = ("observables",)

#: Descriptions of the data variables of a continuum store.
DESCRIPTIONS = {
    "growth_rate": "measured growth rate log(a(t_k)/a(0))/t_k of the perturbed mode (a = mode_amplitude)",
    "theory_rate": "dispersion relation mf.continuum.growth_rates(beta, d, mode)",
    "mass_drift": "max |mass(t) - mass(0)| / mass(0) over the valid save times",
    "min_density": "min of the density over the grid and the valid save times",
    "spectral_tail": "largest spectral tail over the valid save times (resolution-loss indicator)",
    "amplitude": "mode amplitude a(t) = mode_amplitude(rho(t), d, mode) at the save times",
    "stop_time": "time at which the solver stopped (t1 unless resolution was lost or the run failed)",
    "num_steps": "accepted solver steps",
    "solver_status": "mf.continuum status: 0 ok, 1 resolution_lost, 2 failed",
}

_MAX_SAVES = 10**6
_MAX_RESOLUTION = 4096


def parse(
    raw: dict, *, name: str, description: str, dtype: str, text: str, spec_type: type[Spec]
) -> Spec:
    """The ``Spec`` of a continuum sweep from the TOML dictionary ``raw`` (schema in docs/sweeps.md).

    Raises ``ValueError``/``TypeError`` (one line) for unknown keys (listing the accepted ones),
    keys of particle sweeps (``n``, ``seeds``, ``solver``, ...) and invalid values. ``spec_type``
    is ``spec.Spec`` (passed in, so that this module does not import ``spec``).
    """
    from .._params import check_float as _float
    from .._params import check_int as _int
    from .._params import check_keys as _unknown

    model = dict(raw.get("model", {}))
    _unknown("model", model, _MODEL_KEYS)
    from .. import continuum as mfc

    mf_model = model.get("model", "usa")
    zonal = mfc.zonal_models()  # the models with a zonal profile (Model.zonal_profile)
    if mf_model not in zonal:
        raise ValueError(
            f"unknown model.model {mf_model!r} for kind 'continuum'; accepted: "
            + ", ".join(map(repr, zonal))
        )
    rescaled = model.get("rescaled", False)
    if not isinstance(rescaled, bool):
        raise TypeError(f"model.rescaled must be true or false, got {rescaled!r}")
    profile = mfc.model_profile(mf_model, False)
    if rescaled and not profile.rescalable:
        with_form = [n for n in zonal if mfc.model_profile(n, False).rescalable]
        why = (
            "the normalised field needs no rescaling" if profile.normalized else "no rescaled form"
        )
        raise ValueError(
            f"model.rescaled applies to {', '.join(f'model = {n!r}' for n in with_form)} only ({why})"
        )

    grid = dict(raw.get("grid", {}))
    for key, why in (
        ("n", "a density has no particles: give grid.resolution (the band-limit L)"),
        ("seeds", "the density solver is deterministic: remove it (the store has no seed axis)"),
        ("seed", "the density solver is deterministic: remove it (the store has no seed axis)"),
    ):
        if key in grid:
            raise ValueError(f"grid.{key} does not apply to kind 'continuum': {why}")
    _unknown("grid", grid, _GRID_KEYS)
    for key in ("beta", "mode"):
        if key not in grid:
            raise ValueError(
                f"[grid] needs {key} for kind 'continuum' (a number or a list: a grid axis)"
            )

    def int_list(key: str, minimum: int, maximum: int) -> tuple[list[int], bool]:
        v = grid[key]
        is_list = isinstance(v, list)
        vals = v if is_list else [v]
        if not vals:
            raise ValueError(
                f"grid.{key} must be an integer or a non-empty list of integers, got []"
            )
        out = [
            _int(f"grid.{key}[{i}]" if is_list else f"grid.{key}", x, minimum, maximum)
            for i, x in enumerate(vals)
        ]
        if len(set(out)) != len(out):
            raise ValueError(f"grid.{key} values must be distinct, got {v!r}")
        return out, is_list

    grid.setdefault("d", 2)
    grid.setdefault("resolution", 16)
    ds, d_axis = int_list("d", 2, 3)
    resolutions, res_list = int_list("resolution", 4, _MAX_RESOLUTION)
    modes, _ = int_list("mode", 1, 2**31 - 1)
    if max(modes) >= min(resolutions):
        raise ValueError(
            f"grid.mode {max(modes)} must be < grid.resolution = {min(resolutions)} (the evolved modes are 0..L-1)"
        )

    def float_list(key: str, check: Callable[[str, Any], float]) -> tuple[list[float], bool]:
        v = grid[key]
        is_list = isinstance(v, list)
        vals = v if is_list else [v]
        if not vals:
            raise ValueError(f"grid.{key} must be a number or a non-empty list of numbers, got []")
        out = []
        for i, x in enumerate(vals):
            w = f"grid.{key}[{i}]" if is_list else f"grid.{key}"
            out.append(check(w, x))
        if len(set(out)) != len(out):
            raise ValueError(f"grid.{key} values must be distinct, got {v!r}")
        return out, is_list

    betas, _ = float_list("beta", lambda w, x: _float(w, x, "float>0"))
    limit = mfc.model_profile(mf_model, rescaled).overflow_limit(dtype)
    if limit is not None:
        if max(betas) >= limit:
            raise ValueError(
                f"grid.beta = {max(betas):g} overflows e^beta in {dtype} (limit about {limit:.0f}); "
                "set model.rescaled = true (rates and times per unit of s = e^beta t)"
            )

    def eps_check(w: str, x: object) -> float:
        e = _float(w, x)
        if not 0 < abs(e) < 1:
            raise ValueError(f"{w} must satisfy 0 < |eps| < 1 (a positive density), got {x!r}")
        return e

    grid.setdefault("eps", 1e-3)
    eps, eps_axis = float_list("eps", eps_check)

    tsec = raw.get("time")
    if tsec is None:
        raise ValueError("[time] with t1 is required for kind 'continuum'")
    if not isinstance(tsec, dict):
        raise TypeError(f"[time] must be a table, got {tsec!r}")
    if "solver" in tsec or "step_rule" in tsec or "early_stop" in tsec:
        bad = next(k for k in ("solver", "step_rule", "early_stop") if k in tsec)
        raise ValueError(
            f"time.{bad} does not apply to kind 'continuum' (diffrax Tsit5, adaptive unless time.dt); "
            f"accepted keys: {', '.join(_TIME_KEYS)}"
        )
    _unknown("time", tsec, _TIME_KEYS)
    if "t1" not in tsec:
        raise ValueError(
            "[time] needs t1 (the final time of every point; per unit of s = e^beta t when rescaled)"
        )
    t_max = _float("time.t1", tsec["t1"], "float>0")
    save = tsec.get("save", 11)
    unit = f"times in [0, t1 = {t_max:g}]"
    if isinstance(save, list):
        if len(save) > _MAX_SAVES:
            raise ValueError(f"time.save lists {len(save)} times, more than {_MAX_SAVES}")
        ts = np.asarray([_float(f"time.save[{i}]", v, "float>=0") for i, v in enumerate(save)])
        if ts.size < 2 or np.any(np.diff(ts) <= 0) or ts.max() > t_max:
            raise ValueError(f"time.save must be at least two increasing {unit}, got {save!r}")
    else:
        ts = np.linspace(0.0, t_max, _int("time.save", save, 2, _MAX_SAVES))
    time_spec: dict = {"t1": t_max, "save": ts.tolist()}
    time_spec["rtol"] = _float("time.rtol", tsec.get("rtol", 1e-6), "float>0")
    time_spec["atol"] = _float("time.atol", tsec.get("atol", 1e-8), "float>0")
    time_spec["tail_tol"] = _float("time.tail_tol", tsec.get("tail_tol", 1e-4), "float>0")
    time_spec["max_steps"] = _int("time.max_steps", tsec.get("max_steps", 20_000), 1, 2**31 - 1)
    if "dt" in tsec:
        dt = _float("time.dt", tsec["dt"], "float>0")
        if dt > t_max:
            raise ValueError(f"time.dt = {dt:g} must be <= t1 = {t_max:g}")
        time_spec["dt"] = dt

    out = dict(raw.get("output", {}))
    for key in ("cluster_threshold", "top_k"):
        if key in out:
            raise ValueError(
                f"output.{key} does not apply to kind 'continuum'; accepted keys: observables"
            )
    _unknown("output", out, _OUTPUT_KEYS)
    obs = out.get("observables", _DEFAULT_OBSERVABLES)
    if not isinstance(obs, list) or not obs or not all(isinstance(o, str) for o in obs):
        raise TypeError(f"output.observables must be a non-empty list of names, got {obs!r}")
    for o in obs:
        if o not in OBSERVABLES:
            raise ValueError(
                f"unknown observable {o!r} for kind 'continuum'; accepted: {', '.join(OBSERVABLES)}"
            )
    if len(set(obs)) != len(obs):
        raise ValueError(f"output.observables has duplicates: {obs!r}")

    axes: dict[str, np.ndarray] = {
        "beta": np.asarray(betas, np.float64),
        "mode": np.asarray(modes, np.int64),
    }
    if eps_axis:
        axes["eps"] = np.asarray(eps, np.float64)
    params: dict = {"model": mf_model, "rescaled": rescaled, "eps": eps if eps_axis else eps[0]}
    data = {
        "name": name,
        "description": description,
        "dtype": dtype,
        "model": {"kind": KIND, "model": mf_model, "rescaled": rescaled},
        "grid": {
            "d": ds if d_axis else ds[0],
            "resolution": resolutions if res_list else resolutions[0],
            "beta": betas,
            "mode": modes,
            "eps": params["eps"],
        },
        "time": time_spec,
        "output": {"observables": list(obs)},
    }
    return spec_type(
        text=text,
        data=data,
        name=name,
        kinds=(KIND,),
        kinds_axis=False,
        dtype=dtype,
        params=params,
        n=tuple(resolutions),
        d=tuple(ds),
        d_axis=d_axis,
        beta_rule=None,
        beta_power=None,
        axes=axes,
        seeds=np.arange(1),
        time=time_spec,
        ts=ts,
        observables=tuple(obs),
        cluster_threshold=0.1,
        top_k=1,
    )


def point_program(spec: Spec, L: int, d: int) -> PointProgram:
    """``f(params, seed) -> dict of outputs`` of one continuum point at band-limit ``L`` on
    ``S^{d-1}``; ``params`` holds ``beta``, ``mode`` and (when swept) ``eps``; ``seed`` is unused
    (the solver is deterministic)."""
    import jax
    import jax.numpy as jnp

    from .. import continuum as mfc
    from . import store

    dtype = jnp.dtype(spec.dtype)
    T = cast(dict, spec.time)
    model, rescaled = spec.params["model"], spec.params["rescaled"]
    g = mfc.grid(d, L, dtype=dtype)
    save = np.asarray(spec.ts)
    t1, ts, step = T["t1"], jnp.asarray(save, dtype), T.get("dt")
    # the dispersion relation over the (beta, mode) axes, evaluated here (eagerly) and looked up
    # per point: traced inside this program, growth_rates' scipy callback fails under the scoped
    # enable_x64 of a float64 sweep ("Incorrect output dtype ... float32", jax 0.10)
    betas, modes = np.asarray(spec.axes["beta"], np.float64), np.asarray(spec.axes["mode"])
    with jax.ensure_compile_time_eval():
        table = np.asarray(
            mfc.growth_rates(betas[:, None], d, modes, model=model, rescaled=rescaled)
        )
    betas_c, modes_c, table_c = (
        jnp.asarray(a) for a in (betas.astype(dtype), modes.astype(np.int32), table.astype(dtype))
    )

    def prog(params: dict[str, Any], seed: Any) -> dict[str, Any]:
        del seed
        beta = params["beta"].astype(dtype)
        ell = jnp.round(params["mode"]).astype(jnp.int32)
        eps = (
            params["eps"].astype(dtype)
            if "eps" in params
            else jnp.asarray(spec.params["eps"], dtype)
        )
        rho0 = mfc.mode_perturbation(g, ell, eps)
        sol = mfc.solve(
            beta,
            rho0,
            d=d,
            t1=t1,
            ts=ts,
            model=model,
            resolution=L,
            rescaled=rescaled,
            rtol=T["rtol"],
            atol=T["atol"],
            dt=step,
            tail_tol=T["tail_tol"],
            max_steps=T["max_steps"],
            force=True,
        )  # the plan has checked the cost of the whole sweep (_continuum.cost)
        amp = jax.vmap(lambda r: mfc.mode_amplitude(r, d, ell))(sol.densities)
        a0 = mfc.mode_amplitude(rho0, d, ell)
        valid = jnp.isfinite(amp) & (sol.ts > 0)
        k = jnp.max(jnp.where(valid, jnp.arange(save.size), -1))
        kk = jnp.maximum(k, 0)
        rate = jnp.where(k >= 0, jnp.log(amp[kk] / a0) / sol.ts[kk], jnp.nan)
        mass0 = jnp.sum(g.weights * rho0)
        out = {
            "growth_rate": rate,
            "theory_rate": table_c[
                jnp.argmin(jnp.abs(betas_c - beta)), jnp.argmin(jnp.abs(modes_c - ell))
            ],
            "mass_drift": jnp.nanmax(jnp.abs(sol.mass - mass0)) / mass0,
            "min_density": jnp.nanmin(sol.min_density),
            "spectral_tail": jnp.nanmax(sol.tail),
            "amplitude": amp,
        }
        out = {o: out[o].astype(dtype) for o in spec.observables}
        out["stop_time"] = sol.t_stop.astype(dtype)
        out["num_steps"] = jnp.asarray(sol.num_steps, jnp.int32)
        out["solver_status"] = sol.status.astype(jnp.int8)
        ok = (sol.status != mfc.FAILED) & jnp.isfinite(rate)
        out["status"] = jnp.where(ok, store.OK, store.FAILED).astype(jnp.int8)
        return out

    return prog


def _grid_points(L: int, d: int) -> tuple[int, int]:
    """Nodes of the density grid and of the product grid (band-limit ``ceil(3 L / 2)`` on S^2)."""
    if d == 2:
        return 3 * L, 3 * L
    L2 = -(-3 * L // 2)
    return L * (2 * L - 1), L2 * (2 * L2 - 1)


def point_memory(spec: Spec, L: int, d: int) -> int:
    r"""Estimated peak bytes of one continuum point inside a vmapped chunk: Tsit5's 7 stages and
    the controller's copies of the ``2 x`` (real, imaginary) coefficient state, the transform
    work arrays on the product grid (complex), and the saved densities ``T x grid``."""
    b = 8 if spec.dtype == "float64" else 4
    G, G2 = _grid_points(L, d)
    saves = len(cast(np.ndarray, spec.ts))
    return b * (2 * 16 * G + 2 * 8 * G2 + saves * (G + 8)) + 4096


def cost(spec: Any, L: int, d: int, batch: int, point_bytes: int) -> Cost:
    r"""``Cost`` of ``batch`` points: ``mf.continuum.solve_cost`` (steps = ``max_steps`` or ``t1 / dt``,
    7 stages of the right-hand side a step, and on S^2 building ``s2fft``'s transform kernels once),
    with the plan's ``point_bytes`` per point plus the shared transform kernels. ``spec``: a
    ``Spec``, or any object with its ``time``, ``ts`` and ``dtype``."""
    from .. import continuum as mfc

    T = cast(dict, spec.time)
    saves = len(cast(np.ndarray, spec.ts))
    itemsize = 8 if spec.dtype == "float64" else 4
    c = mfc.solve_cost(
        d,
        L,
        t1=T["t1"],
        dt=T.get("dt"),
        max_steps=int(T["max_steps"]),
        saves=saves,
        itemsize=itemsize,
        batch=batch,
    )
    kernels = mfc._sht_kernel_bytes(d, L, itemsize)
    return Cost(
        steps=c.steps, saves=saves, bytes=point_bytes * batch + kernels, work=c.work, batch=batch
    )


def output_layout(spec: Spec) -> dict[str, tuple[str, ...]]:
    """Data variable -> trailing dimensions (``amplitude`` over ``time``, the others none)."""
    out: dict[str, tuple[str, ...]] = {
        o: (("time",) if o == "amplitude" else ()) for o in spec.observables
    }
    out["stop_time"] = ()
    out["num_steps"] = ()
    out["solver_status"] = ()
    return out


def plot(ds: Any, out_dir: Path) -> list[Path]:
    """Heatmaps over ``(beta, mode)``: the measured growth rate, the theory and their ratio
    (other dimensions at their first value, named in the title); with ``amplitude``, the mode
    amplitude against time, one curve per mode, at the first ``beta``."""
    from matplotlib.figure import Figure

    from .plot import save_figure
    from .store import OK

    paths = []
    ok = ds["status"] == OK
    rest = [d for d in ds["status"].dims if d not in ("beta", "mode")]
    sel = {d: 0 for d in rest}
    note = ", ".join(f"{d}={ds[d].values[0]}" for d in rest if d in ds.coords)
    if "growth_rate" in ds and "theory_rate" in ds:
        meas = ds["growth_rate"].where(ok).isel(sel).transpose("mode", "beta").values.astype(float)
        theo = ds["theory_rate"].where(ok).isel(sel).transpose("mode", "beta").values.astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = meas / theo
        fig = Figure(figsize=(13, 4))
        axs = fig.subplots(1, 3)
        betas, modes = ds["beta"].values, ds["mode"].values
        both = np.concatenate([meas.ravel(), theo.ravel()])
        both = both[np.isfinite(both)]
        lo, hi = (float(both.min()), float(both.max())) if both.size else (0.0, 1.0)
        per = " per unit of s = e^beta t" if ds.attrs.get("model.rescaled") else ""
        for ax, vals, title in (
            (axs[0], meas, f"measured growth rate{per}"),
            (axs[1], theo, "theory: mf.continuum.growth_rates"),
            (axs[2], ratio, "measured / theory"),
        ):
            if vals is ratio:  # centred on 1, symmetric
                dev = np.nanmax(np.abs(ratio - 1)) if np.any(np.isfinite(ratio)) else 0.0
                dev = max(float(dev), 1e-6)
                im = ax.imshow(
                    vals, origin="lower", aspect="auto", cmap="coolwarm", vmin=1 - dev, vmax=1 + dev
                )
            else:  # one colour scale for the measurement and the theory
                im = ax.imshow(
                    vals, origin="lower", aspect="auto", cmap="viridis", vmin=lo, vmax=hi
                )
            ax.set_xticks(range(len(betas)), [f"{b:.3g}" for b in betas], rotation=45, fontsize=7)
            ax.set_yticks(range(len(modes)), [str(int(m)) for m in modes], fontsize=7)
            ax.set_xlabel("beta")
            ax.set_ylabel("mode")
            ax.set_title(title, fontsize=9)
            fig.colorbar(im, ax=ax)
        fig.suptitle(
            f"{ds.attrs.get('sweep_name', '')}: growth rate over (beta, mode)"
            + (f" ({note})" if note else ""),
            fontsize=10,
        )
        fig.tight_layout()
        p = out_dir / "growth_rate_heatmap_beta_mode.png"
        save_figure(fig, p)
        paths.append(p)
    if "amplitude" in ds:
        tdim = "time"
        amp = ds["amplitude"].where(ok).isel(sel).isel(beta=0)
        fig = Figure(figsize=(5, 3.6))
        ax = fig.subplots()
        t = ds[tdim].values
        for j, m in enumerate(ds["mode"].values):
            ax.semilogy(t, amp.isel(mode=j).values, label=f"mode={int(m)}")
        ax.set_xlabel(tdim)
        ax.set_ylabel("mode amplitude")
        ax.set_title(
            f"amplitude (beta={float(ds['beta'].values[0]):.3g}"
            + (f", {note}" if note else "")
            + ")",
            fontsize=9,
        )
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out_dir / "amplitude_vs_time.png"
        save_figure(fig, p)
        paths.append(p)
    return paths


class Continuum(SweepKind):
    """The density solver over ``(beta, mode, eps)`` (``[model] kind = "continuum"``): the
    functions of this module as a sweep kind. No seeds; the size axis is the band-limit
    ``resolution``."""

    name: ClassVar[str] = KIND
    summary: ClassVar[str] = "the density solver"
    size_axis: ClassVar[str] = "resolution"
    seeded: ClassVar[bool] = False
    listable: ClassVar[bool] = False
    descriptions: ClassVar[dict[str, str]] = DESCRIPTIONS

    def spec_names(self) -> tuple[str, ...]:
        return (KIND,)

    def parse(
        self,
        raw: dict,
        *,
        kinds: tuple[str, ...],
        kinds_axis: bool,
        name: str,
        description: str,
        dtype: str,
        text: str,
    ) -> Spec:
        return parse(
            raw, name=name, description=description, dtype=dtype, text=text, spec_type=Spec
        )

    def point_memory(self, spec: Spec, model: str, n: int, d: int) -> int:
        return point_memory(spec, n, d)

    def cost(self, spec: Spec, model: str, n: int, d: int, batch: int, point_bytes: int) -> Cost:
        return cost(spec, n, d, batch, point_bytes)

    def point_program(self, spec: Spec, model: str, n: int, d: int) -> PointProgram:
        return point_program(spec, n, d)

    def output_layout(self, spec: Spec) -> dict[str, tuple[str, ...]]:
        return output_layout(spec)

    def point_store_bytes(self, spec: Spec) -> int:
        b = 8 if spec.dtype == "float64" else 4
        saves = len(cast(np.ndarray, spec.ts))
        return sum(saves if t else 1 for t in output_layout(spec).values()) * b + 1

    def attr_name(self, param: str) -> str:
        return f"grid.{param}" if param == "eps" else f"model.{param}"

    def plot(self, ds: Any, out_dir: Path) -> list[Path] | None:
        return plot(ds, out_dir)


#: The kind object (registered).
CONTINUUM = register_kind(Continuum())
