# ruff: noqa: B023  (closures are called immediately inside each loop iteration)
"""``python -m benchmarks.derivatives [--quick] [--repeats N] [--rounds R] [--dtype D] [--out FILE]``:
derivatives of the USA energy and velocity through meanfield's native kernel, its XLA path, plain
JAX and PyTorch autograd.

Operations (beta = 1, every seed of a batch at once: ``jax.vmap`` in JAX, a batched formula in
torch): ``grad(energy)``; ``jvp(velocity)`` along a random direction; the Hessian-vector product
``jvp(grad(energy))`` (forward over reverse, what ``mf.analysis`` runs); ``grad`` of a linear loss
of the final state of a 100-step ``solver="euler"`` ``simulate``
($x \\leftarrow \\operatorname{normalize}(x + h P_x F(x))$, ``h = 0.01``; diffrax's default
reverse mode, ``RecursiveCheckpointAdjoint``). Columns: meanfield (its default path on the CPU:
the fused C kernel for the field and for its tangent, ``exp_kernel.c``), meanfield's XLA path
(``backend="xla"``: the same program traced with the XLA formulation), plain JAX (``jax.grad`` /
``jax.jvp`` of a hand-written dense ``exp(beta X X^T)`` energy or velocity, and of a
``lax.fori_loop`` of the same Euler steps), PyTorch autograd (``backward``, ``torch.func.jvp``,
forward over reverse for the HVP; timed with 1 thread and with all cores, the faster reported).
The three JAX programs of a row are timed in alternating rounds; each entry is the smallest
per-round median. Every program is checked against meanfield's XLA path before it is timed
(max relative difference in the last column: float32 rounding, and for the simulation its growth over 100
steps; plain JAX and PyTorch evaluate ``exp(beta <x, y>)`` without meanfield's factored ``e^beta``). Prints a Markdown table (and writes it to
``--out``). Not a test: the numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

SHAPES = ((16, 1024, 8), (1, 8192, 3))
QUICK_SHAPES = ((4, 256, 8), (1, 1024, 3))
SIM_SHAPE, QUICK_SIM_SHAPE = (1, 1024, 3), (1, 256, 3)
STEPS, DT, BETA = 100, 0.01, 1.0


def _plain(beta: float):
    """Hand-written dense JAX: energy, velocity and Euler steps of one system."""
    import jax.numpy as jnp

    def energy(x):
        n = x.shape[0]
        return jnp.sum(jnp.exp(beta * (x @ x.T))) / (2 * beta * n * n)

    def velocity(x):
        F = jnp.exp(beta * (x @ x.T)) @ x / x.shape[0]
        return F - jnp.sum(F * x, -1, keepdims=True) * x

    return energy, velocity


def _torch_fns(beta: float):
    """The same formulas on batched torch tensors ``(S, n, d)`` (sums over seeds)."""
    import torch

    def energy(x):
        n = x.shape[-2]
        return torch.exp(beta * (x @ x.transpose(-1, -2))).sum() / (2 * beta * n * n)

    def velocity(x):
        F = torch.exp(beta * (x @ x.transpose(-1, -2))) @ x / x.shape[-2]
        return F - (F * x).sum(-1, keepdim=True) * x

    return energy, velocity


def _rel(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.derivatives", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small shapes (4 x 256 x 8, 1 x 1024 x 3; simulate 256)",
    )
    p.add_argument("--repeats", type=int, default=5, help="calls per program and round (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument(
        "--dtype", choices=("float32", "float64"), default="float32", help="default float32"
    )
    p.add_argument("--out", help="also write the Markdown table to this file")
    args = p.parse_args(argv)

    import jax

    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)  # a script's own choice, not the library's
    import jax.numpy as jnp
    import torch

    import meanfield as mf
    from meanfield import _native

    from .cases import THREADS, fmt_r, fmt_t, timeit, timeit_interleaved

    if not _native.exp_library().available:
        print(
            f"the native kernel is not available: {_native.exp_library().reason}", file=sys.stderr
        )
        return 1
    dtype = jnp.dtype(args.dtype)
    kernel = mf.kernels.USA(BETA)
    p_energy, p_velocity = _plain(BETA)
    t_energy, t_velocity = _torch_fns(BETA)

    def mf_ops(backend):
        E = lambda y: mf.energy(kernel, y, backend=backend)  # noqa: E731
        V = lambda y: mf.velocity(kernel, y, backend=backend)  # noqa: E731
        return {
            "grad(energy)": jax.jit(jax.vmap(lambda x, v: jax.grad(E)(x))),
            "jvp(velocity)": jax.jit(jax.vmap(lambda x, v: jax.jvp(V, (x,), (v,))[1])),
            "HVP jvp(grad(energy))": jax.jit(
                jax.vmap(lambda x, v: jax.jvp(jax.grad(E), (x,), (v,))[1])
            ),
        }

    plain_ops = {
        "grad(energy)": jax.jit(jax.vmap(lambda x, v: jax.grad(p_energy)(x))),
        "jvp(velocity)": jax.jit(jax.vmap(lambda x, v: jax.jvp(p_velocity, (x,), (v,))[1])),
        "HVP jvp(grad(energy))": jax.jit(
            jax.vmap(lambda x, v: jax.jvp(jax.grad(p_energy), (x,), (v,))[1])
        ),
    }

    def torch_op(name, x, v):
        if name == "grad(energy)":
            xr = x.detach().requires_grad_(True)
            t_energy(xr).backward()
            return xr.grad
        if name == "jvp(velocity)":
            return torch.func.jvp(t_velocity, (x,), (v,))[1]
        return torch.func.jvp(torch.func.grad(t_energy), (x,), (v,))[1]

    def torch_time(fn):
        best = (float("inf"), 1)
        for k in THREADS:
            previous = torch.get_num_threads()
            torch.set_num_threads(k)
            try:
                best = min(best, (timeit(fn, args.repeats)[0], k))
            finally:
                torch.set_num_threads(previous)
        return best

    native_ops, xla_ops = mf_ops("native"), mf_ops("xla")
    rows = []
    shapes = QUICK_SHAPES if args.quick else SHAPES
    for S, n, d in shapes:
        keys = jax.random.split(jax.random.key(n + d), 2 * S)
        x = jax.vmap(lambda k: mf.sphere.uniform(k, n, d, dtype))(keys[:S])
        v = mf.sphere.project(x, jax.vmap(lambda k: jax.random.normal(k, (n, d), dtype))(keys[S:]))
        xt, vt = (
            torch.from_numpy(jax.device_get(x).copy()),
            torch.from_numpy(jax.device_get(v).copy()),
        )
        for name in native_ops:
            ref = xla_ops[name](x, v)
            err = (
                f"{_rel(native_ops[name](x, v), ref):.1e} ({_rel(plain_ops[name](x, v), ref):.1e}, "
                f"{_rel(torch_op(name, xt, vt).detach().numpy(), ref):.1e})"
            )
            t = timeit_interleaved(
                {
                    "native": lambda: native_ops[name](x, v),
                    "xla": lambda: xla_ops[name](x, v),
                    "plain": lambda: plain_ops[name](x, v),
                },
                args.repeats,
                args.rounds,
            )
            t_torch, k_torch = torch_time(lambda: torch_op(name, xt, vt))
            rows.append(
                [
                    name,
                    f"{S} x {n} x {d}",
                    fmt_t(t["native"]),
                    fmt_t(t["xla"]),
                    fmt_t(t["plain"]),
                    f"{fmt_t(t_torch)} ({k_torch} thr)",
                    fmt_r(t["xla"] / t["native"]),
                    fmt_r(t["plain"] / t["native"]),
                    fmt_r(t_torch / t["native"]),
                    err,
                ]
            )
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)

    # grad through a 100-step simulation
    S, n, d = QUICK_SIM_SHAPE if args.quick else SIM_SHAPE
    x0 = mf.sphere.uniform(jax.random.key(7), n, d, dtype)
    c = jax.random.normal(jax.random.key(8), (n, d), dtype)

    def sim_grad(backend):
        def loss(x):
            traj = mf.simulate(
                kernel, x, t1=STEPS * DT, dt=DT, solver="euler", ts=[STEPS * DT], backend=backend
            )
            return jnp.sum(traj.xs[-1] * c)

        return jax.jit(jax.grad(loss))

    def plain_loss(x):
        def step(_, y):
            y = y + DT * p_velocity(y)
            return y / jnp.linalg.norm(y, axis=-1, keepdims=True)

        return jnp.sum(jax.lax.fori_loop(0, STEPS, step, x) * c)

    sims = {
        "native": sim_grad("native"),
        "xla": sim_grad("xla"),
        "plain": jax.jit(jax.grad(plain_loss)),
    }
    ct = torch.from_numpy(jax.device_get(c).copy())

    def torch_sim():
        xr = torch.from_numpy(jax.device_get(x0).copy()).requires_grad_(True)
        y = xr
        for _ in range(STEPS):
            y = y + DT * t_velocity(y)
            y = y / y.norm(dim=-1, keepdim=True)
        (y * ct).sum().backward()
        return xr.grad

    ref = sims["xla"](x0)
    err = (
        f"{_rel(sims['native'](x0), ref):.1e} ({_rel(sims['plain'](x0), ref):.1e}, "
        f"{_rel(torch_sim().numpy(), ref):.1e})"
    )
    t = timeit_interleaved(
        {k: (lambda f=f: f(x0)) for k, f in sims.items()}, max(1, args.repeats // 2), args.rounds
    )
    t_torch, k_torch = torch_time(torch_sim)
    rows.append(
        [
            f"grad through a {STEPS}-step simulate (euler)",
            f"{S} x {n} x {d}",
            fmt_t(t["native"]),
            fmt_t(t["xla"]),
            fmt_t(t["plain"]),
            f"{fmt_t(t_torch)} ({k_torch} thr)",
            fmt_r(t["xla"] / t["native"]),
            fmt_r(t["plain"] / t["native"]),
            fmt_r(t_torch / t["native"]),
            err,
        ]
    )
    print(" | ".join(rows[-1]), file=sys.stderr, flush=True)

    header = [
        "operation",
        "seeds x n x d",
        "meanfield (native)",
        "meanfield, XLA path",
        "plain JAX",
        "PyTorch autograd",
        "XLA path / native",
        "plain JAX / native",
        "PyTorch / native",
        "max rel diff to the XLA path: native (plain JAX, PyTorch)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    load = os.getloadavg()[0]
    table = "\n".join(lines) + (
        f"\n\n{args.dtype}; {os.cpu_count()} CPUs, load average {load:.1f} (1 min) "
        f"at the end; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."
    )
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
