"""``meanfield`` command line: simulate, reproduce, sweep, plot, info.

User mistakes (bad arguments, invalid values, missing files) print ONE line on
stderr and exit with status 2, without a traceback.

``meanfield simulate``'s model flags come from the model registry
(``mf.kernels.MODELS``): ``--kernel NAME`` and one flag per parameter (``--beta``,
``--lam``, ``--omega``, ``--amplitude``, ...), each accepted only by the models that have
it, with the registry's default and range. The same name, parameters and ``--seed`` give
the same numbers as a sweep of ``kind = NAME`` and as ``mf.kernels.make(NAME, ...)`` with
``mf.sphere.uniform(jax.random.key(seed), n, d)``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import tomllib
from pathlib import Path

__all__ = ["main", "build_parser"]

_USER_ERRORS = (ValueError, TypeError, FileNotFoundError, FileExistsError, tomllib.TOMLDecodeError)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit status 2)."""

    def error(self, message):  # pragma: no cover - exercised through the CLI tests
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def _int_at_least(k: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < k:
            raise argparse.ArgumentTypeError(f"must be >= {k}, got {v}")
        return v

    return parse


def _finite_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be finite, got {text}")
    return v


def _plane(text: str) -> tuple[int, int]:
    try:
        a, b = (int(t) for t in text.replace(" ", "").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two coordinate indices like 0,1, got {text!r}") from None
    if a == b or min(a, b) < 0:
        raise argparse.ArgumentTypeError(f"must be two distinct indices >= 0, got {text!r}")
    return a, b


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per parameter of the registry (``mf.kernels.MODELS``), defaults left to the
    registry (a flag absent from the command line takes the model's default)."""
    from .kernels import MODELS

    seen: dict[str, list] = {}
    for entry in MODELS.values():
        if entry.simulated:
            for p in entry.params:
                seen.setdefault(p.name, []).append((entry.name, p))
    types = {"float>0": _positive_float, "float>=0": _nonneg_float, "float": _finite_float,
             "int>=1": _int_at_least(1), "int>=0": _int_at_least(0), "plane": _plane}
    for name, uses in seen.items():
        p = uses[0][1]
        if len({(q.doc, _show_default(q.default)) for _, q in uses}) == 1:
            help_ = f"{p.doc} ({', '.join(m for m, _ in uses)}; default {_show_default(p.default)})"
        else:
            help_ = "; ".join(f"{m}: {q.doc} (default {_show_default(q.default)})" for m, q in uses)
        kw: dict = {"default": argparse.SUPPRESS, "help": help_}
        if p.kind == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        elif p.kind == "choice":
            kw["choices"] = p.choices
        else:
            kw["type"] = types[p.kind]
        parser.add_argument(_flag(name), **kw)


def _show_default(v) -> str:
    if isinstance(v, float) and abs(v - 2 * math.pi) < 1e-12:
        return "2 pi"
    if isinstance(v, tuple):
        return ",".join(map(str, v))
    return f"{v:g}" if isinstance(v, float) else str(v)


def build_parser() -> argparse.ArgumentParser:
    from .integrate import SOLVERS
    from .kernels import MODEL_NAMES
    from .reproduce import EXPERIMENTS

    p = _Parser(prog="meanfield", description="JAX engine for the mathematics of collapse in transformers.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    s = sub.add_parser("simulate", help="simulate one particle system and write figures and observables")
    s.add_argument("--kernel", default="usa", choices=MODEL_NAMES,
                   help="model name from the registry (mf.kernels.MODELS; default usa)")
    s.add_argument("--n", type=_int_at_least(2), default=256, help="number of particles (default 256)")
    s.add_argument("--d", type=_int_at_least(2), default=3, help="dimension of the ambient space (default 3)")
    _add_model_flags(s)
    s.add_argument("--t1", type=_positive_float, default=20.0, help="final time (default 20)")
    s.add_argument("--dt", type=_positive_float, default=1e-2, help="time step (default 1e-2)")
    s.add_argument("--solver", default="rk2", choices=SOLVERS, help="integrator (default rk2, projected Heun)")
    s.add_argument("--rtol", type=_positive_float, default=None, help="adaptive solvers: relative tolerance")
    s.add_argument("--atol", type=_positive_float, default=None, help="adaptive solvers: absolute tolerance")
    s.add_argument("--saves", type=_int_at_least(2), default=101, help="number of save times (default 101)")
    s.add_argument("--early-stop", type=_positive_float, default=None, help="paper's early-stop tolerance (e.g. 1e-8)")
    s.add_argument("--seed", type=_int_at_least(0), default=0, help="random seed (default 0)")
    s.add_argument("--out", default="out/simulate", help="output directory (default out/simulate)")

    r = sub.add_parser("reproduce", help="reproduce the papers' experiments (all of them when no name is given)")
    r.add_argument("experiment", nargs="?", choices=list(EXPERIMENTS), help="one experiment (default: the four papers)")
    r.add_argument("--quick", action="store_true", help="small sizes (minutes on a laptop)")
    r.add_argument("--full", action="store_true", help="the papers' full sizes (where an experiment has them)")
    r.add_argument("--out", default="out/reproduce", help="output directory (default out/reproduce)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")

    sub.add_parser("sweep", help="run a parameter sweep from a TOML spec (see `meanfield sweep --help`)", add_help=False)
    sub.add_parser("plot", help="standard views of a sweep store (see `meanfield plot --help`)", add_help=False)
    sub.add_parser("info", help="versions, devices, native kernels built or not and why (see `meanfield info --help`)",
                   add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the `meanfield` process itself: its figures need no display
        if "MPLBACKEND" not in os.environ:
            import matplotlib

            matplotlib.use("Agg")
        argv = sys.argv[1:]
    argv = list(argv)
    try:
        if argv and argv[0] in ("sweep", "plot"):
            from . import sweep

            fn = sweep.main if argv[0] == "sweep" else sweep.plot_main
            return int(fn(argv[1:]) or 0)
        if argv and argv[0] == "info":
            from . import info

            return int(info.main(argv[1:]) or 0)
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # argparse's one-line error (or --help): a status, not an exit of the caller
            return int(e.code or 0)
        if args.command is None:
            parser.print_help()
            return 2
        if args.command == "simulate":
            return _simulate(args)
        if args.command == "reproduce":
            return _reproduce(args)
    except _USER_ERRORS as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"meanfield: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        print("meanfield: interrupted", file=sys.stderr)
        return 130
    return 0


def _simulate(args) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from . import kernels, metrics, sphere
    from .integrate import simulate

    entry = kernels.model_entry(args.kernel)
    given = {p.name: getattr(args, p.name) for p in _all_params() if hasattr(args, p.name)}
    for name in given:
        if name not in {p.name for p in entry.params}:
            accepted = " ".join(_flag(p.name) for p in entry.params) or "none"
            raise ValueError(f"{_flag(name)} is not a parameter of --kernel {args.kernel} (its parameters: {accepted})")
    params = entry.resolve(given, where="--")
    model = kernels.make(args.kernel, d=args.d, **params)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    x0 = sphere.uniform(jax.random.key(args.seed), args.n, args.d)
    ts = np.linspace(0.0, args.t1, args.saves)
    t0 = time.perf_counter()
    traj = simulate(
        model, x0, t1=args.t1, dt=args.dt, solver=args.solver, ts=ts, rtol=args.rtol, atol=args.atol,
        early_stop=args.early_stop,
        observables={"clusters": lambda x: metrics.num_clusters(x, 0.1)},
    )
    jax.block_until_ready(traj.collapse_gap)
    wall = time.perf_counter() - t0
    e_max = entry.max_energy(params) if entry.max_energy is not None else None
    aux = model.default_aux(args.n)
    result = {
        "kernel": args.kernel, "n": args.n, "d": args.d,
        **{k: (list(v) if isinstance(v, tuple) else v) for k, v in params.items()},
        "t1": args.t1, "dt": args.dt, "solver": args.solver, "seed": args.seed,
        "final_collapse_gap": float(traj.collapse_gap[-1]),
        "final_energy": float(traj.energy[-1]) if traj.energy is not None else None,
        "theory_max_energy": e_max,
        "final_clusters": int(traj.observables["clusters"][-1]),
        "stop_time": float(traj.stop_time), "stopped": bool(traj.stopped), "failed": bool(traj.failed),
        "num_steps": int(traj.num_steps), "wall_time_s": round(wall, 3),
    }
    np.savez_compressed(
        out / "observables.npz", ts=np.asarray(traj.ts), collapse_gap=np.asarray(traj.collapse_gap),
        energy=np.asarray(traj.energy) if traj.energy is not None else np.full(len(ts), np.nan),
        clusters=np.asarray(traj.observables["clusters"]), x_final=np.asarray(traj.xs)[-1],
        x0=np.asarray(x0), aux=np.asarray(aux),
    )
    (out / "summary.json").write_text(json.dumps(result, indent=2))
    _simulate_figures(out, args, traj, np.asarray(aux), e_max, jnp)
    print(json.dumps(result))
    if traj.failed:
        print("meanfield: warning: the state went non-finite (failed = true); try --rescaled or a smaller --dt", file=sys.stderr)
    return 0


def _simulate_figures(out, args, traj, aux, e_max, jnp):
    import matplotlib.pyplot as plt
    import numpy as np

    from . import plotting

    x = np.asarray(traj.xs[-1])
    fig = plt.figure(figsize=(4.5, 4.5))
    ax = fig.add_subplot(projection="3d") if args.d == 3 else fig.add_subplot()
    color = aux if args.kernel != "prompt" else aux.astype(float)
    plotting.plot_configuration(
        ax, x, color=color,
        title=f"{args.kernel}, n={args.n}, d={args.d}, t={float(traj.stop_time):g}",
    )
    plotting.savefig(fig, out / "configuration.png")

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    ts = np.asarray(traj.ts)
    g = np.asarray(traj.collapse_gap)
    axes[0].plot(ts, np.maximum(g, 1e-12))
    axes[0].set_yscale("log")
    axes[0].set_xlabel("t")
    axes[0].set_ylabel("collapse gap $G_x$")
    if traj.energy is not None:
        axes[1].plot(ts, np.asarray(traj.energy), label="E(t)")
        if e_max is not None:
            axes[1].axhline(e_max, color="r", ls="--", label="theory max")
        axes[1].legend()
    else:
        axes[1].text(0.5, 0.5, "no pair energy for this model", ha="center", transform=axes[1].transAxes)
    axes[1].set_xlabel("t")
    axes[1].set_ylabel("energy")
    plotting.savefig(fig, out / "observables.png")


def _all_params():
    from .kernels import MODELS

    return [p for e in MODELS.values() for p in e.params]


def _reproduce(args) -> int:
    from . import reproduce

    if args.quick and args.full:
        raise ValueError("--quick and --full exclude each other; pass at most one")
    names = [args.experiment] if args.experiment else list(reproduce.PAPERS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summaries = {}
    for i, name in enumerate(names, 1):
        mod = reproduce.get(name)
        t0 = time.perf_counter()
        if not args.quiet:
            mode = "quick" if args.quick else "full" if args.full else "default"
            print(f"[meanfield {i}/{len(names)}] reproduce {name} ({mode})", file=sys.stderr, flush=True)
        opts = {"full": True} if args.full else {}
        summary = mod.run(out, quick=args.quick, quiet=args.quiet, **opts)
        summary.setdefault("timings", {})["total_s"] = round(time.perf_counter() - t0, 2)
        summaries[name] = summary
        failed = [c["name"] for c in summary["checks"] if not c["pass"]]
        print(
            f"{name}: {len(summary['checks']) - len(failed)}/{len(summary['checks'])} checks pass"
            + (f" (failing: {', '.join(failed)})" if failed else ""),
        )
    if args.experiment is None:
        from .reproduce import report

        report.write_report(out, summaries, quick=args.quick)
        print(f"report: {out / 'REPORT.md'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
