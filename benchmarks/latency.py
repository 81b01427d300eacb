"""``python -m benchmarks.latency [--repeats 5] [--quick] [--scale 4] [--chunks 8] [--only PART ...]
[--out DIR]``: time to first result, each figure the median of ``--repeats`` fresh processes, all
side by side in one run (repeat ``r`` runs every figure once, so a change of load hits them alike).

- imports: ``python -c "import jax"`` against ``python -c "import meanfield"`` and against
  ``import meanfield as mf; mf.simulate`` (the engine loaded: with a lazy ``import meanfield``,
  PEP 562, the first line imports no JAX), native kernels already built; ``import jax`` + a
  first op; ``meanfield --help``;
- ``meanfield simulate`` with its defaults (``--out`` a temporary directory): cold with an empty
  ``MEANFIELD_CACHE_DIR`` (a fresh one per repeat: the native C kernels are built into it at the
  first use, then everything compiles), cold compilation cache (native kernels built, its
  ``xla`` subdirectory deleted), warm (a second process, same cache directory), warm with
  ``--no-plots`` (where the CLI has it) and warm with ``MEANFIELD_COMPILATION_CACHE=0``; against the reference ``import jax`` (a fresh process) +
  the warm run of the same ``mf.simulate`` call inside one process (its second call) + writing
  the same outputs (``summary.json`` and ``run.zarr`` where the CLI writes it, else the earlier
  ``observables.npz``; the two figures, importing matplotlib included);
- the smoke sweep (``sweeps/smoke.toml``, its seeds times ``--scale``) run by one process, by a
  job array of three parts (``--part i/3`` started at once, one store) and by two
  ``jax.distributed`` processes (``--coordinator 127.0.0.1:PORT``), each with a cold compilation
  cache (native kernels built, ``xla`` deleted) and then warm (the same command again), all with
  the same ``--memory`` (``--chunks`` chunks per group on one device, as ``benchmarks.scaleout``).

Targets (issue 31): ``import meanfield`` <= 1.3x ``import jax``; ``meanfield --help`` < 0.5 s;
warm ``meanfield simulate`` <= 2x the reference; the job array and the 2-process run within 20%
of one process. Writes ``DIR/latency.json`` (default ``out/benchmarks``; every sample) and prints a
Markdown table. Works with and without meanfield's persistent compilation cache: it only sets
``MEANFIELD_CACHE_DIR`` and ``MEANFIELD_COMPILATION_CACHE``, and unsets ``JAX_COMPILATION_CACHE_DIR``.
Not a test: the numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import cpu_name
from .scaleout import _free_port, _spec

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("imports", "simulate", "sweep")
TIMEOUT = 1800

# builds the native kernels into $MEANFIELD_CACHE_DIR: loading the engine (with a lazy `import
# meanfield` the import alone builds nothing) and running one small simulation
_PREBUILD = r"""
import jax
import meanfield as mf
mf.simulate(mf.kernels.make("usa", d=3), mf.sphere.uniform(jax.random.key(0), 8, 3), t1=0.1)
"""

# the reference: `import jax` and the warm in-process run of the CLI's `mf.simulate` call, then the
# CLI's outputs written the same way; argv: the simulate arguments (JSON), the output directory
_REFERENCE = r"""
import json, sys, time
t0 = time.perf_counter()
import jax
t_jax = time.perf_counter() - t0
t0 = time.perf_counter()
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
t_mpl = time.perf_counter() - t0
from pathlib import Path
import numpy as np
t0 = time.perf_counter()
import meanfield as mf
from meanfield import cli, kernels, metrics, plotting, sphere
t_mf = time.perf_counter() - t0
sim_args, out = json.loads(sys.argv[1]), Path(sys.argv[2])
args = cli.build_parser().parse_args(["simulate", *sim_args])
entry = kernels.model_entry(args.kernel)
names = {p.name for p in entry.params}
params = entry.resolve({k: v for k, v in vars(args).items() if k in names and v is not None}, where="--")
model = kernels.make(args.kernel, d=args.d, **params)
x0 = sphere.uniform(jax.random.key(args.seed), args.n, args.d)
aux = model.default_aux(args.n)
ts = np.linspace(0.0, args.t1, args.saves)
obs = {"clusters": lambda x: metrics.num_clusters(x, 0.1)}
def run():
    t0 = time.perf_counter()
    traj = mf.simulate(model, x0, t1=args.t1, dt=args.dt, solver=args.solver, step=args.step, ts=ts,
                       rtol=args.rtol, atol=args.atol, early_stop=args.early_stop, observables=obs)
    jax.block_until_ready(traj.collapse_gap)
    return traj, time.perf_counter() - t0
_, t_first = run()
traj, t_warm = run()
t0 = time.perf_counter()
gap = np.asarray(traj.collapse_gap, np.float64)
energy = np.asarray(traj.energy, np.float64) if traj.energy is not None else np.full(len(ts), np.nan)
clusters = np.asarray(traj.observables["clusters"], np.float64)
xs = np.asarray(traj.xs)
out.mkdir(parents=True, exist_ok=True)
summary = {"kernel": args.kernel, "n": args.n, "d": args.d, **{k: str(v) for k, v in params.items()},
           "final_collapse_gap": float(gap[-1]), "num_steps": int(traj.num_steps), "wall_time_s": t_warm}
(out / "summary.json").write_text(json.dumps(summary, indent=2))
if hasattr(traj, "to_xarray"):  # the run's store, as the CLI writes it (importing xarray, zarr included)
    from meanfield._labelled import write_run
    ds = traj.to_xarray(model, aux=np.asarray(aux))
    ds["x0"] = (("token", "dim"), np.asarray(x0))
    write_run(out / "run.zarr", ds)
else:  # a meanfield before run.zarr: its CLI wrote observables.npz
    np.savez_compressed(out / "observables.npz", ts=np.asarray(traj.ts), collapse_gap=gap, energy=energy,
                        clusters=clusters, x_final=xs[-1], x0=np.asarray(x0), aux=np.asarray(aux))
t_numbers = time.perf_counter() - t0
t0 = time.perf_counter()
fig = plt.figure(figsize=(4.5, 4.5))
ax = fig.add_subplot(projection="3d") if args.d == 3 else fig.add_subplot()
plotting.plot_configuration(ax, xs[-1], color=np.asarray(aux), title=f"{args.kernel}, n={args.n}")
plotting.savefig(fig, out / "configuration.png")
fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
axes[0].plot(ts, np.maximum(gap, 1e-12))
axes[0].set_yscale("log")
axes[1].plot(ts, energy, label="E(t)")
axes[1].legend()
plotting.savefig(fig, out / "observables.png")
t_figures = time.perf_counter() - t0
print(json.dumps(dict(import_jax=t_jax, import_matplotlib=t_mpl, import_meanfield=t_mf, first_call=t_first,
                      warm_call=t_warm, write_numbers=t_numbers, write_figures=t_figures)))
"""

# the sweep's --memory for CHUNKS chunks per group on one device (as benchmarks.scaleout)
_MEMORY = r"""
import sys
import numpy as np
from meanfield import sweep
plan = sweep.make_plan(sweep.parse_spec(open(sys.argv[1]).read()), "1TB", devices=1)
per_group = int(np.prod(plan.batch_shape))
pb = max(g.point_bytes for g in plan.groups)
print(pb * -(-per_group // int(sys.argv[2])))
"""

# the largest difference of a store's values from the one-process store; argv: reference, stores
_COMPARE = r"""
import json, sys
import numpy as np
from meanfield import sweep
ref = sweep.load(sys.argv[1])
diffs = {}
for path in sys.argv[2:]:
    ds = sweep.load(path)
    diffs[path] = max(float(np.nanmax(np.abs(np.asarray(ds[k].values, np.float64) - np.asarray(ref[k].values))))
                      for k in ("collapse_gap", "energy"))
print(json.dumps(diffs))
"""


def machine() -> dict:
    cpu = cpu_name()
    affinity: int | None
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count()
    versions: dict[str, str | None] = {}
    # meanfield's distribution is named apart from the package (pyproject.toml, [project] name)
    dists = {"jax": "jax", "jaxlib": "jaxlib", "meanfield": "meanfield-transformers"}
    for pkg, dist in dists.items():
        try:
            versions[pkg] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    try:
        rev = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
            ).stdout.strip()
            or None
        )
    except OSError:
        rev = None
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "platform": platform.platform(),
        "python": platform.python_version(),
        **versions,
        "git": rev,
    }


def _meanfield_cmd() -> list[str]:
    """The ``meanfield`` console script beside this interpreter (what users run), else ``python -m meanfield``."""
    exe = Path(sys.executable).parent / "meanfield"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "meanfield"]


def _run(cmd: list[str], env: dict, what: str) -> tuple[float, str]:
    """Wall seconds of one fresh process and its stdout (RuntimeError naming ``what`` on a failure)."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise RuntimeError(f"{what} failed (exit {r.returncode}): {tail}")
    return wall, r.stdout


def _launch(commands: list[list[str]], env: dict, what: str) -> float:
    """Start the commands at once; wall seconds until the last exits (RuntimeError on a failure)."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            c, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for c in commands
    ]
    try:
        errs = [(p.wait(TIMEOUT), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    wall = time.perf_counter() - t0
    bad = [(rc, err.strip().splitlines()[-1:]) for rc, err in errs if rc != 0]
    if bad:
        raise RuntimeError(f"{what}: a process failed: {bad}")
    return wall


def _sweep_commands(name: str, spec_cmd: list[str], out: Path) -> list[list[str]]:
    """The processes of one sweep configuration: one process, 3 parts, or 2 ``jax.distributed`` processes."""
    if name == "one":
        return [[*spec_cmd, "--out", str(out)]]
    if name == "parts":
        return [[*spec_cmd, "--out", str(out), "--part", f"{i}/3"] for i in (1, 2, 3)]
    port = _free_port()
    return [
        [
            *spec_cmd,
            "--out",
            str(out),
            "--coordinator",
            f"127.0.0.1:{port}",
            "--num-processes",
            "2",
            "--process-id",
            str(i),
        ]
        for i in range(2)
    ]


def _fresh_cache(base: Path, name: str) -> Path:
    path = base / name
    path.mkdir(mode=0o700)
    return path


def _drop_xla(cache: Path) -> None:
    """Empty the compilation cache (``$MEANFIELD_CACHE_DIR/xla``), keeping the native kernels."""
    shutil.rmtree(cache / "xla", ignore_errors=True)


def _stats(samples: list[float]) -> dict:
    return {
        "samples": [round(s, 4) for s in samples],
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.latency", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="fresh processes per figure (default 5; 1 with --quick)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 1 repeat, simulate --n 64 --t1 2, the smoke sweep x 1 (a few minutes)",
    )
    p.add_argument(
        "--scale",
        type=int,
        default=None,
        help="seeds of sweeps/smoke.toml times this (default 4; 1 with --quick)",
    )
    p.add_argument(
        "--chunks", type=int, default=8, help="sweep chunks per group on one device (default 8)"
    )
    p.add_argument("--only", nargs="+", choices=PARTS, help="run only these parts (default all)")
    p.add_argument(
        "--out", default="out/benchmarks", help="directory of latency.json (default out/benchmarks)"
    )
    args = p.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 5)
    scale = args.scale if args.scale is not None else (1 if args.quick else 4)
    if repeats < 1 or scale < 1 or args.chunks < 1:
        p.error("--repeats, --scale and --chunks must be >= 1")
    sim_args = ["--n", "64", "--t1", "2"] if args.quick else []
    parts = args.only or list(PARTS)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    base_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "MEANFIELD_COMPILATION_CACHE")
        )
    }
    base_env.setdefault("MPLBACKEND", "Agg")
    mf_cmd = _meanfield_cmd()
    py = sys.executable
    t_start = time.perf_counter()
    load0 = os.getloadavg()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    def env_with(cache: Path, **extra: str) -> dict:
        return {**base_env, "MEANFIELD_CACHE_DIR": str(cache), **extra}

    samples: dict[str, list[float]] = {}
    ref_parts: dict[str, list[float]] = {}
    inner: list[float] = []  # simulate's own wall_time_s (warm process)
    lazy: list[bool] = []  # `import meanfield` left JAX unimported
    sweep_info: dict = {}

    def add(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)
        log(f"{key}: {value:.2f} s")

    with tempfile.TemporaryDirectory(prefix="latency-") as tmp:
        base = Path(tmp)
        shared = _fresh_cache(base, "cache-shared")  # native kernels built once: imports and sweeps
        log("building the native kernels into a temporary cache directory ...")
        _run([py, "-c", _PREBUILD], env_with(shared), "the native build")
        _drop_xla(shared)
        if "sweep" in parts:
            spec_path = base / "smoke_x.toml"
            spec_path.write_text(_spec(scale))
            memory = (
                _run(
                    [py, "-c", _MEMORY, str(spec_path), str(args.chunks)],
                    env_with(shared),
                    "the sweep plan",
                )[1]
                .strip()
                .splitlines()[-1]
            )
            sweep_info = {
                "spec": f"sweeps/smoke.toml, seeds x {scale}",
                "memory": memory,
                "chunks": args.chunks,
            }
        stores: dict[str, Path] = {}
        no_plots = (
            "simulate" in parts
            and "--no-plots"
            in _run([*mf_cmd, "simulate", "--help"], env_with(shared), "meanfield simulate --help")[
                1
            ]
        )

        for r in range(repeats):
            log(f"repeat {r + 1}/{repeats}")
            if "imports" in parts:
                env = env_with(shared)
                add("import_jax", _run([py, "-c", "import jax"], env, "import jax")[0])
                wall, stdout = _run(
                    [py, "-c", "import sys, meanfield; print('jax' in sys.modules)"],
                    env,
                    "import meanfield",
                )
                add("import_meanfield", wall)
                lazy.append(stdout.strip() == "False")
                add(
                    "import_engine",
                    _run(
                        [py, "-c", "import meanfield as mf; mf.simulate"],
                        env,
                        "import meanfield + mf.simulate",
                    )[0],
                )
                add(
                    "import_jax_op",
                    _run(
                        [py, "-c", "import jax, jax.numpy as jnp; jnp.ones(2).block_until_ready()"],
                        env,
                        "import jax + first op",
                    )[0],
                )
                add("help", _run([*mf_cmd, "--help"], env, "meanfield --help")[0])
            if "simulate" in parts:
                cache = _fresh_cache(base, f"cache-sim-{r}")
                env = env_with(cache)

                def simulate(
                    key: str, env: dict, tag: str, r: int = r, extra: tuple | list = ()
                ) -> None:
                    out = base / f"sim-{tag}-{r}"
                    add(
                        key,
                        _run(
                            [*mf_cmd, "simulate", "--out", str(out), *sim_args, *extra],
                            env,
                            f"meanfield simulate ({key})",
                        )[0],
                    )
                    if key == "sim_warm":
                        run_s = json.loads((out / "summary.json").read_text()).get("wall_time_s")
                        if run_s is not None:
                            inner.append(float(run_s))
                    shutil.rmtree(out, ignore_errors=True)

                simulate("sim_cold_empty", env, "empty")  # builds the native kernels, then compiles
                simulate("sim_warm", env, "warm")
                if no_plots:
                    simulate("sim_warm_noplots", env, "noplots", extra=["--no-plots"])
                _drop_xla(cache)
                simulate("sim_cold_xla", env, "xla")
                simulate(
                    "sim_warm_nocache", env_with(cache, MEANFIELD_COMPILATION_CACHE="0"), "nocache"
                )
                out = base / f"ref-{r}"
                wall, stdout = _run(
                    [py, "-c", _REFERENCE, json.dumps(sim_args), str(out)], env, "the reference"
                )
                for k, v in json.loads(stdout.strip().splitlines()[-1]).items():
                    ref_parts.setdefault(k, []).append(v)
                log(
                    f"reference process {wall:.1f} s: warm call {ref_parts['warm_call'][-1]:.2f} s, first call "
                    f"{ref_parts['first_call'][-1]:.2f} s"
                )
                shutil.rmtree(out, ignore_errors=True)
            if "sweep" in parts:
                spec_cmd = [*mf_cmd, "sweep", str(spec_path), "--memory", memory, "--quiet"]
                for name in ("one", "parts", "dist"):
                    _drop_xla(shared)
                    for state in ("cold", "warm"):
                        out = base / f"sweep-{name}-{state}-{r}.zarr"
                        add(
                            f"sweep_{name}_{state}",
                            _launch(
                                _sweep_commands(name, spec_cmd, out),
                                env_with(shared),
                                f"sweep {name} {state}",
                            ),
                        )
                        key = f"{name}-{state}"
                        if key in stores:
                            shutil.rmtree(out, ignore_errors=True)
                        else:
                            stores[key] = out
        if "sweep" in parts and stores:
            ref = stores.pop("one-cold")
            diffs = json.loads(
                _run(
                    [py, "-c", _COMPARE, str(ref), *map(str, stores.values())],
                    env_with(shared),
                    "comparing the stores",
                )[1]
                .strip()
                .splitlines()[-1]
            )
            sweep_info["max_abs_diff_vs_one_process"] = {
                k: diffs[str(v)] for k, v in stores.items()
            }
    load1 = os.getloadavg()
    total = time.perf_counter() - t_start

    stats = {k: _stats(v) for k, v in samples.items()}
    ref_stats = {k: _stats(v) for k, v in ref_parts.items()}
    rows = _rows(stats, ref_stats, inner, all(lazy) if lazy else None)
    result = {
        "generated": f"{_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC",
        "command": "python -m benchmarks.latency "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "repeats": repeats,
        "quick": args.quick,
        "simulate_args": sim_args,
        "meanfield_command": mf_cmd,
        "machine": machine(),
        "load_average": {"start": load0, "end": load1},
        "total_s": total,
        "sweep": sweep_info,
        "figures": stats,
        "reference_parts": ref_stats,
        "simulate_inner_wall_time_s": _stats(inner) if inner else None,
        "rows": rows,
    }
    path = out_dir / "latency.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    log(f"wrote {path} (total {total / 60:.1f} min)")
    return 0


def _rows(stats: dict, ref_stats: dict, inner: list[float], lazy: bool | None) -> list[dict]:
    """The table's rows: figure, its statistics, the reference it is held against, ratio, target, met."""
    rows: list[dict] = []

    def row(
        label,
        key=None,
        value=None,
        ref_label=None,
        ref=None,
        target=None,
        limit=None,
        absolute=None,
    ):
        if key is not None and key not in stats:
            return
        s = stats[key] if key is not None else value
        ratio = s["median"] / ref if ref else None
        met = None
        if limit is not None and ratio is not None:
            met = ratio <= limit
        if absolute is not None:
            met = s["median"] < absolute
        rows.append(
            {
                "figure": label,
                "median_s": s["median"],
                "min_s": s["min"],
                "max_s": s["max"],
                "reference": ref_label,
                "reference_s": ref,
                "ratio": ratio,
                "target": target,
                "met": met,
            }
        )

    med = {k: v["median"] for k, v in stats.items()}
    row('`python -c "import jax"`', "import_jax")
    # a lazy `import meanfield` (PEP 562) loads no JAX: the engine's import is the figure to hold
    # against `import jax` then, so both rows carry the target
    row(
        '`python -c "import meanfield"`' + (" (lazy: imports no JAX)" if lazy else ""),
        "import_meanfield",
        ref_label="import jax",
        ref=med.get("import_jax"),
        target="<= 1.3x",
        limit=1.3,
    )
    row(
        '`python -c "import meanfield as mf; mf.simulate"` (the engine loaded)',
        "import_engine",
        ref_label="import jax",
        ref=med.get("import_jax"),
        target="<= 1.3x",
        limit=1.3,
    )
    row(
        "`import jax` + a first op",
        "import_jax_op",
        ref_label="import jax",
        ref=med.get("import_jax"),
    )
    row("`meanfield --help`", "help", target="< 0.5 s", absolute=0.5)
    reference = None
    if ref_stats and "import_jax" in med:
        parts = ("warm_call", "write_numbers", "import_matplotlib", "write_figures")
        reference = med["import_jax"] + sum(ref_stats[k]["median"] for k in parts)
        ref_samples = [sum(v) for v in zip(*(ref_stats[k]["samples"] for k in parts), strict=True)]
        value = {
            "median": reference,
            "min": med["import_jax"] + min(ref_samples),
            "max": med["import_jax"] + max(ref_samples),
        }
        row(
            "reference: `import jax` + warm in-process `mf.simulate` + writing outputs", value=value
        )
        for k, label in (
            ("first_call", "in-process `mf.simulate`, first call (compiles)"),
            ("warm_call", "in-process `mf.simulate`, second call (warm)"),
            ("write_numbers", "writing the numbers (summary.json, run.zarr)"),
            ("import_matplotlib", "importing matplotlib.pyplot"),
            ("write_figures", "drawing and writing the two figures"),
        ):
            row(f"&nbsp;&nbsp;{label}", value=ref_stats[k])
    sim_ref = "reference" if reference is not None else None
    row(
        "`meanfield simulate` cold: empty cache dir (native build + compilation)",
        "sim_cold_empty",
        ref_label=sim_ref,
        ref=reference,
    )
    row(
        "`meanfield simulate` cold compilation cache (native kernels built)",
        "sim_cold_xla",
        ref_label=sim_ref,
        ref=reference,
    )
    if "sim_cold_empty" in med and "sim_cold_xla" in med:
        build = med["sim_cold_empty"] - med["sim_cold_xla"]
        row(
            "&nbsp;&nbsp;native build (difference of the two cold medians)",
            value={"median": build, "min": build, "max": build},
        )
    row(
        "`meanfield simulate` warm (second process)",
        "sim_warm",
        ref_label=sim_ref,
        ref=reference,
        target="<= 2x",
        limit=2.0,
    )
    row(
        "`meanfield simulate` warm, `MEANFIELD_COMPILATION_CACHE=0`",
        "sim_warm_nocache",
        ref_label=sim_ref,
        ref=reference,
    )
    if inner:
        row("&nbsp;&nbsp;its run inside the warm process (`wall_time_s`)", value=_stats(inner))
    # --no-plots against the reference less matplotlib and the figures
    no_fig = (
        None
        if reference is None
        else (
            reference
            - ref_stats["import_matplotlib"]["median"]
            - ref_stats["write_figures"]["median"]
        )
    )
    row(
        "`meanfield simulate --no-plots` warm",
        "sim_warm_noplots",
        ref_label="reference without figures" if no_fig is not None else None,
        ref=no_fig,
    )
    for state in ("cold", "warm"):
        one = med.get(f"sweep_one_{state}")
        row(f"sweep, one process, {state} compilation cache", f"sweep_one_{state}")
        row(
            f"sweep, 3-part job array (`--part i/3` at once), {state}",
            f"sweep_parts_{state}",
            ref_label=f"one process, {state}",
            ref=one,
            target="<= 1.2x",
            limit=1.2,
        )
        row(
            f"sweep, 2 processes (`jax.distributed`), {state}",
            f"sweep_dist_{state}",
            ref_label=f"one process, {state}",
            ref=one,
            target="<= 1.2x",
            limit=1.2,
        )
    return rows


def markdown(result: dict) -> str:
    """The ready-to-paste Markdown: what was run, on what machine, and the table."""
    m = result["machine"]
    la = result["load_average"]
    lines = [
        f"Generated by `{result['command'].strip()}` on {result['generated']} "
        f"(total {result['total_s'] / 60:.1f} min); each figure the median of {result['repeats']} fresh "
        "process(es), min-max in brackets.",
        "",
        f"- CPU: {m['cpu']}, {m['cpu_count']} cores ({m['cpus_usable']} usable); python {m['python']}, "
        f"jax {m['jax']}, jaxlib {m['jaxlib']}, meanfield at git {m['git']}; load average "
        f"{la['start'][0]:.1f} at the start, {la['end'][0]:.1f} at the end.",
    ]
    if result["simulate_args"]:
        lines.append(
            f"- `meanfield simulate` arguments: `{' '.join(result['simulate_args'])}` (quick mode)."
        )
    else:
        lines.append("- `meanfield simulate` with its defaults (`--out` a temporary directory).")
    sw = result["sweep"]
    if sw:
        diffs = sw.get("max_abs_diff_vs_one_process") or {}
        worst = max(diffs.values()) if diffs else None
        lines.append(
            f"- Sweep: {sw['spec']}, `--memory {sw['memory']}` ({sw['chunks']} chunks per group on one "
            f"device); cold = native kernels built, compilation cache (`$MEANFIELD_CACHE_DIR/xla`) "
            f"emptied; warm = the same command again."
            + (
                f" Largest |difference| of any store from the one-process store: {worst:.1e}."
                if diffs
                else ""
            )
        )
    lines += [
        "",
        "| figure | median (s) | (min-max) | reference | ratio | target | met? |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        ref = f"{r['reference']} ({r['reference_s']:.2f} s)" if r["reference"] else ""
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else ""
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        lines.append(
            f"| {r['figure']} | {r['median_s']:.2f} | ({r['min_s']:.2f}-{r['max_s']:.2f}) | {ref} | "
            f"{ratio} | {r['target'] or ''} | {met} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
