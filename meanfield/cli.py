"""``meanfield`` command line: simulate, reproduce, sweep, plot, info.

Exit status: 0 success; 1 ``simulate`` ran but the run failed (a non-finite state, energy
or observable: its outputs are written with ``failed: true`` and the reason in
``summary.json``, one warning line on stderr); 2 a user mistake (bad arguments, invalid
values, an ``--out`` or ``--movie`` that cannot be written, ``--movie x.mp4`` without the
``imageio-ffmpeg`` package, a run past the resource limits, ``--backend native`` where the
fused kernel cannot run) or a model registered by another package whose code raised (the line
names the model and its class), reported as ONE line on stderr without a traceback; 130
interrupted.

Every file ``simulate`` writes (``summary.json``, the figures, the movie)
must be a regular file or a new one (and ``run.zarr`` new or the store of an earlier run, which it
replaces: ``meanfield._labelled.check_run_path``): a FIFO, socket, device or directory in its place is
refused before the run, without being opened (``meanfield._paths.check_output``; opening a
FIFO to write would wait for a reader forever), and the numbers are written through
``meanfield._paths.open_output``, which never blocks on one put there during the run.
``reproduce`` refuses an ``--out`` that holds a FIFO, socket or device anywhere under it, before
any experiment starts (``meanfield._paths.special_file_under``).

``simulate --movie PATH`` (``.mp4`` or ``.gif``) also writes a movie of the run, one frame per
save (``mf.plotting.animate``); the path is checked before the run.

Before anything is allocated ``simulate`` estimates the run's steps, saves, memory and
arithmetic (``meanfield._resources.run_cost``) and refuses past the machine's memory or the
work bound with the estimate (``--force`` runs past the available memory or the work bound,
never past the machine's total memory). It warns when the fixed step is long for the
interaction rate (the sweep plan's rule, ``_resources.step_warning``) and when the energy,
which the exact flow never decreases, falls between two saves (``energy_decreases`` in the
summary). JSON outputs are strict: non-finite numbers are written as ``null``.

It also estimates the run's time: its pair arithmetic at this machine's rate, measured on the
model's field at ``RATE_PROBE_N`` particles (``_field_rate``, only when the run may be long), plus
the loop's overhead at ``REFERENCE_FLOP_RATE`` (``estimated_time_s`` in the summary). A run
estimated past ``ESTIMATE_NOTICE_S`` (30 s) prints one line on stderr before it starts, its time,
memory and work; one past ``PROGRESS_BAR_S`` (2 s) shows a progress bar over simulated time on
stderr (``mf.simulate(progress=True)``: the same numbers bit for bit), which ``--quiet`` hides.

``meanfield simulate``'s model flags come from the model registry
(``mf.kernels.MODELS``): ``--kernel NAME`` and one flag per parameter (``--beta``,
``--lam``, ``--omega``, ``--amplitude``, ...), each accepted only by the models that have
it, with the registry's default and range. The same name, parameters and ``--seed`` give
the same numbers as a sweep of ``kind = NAME`` and as ``mf.kernels.make(NAME, ...)`` with
``mf.sphere.uniform(jax.random.key(seed), n, d)``.

``--normalization`` (``mf.normalization``: ``post``, ``pre``, ``mix``, ``peri``, ``ngpt``,
``scaling``) takes ``--alpha`` with ``ngpt`` only and ``--switch-time`` with ``mix`` only (a flag
that applies with another's value is refused elsewhere, even at its default). The schemes with a
radius (``pre``, ``mix``, ``peri``) take ``--r0`` (every token's initial radius, default 1;
refused for the others) and write the radii: ``radius`` over ``(time, token)`` in ``run.zarr``
beside the states (``x`` and ``x0``: the directions; ``r0`` also an attribute) and ``r0`` and
``final_mean_radius`` (the mean of ``radius`` at the last save) in ``summary.json``. Mix-LN
switches at the end of the step that reaches ``--switch-time`` (``mf.simulate``: on a fixed
step, the first step boundary at or after it).

``simulate --out DIR`` writes the run's numbers in one format, labelled data, ``DIR/run.zarr``:
the ``xarray.Dataset`` of ``Trajectory.to_xarray`` (coordinates ``time``, ``token``, ``dim``; the
states ``x``, ``collapse_gap``, ``energy``, ``clusters``, ``radius``, the token labels ``aux``,
``stop_time``, ``num_steps``, ``status``; the model, its parameters as given, the time settings,
the seed and the versions as attributes) plus ``x0`` over ``(token, dim)``, the initial states as
drawn from ``--seed`` (``x`` at time 0 is them renormalised, not bit for bit), in a one-point sweep
store, which ``mf.sweep.load(DIR)`` (or ``mf.sweep.load(DIR / "run.zarr")``) verifies and opens as
it opens a sweep. ``summary.json`` is the run's short summary (final values, settings, warnings,
the failure). The store holds every number the earlier ``observables.npz`` did (no longer
written; one left in ``DIR`` by an earlier version is removed, as it holds an earlier run's numbers): ``ts`` is the coordinate ``time``, ``x_final`` is ``x`` at the last time
(``ds.x[-1]``), ``x0``, ``collapse_gap``, ``aux`` and ``radius`` are variables (in the run's
dtype, not cast to float64); ``energy`` is absent where the model has none (a masked kernel,
``sa``) and ``clusters`` for tokens in R^d, where ``observables.npz`` held NaN.

``--help`` and argument errors return before JAX is imported: the parser reads the registry
through ``meanfield._cli_schema``, a copy generated from it (``python -m
meanfield._cli_schema --write``; a test fails when they differ), or the registry itself when
it is already imported. ``simulate`` writes its numbers (``summary.json``, ``run.zarr``)
before it draws ``configuration.png`` and ``observables.png``;
``--no-plots`` draws no figure (and imports no matplotlib).

The ``meanfield`` process itself (``main()`` without arguments, ``python -m meanfield``)
calls ``meanfield.compilation_cache.configure_process()`` once its arguments are parsed and
before JAX is imported (JAX's persistent compilation cache; ``MEANFIELD_COMPILATION_CACHE=0``
turns it off); ``main(argv)`` called from Python changes no process-wide setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import _params, _paths
from ._argparse import OneLineParser
from ._native import BACKENDS, check_backend
from ._spelling import (
    PAIR_WORDS,
    applies_problem,
    pair_problem,
    radius_problem,
    say_cli,
    size_problem,
    solver_refusal,
)

__all__ = [
    "main",
    "build_parser",
    "PARAM_LIMIT",
    "SEED_LIMIT",
    "PROGRESS_BAR_S",
    "ESTIMATE_NOTICE_S",
    "REFERENCE_FLOP_RATE",
    "RATE_PROBE_N",
]

_USER_ERRORS = (ValueError, TypeError, OverflowError, OSError, tomllib.TOMLDecodeError)

#: The files ``simulate`` writes in ``--out`` beside its numbers' store ``run.zarr``
#: (``_labelled.RUN_STORE``): the summary, then (without ``--no-plots``) the figures.
_OUTPUT_FILES = ("summary.json", "configuration.png", "observables.png")

#: ``description`` of ``x0`` in ``run.zarr``.
_X0_DESCRIPTION = (
    "initial token states x_i(0) as drawn from the seed (mf.sphere.uniform; the directions for the "
    "schemes with a radius)"
)

#: Largest magnitude of a model parameter from the command line: beyond ``2^24`` a float32
#: no longer resolves the parameter's units (a phase ``2 pi m s`` keeps no digit).
PARAM_LIMIT = 2**24
#: Seeds are 32-bit (``jax.random.key`` without x64): larger ones would repeat smaller ones.
SEED_LIMIT = 2**32 - 1
#: ``simulate`` shows a progress bar over simulated time on stderr (``mf.simulate(progress=True)``;
#: ``--quiet`` hides it) for a run estimated to take longer than this many seconds.
PROGRESS_BAR_S = 2.0
#: ``simulate`` prints its estimate, time and memory, as one line on stderr before a run estimated to
#: take longer than this many seconds.
ESTIMATE_NOTICE_S = 30.0
#: The arithmetic rate (flop/s) of the work estimate where none is measured: the rate
#: ``_resources.WORK_LIMIT`` assumes (the 2-core reference machine), and the one of the loop's
#: overhead (``_resources.STEP_OVERHEAD_FLOP``: 10 us a step, measured there).
REFERENCE_FLOP_RATE = 1e11
#: Particles of the field evaluations timed to measure this machine's rate (``_field_rate``), done
#: only when the run may be long: its estimate at ``REFERENCE_FLOP_RATE`` is at least a tenth of the
#: smaller threshold above.
RATE_PROBE_N = 512


_Parser = OneLineParser  # meanfield._argparse: shared with meanfield info


def _arg(
    kind: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    magnitude: int | float | None = None,
) -> Callable[[str], Any]:
    """The argparse type of a value of ``kind`` (``meanfield._params``: the rule and message of the
    Python constructors and the sweep spec; ``"int"`` with ``minimum``/``maximum`` for counts and
    seeds), with ``|value| <= magnitude`` where given."""

    def parse(text: str) -> Any:
        try:
            v = _params.parse_text(kind, text, minimum=minimum, maximum=maximum)
        except (ValueError, TypeError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if magnitude is not None and abs(v) > magnitude:
            raise argparse.ArgumentTypeError(
                f"must be at most 2^24 = {PARAM_LIMIT} in magnitude (float32 resolves no unit beyond), got {text}"
            )
        return v

    parse.__name__ = kind  # argparse names the type in some messages
    return parse


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _models() -> tuple:
    """The registry as the parser needs it (``meanfield._cli_schema.Model``): the registry
    itself where ``meanfield.kernels`` is already imported (a model registered at run time
    included) or where an installed package declares models (entry-point group
    ``meanfield.models``: they register when the registry loads), else its JAX-free copy
    ``meanfield._cli_schema.MODELS``."""
    from . import _cli_schema

    if "meanfield.kernels" in sys.modules or _cli_schema.entry_points_declared():
        return _cli_schema.derive_models()
    return _cli_schema.MODELS


def _integrators() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(SOLVERS, step rule names)`` of ``meanfield.integrate`` and ``meanfield.steps``, or their
    copies in ``meanfield._cli_schema``."""
    from . import _cli_schema

    if "meanfield.integrate" in sys.modules:
        from .integrate import SOLVERS
        from .steps import StepRule

        return tuple(SOLVERS), StepRule.names()  # registered step rules included
    return _cli_schema.SOLVERS, _cli_schema.STEPS


def _frequency_laws() -> tuple[str, ...]:
    """The frequency laws' names (``mf.frequencies.Distribution.names()``: registered ones included),
    or their copy in ``meanfield._cli_schema`` (``FREQUENCIES``) while JAX is not imported."""
    from . import _cli_schema

    if "meanfield.frequencies" in sys.modules:
        from .frequencies import Distribution

        return Distribution.names()
    return _cli_schema.FREQUENCIES


def _noises() -> tuple[str, ...]:
    """The noises' names (``mf.noise.Noise.names()``: registered ones included), or their copy in
    ``meanfield._cli_schema`` (``NOISES``) while JAX is not imported."""
    from . import _cli_schema

    if "meanfield.noise" in sys.modules:
        from .noise import Noise

        return Noise.names()
    return _cli_schema.NOISES


def _step_solvers() -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """The step rules that take some solvers only (``mf.steps.step_solvers``), or their copy in
    ``meanfield._cli_schema`` (``STEP_SOLVERS``) while JAX is not imported."""
    from . import _cli_schema

    if "meanfield.steps" in sys.modules:
        from .steps import step_solvers

        return step_solvers()
    return _cli_schema.STEP_SOLVERS


def _add_model_flags(parser: argparse.ArgumentParser, models: Sequence[Any]) -> None:
    """One flag per parameter of the registry (``mf.kernels.MODELS``, as ``_models()``),
    defaults left to the registry (a flag absent from the command line takes the model's default)."""
    seen: dict[str, list] = {}
    for entry in models:
        for p in entry.params:
            seen.setdefault(p.name, []).append((entry.name, p))
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
        elif getattr(p, "maximum", None) is not None or name.endswith("seed"):
            bound = getattr(p, "maximum", None)
            kw["type"] = _arg(p.kind, maximum=SEED_LIMIT if bound is None else bound)
        elif p.kind == "plane":
            kw["type"] = _arg(p.kind)
        elif p.kind.startswith("int"):
            kw["type"] = _arg(p.kind, maximum=PARAM_LIMIT)
        else:
            kw["type"] = _arg(p.kind, magnitude=PARAM_LIMIT)
        parser.add_argument(_flag(name), **kw)


def _show_default(v: object) -> str:
    if isinstance(v, float) and abs(v - 2 * math.pi) < 1e-12:
        return "2 pi"
    if isinstance(v, tuple):
        return ",".join(map(str, v))
    return f"{v:g}" if isinstance(v, float) else str(v)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (imports no JAX: ``_models()``)."""
    from .reproduce import EXPERIMENTS  # a table of names (the experiments load when run)

    models = _models()
    model_names = tuple(m.name for m in models)
    SOLVERS, STEPS = _integrators()

    p = _Parser(
        prog="meanfield", description="JAX engine for the mathematics of collapse in transformers."
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    s = sub.add_parser(
        "simulate",
        help="simulate one particle system and write figures and observables",
        epilog="exit status: 0 success; 1 the run failed (non-finite state, energy or observable: outputs "
        "written with failed = true and the reason); 2 bad arguments, unwritable --out or --movie (or a "
        "FIFO, device or directory in place of an output file), a run past the resource limits, or a "
        "model of another package that raised (one line on stderr)",
    )
    s.add_argument(
        "--kernel",
        default="usa",
        choices=model_names,
        help="model name from the registry (mf.kernels.MODELS; default usa)",
    )
    s.add_argument(
        "--n", type=_arg("int", minimum=2), default=256, help="number of particles (default 256)"
    )
    s.add_argument(
        "--d",
        type=_arg("int", minimum=2),
        default=3,
        help="dimension of the ambient space (default 3)",
    )
    _add_model_flags(s, models)
    s.add_argument("--t1", type=_arg("float>0"), default=20.0, help="final time (default 20)")
    s.add_argument("--dt", type=_arg("float>0"), default=1e-2, help="time step (default 1e-2)")
    s.add_argument(
        "--solver", default="rk2", choices=SOLVERS, help="integrator (default rk2, projected Heun)"
    )
    s.add_argument(
        "--step",
        default="projected",
        choices=STEPS,
        help="Euler step rule: projected (x + dt P_x F, then normalise; default) or renormalize "
        "(x + dt F, then normalise: the published code's update; --solver euler only)",
    )
    s.add_argument(
        "--noise",
        default=None,
        choices=_noises(),
        help="noise on the tokens (mf.noise): independent (each token its own Brownian motion) or "
        "common (one matrix Brownian motion for all); needs --sigma; its path is drawn from "
        "jax.random.fold_in(jax.random.key(--seed), 1); the Stratonovich Heun step (--solver rk2, or "
        "--solver heun with --rtol/--atol: adaptive)",
    )
    s.add_argument(
        "--sigma",
        type=_arg("float>=0"),
        default=None,
        help="the noise's amplitude sigma (with --noise)",
    )
    s.add_argument(
        "--frequencies",
        default=None,
        choices=_frequency_laws(),
        help="natural frequencies on the circle (--d 2; mf.frequencies): each token rotates at its "
        "own angular velocity, drawn from a lorentzian (half-width --spread) or gaussian (sd --spread) "
        "law; the midpoint quantiles unless --frequency-seed is given",
    )
    s.add_argument(
        "--spread",
        type=_arg("float>0"),
        default=None,
        help="the frequency law's scale (with --frequencies)",
    )
    s.add_argument(
        "--frequency-seed",
        type=_arg("int", minimum=0, maximum=SEED_LIMIT),
        default=None,
        help=f"draw the frequencies independently from jax.random.key(S), S in [0, {SEED_LIMIT}] "
        "(default: the law's midpoint quantiles, no randomness)",
    )
    s.add_argument(
        "--backend",
        default="auto",
        metavar="|".join(BACKENDS),
        help="exp-kernel evaluation: auto (default: the fused C kernel where it was measured faster on "
        "this machine, see `meanfield info`), native (the fused C kernel) or xla",
    )
    s.add_argument(
        "--rtol", type=_arg("float>0"), default=None, help="adaptive solvers: relative tolerance"
    )
    s.add_argument(
        "--atol", type=_arg("float>0"), default=None, help="adaptive solvers: absolute tolerance"
    )
    s.add_argument(
        "--saves",
        type=_arg("int", minimum=2),
        default=101,
        help="number of save times (default 101)",
    )
    s.add_argument(
        "--early-stop",
        type=_arg("float>0"),
        default=None,
        help="paper's early-stop tolerance (e.g. 1e-8)",
    )
    s.add_argument(
        "--seed",
        type=_arg("int", minimum=0, maximum=SEED_LIMIT),
        default=0,
        help=f"random seed in [0, {SEED_LIMIT}] (default 0)",
    )
    s.add_argument(
        "--r0",
        type=_arg("float>0"),
        default=None,
        help="initial radius of every token, for the schemes with one (--normalization pre, mix or "
        "peri: x = r theta, mf.normalization); default 1",
    )
    s.add_argument("--out", default="out/simulate", help="output directory (default out/simulate)")
    s.add_argument(
        "--movie",
        default=None,
        metavar="PATH",
        help="also write a movie of the run, one frame per save: PATH ending in .mp4 (needs the "
        "imageio-ffmpeg package) or .gif (Pillow); checked writable before the run",
    )
    s.add_argument(
        "--force",
        action="store_true",
        help="run past the available memory or the work bound (never past the machine's total memory)",
    )
    s.add_argument(
        "--no-plots",
        action="store_true",
        help="write the numbers only: no configuration.png or observables.png (a --movie is still written)",
    )
    s.add_argument(
        "--quiet",
        action="store_true",
        help=f"no progress bar (shown on stderr for runs estimated longer than {PROGRESS_BAR_S:g} s; the "
        "estimate line and warnings are still printed)",
    )

    r = sub.add_parser(
        "reproduce", help="reproduce the papers' experiments (all of them when no name is given)"
    )
    r.add_argument(
        "experiment",
        nargs="?",
        choices=list(EXPERIMENTS),
        help="one experiment (default: every entry of meanfield.reproduce.PAPERS: the four papers, the mean-field limit, the attention variants' dynamics and noise)",
    )
    r.add_argument("--quick", action="store_true", help="small sizes (minutes on a laptop)")
    r.add_argument(
        "--full", action="store_true", help="the papers' full sizes (where an experiment has them)"
    )
    r.add_argument(
        "--out", default="out/reproduce", help="output directory (default out/reproduce)"
    )
    r.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bars, status line or start lines (each verdict still prints when its experiment ends)",
    )
    r.add_argument(
        "--jobs",
        type=_arg("int", minimum=1),
        default=None,
        help="experiments run at once, each in its own process (default: one per core, at most one per "
        "experiment; 1: one after the other in this process)",
    )

    sub.add_parser(
        "sweep",
        help="run a parameter sweep from a TOML spec (see `meanfield sweep --help`)",
        add_help=False,
    )
    sub.add_parser(
        "plot", help="standard views of a sweep store (see `meanfield plot --help`)", add_help=False
    )
    sub.add_parser(
        "info",
        help="versions, devices, native kernels built or not and why (see `meanfield info --help`)",
        add_help=False,
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """The ``meanfield`` command; returns its exit status.

    ``argv`` None: the process's own arguments (``sys.argv[1:]``), and the process is set up
    for its run once they are parsed (figures without a display, ``_configure_process``).
    A list (a call from Python): those arguments, and no process-wide setting is changed.
    """
    process = argv is None
    if process:  # the `meanfield` process itself: its figures need no display
        os.environ.setdefault("MPLBACKEND", "Agg")
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in ("sweep", "plot"):
            from .sweep import cli as sweep_cli

            if argv[0] == "plot":
                return int(sweep_cli.plot_main(argv[1:]) or 0)
            return int(sweep_cli._sweep(argv[1:], process=process) or 0)
        if argv and argv[0] == "info":
            from . import info

            return int(info.main(argv[1:]) or 0)
        parser = build_parser()
        try:
            args = parser.parse_args(_dash_choices(argv))
        except (
            SystemExit
        ) as e:  # argparse's one-line error (or --help): a status, not an exit of the caller
            return int(e.code or 0)
        if args.command is None:
            parser.print_help()
            return 2
        if args.command == "simulate":
            return _simulate_attributed(args, process=process)
        if args.command == "reproduce":
            return _reproduce(args, process=process)
    except SystemExit as e:  # a sub-command's parser (its one-line error or --help)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except MemoryError:
        print(
            "meanfield: error: out of memory (the estimate was too low: reduce --n, --t1, --saves or lengthen --dt)",
            file=sys.stderr,
        )
        return 2
    except _USER_ERRORS as e:
        print(f"meanfield: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        print("meanfield: interrupted", file=sys.stderr)
        return 130
    return 0


def _dash_choices(argv: list[str]) -> list[str]:
    """``--value -qk`` as ``--value=-qk``: argparse takes a word starting with ``-`` for a flag,
    so a choice of the registry that starts with one (``sa``'s ``value = "-qk"``) is joined to
    its flag."""
    dashed = {
        _flag(p.name): p.choices
        for m in _models()
        for p in m.params
        if p.kind == "choice" and any(str(c).startswith("-") for c in p.choices)
    }
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in dashed and i + 1 < len(argv) and argv[i + 1] in dashed[argv[i]]:
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _configure_process() -> None:
    """Set up the ``meanfield`` process before JAX is imported (its arguments parsed):
    ``meanfield.compilation_cache.configure_process()``. Never from a call of ``main(argv)``."""
    from . import compilation_cache

    compilation_cache.configure_process()


def _one_line(e: BaseException) -> str:
    """An exception as one line: ``reason: path`` for an ``OSError`` on a file."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _output_dir(path: str) -> Path:
    """``path`` created if needed and checked writable (a probe file), before any work is done."""
    import tempfile

    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".meanfield-probe-"):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ValueError(f"--out {path} is not a writable directory ({reason})") from None
    return out


def _json_safe(obj: Any) -> Any:
    """``obj`` with non-finite floats as ``None`` (strict JSON: no ``NaN``/``Infinity``); NumPy and
    JAX scalars and 0-d arrays as their Python value (``json`` writes no ``np.float32``)."""
    if (
        not isinstance(obj, (str, bytes))
        and getattr(obj, "shape", None) == ()
        and hasattr(obj, "item")
    ):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _dumps(obj: Any, **kw: Any) -> str:
    return json.dumps(_json_safe(obj), allow_nan=False, **kw)


def _simulate_cost(args: argparse.Namespace, model: Any, noise: Any = None) -> Any:
    """The run's estimate (``_resources.run_cost``) from the arguments and the model's footprint."""
    import jax.numpy as jnp

    from . import _resources

    return _resources.run_cost(
        n=args.n,
        d=args.d,
        t1=args.t1,
        dt=args.dt,
        saves=args.saves,
        itemsize=jnp.dtype(jnp.result_type(float)).itemsize,
        solver=args.solver,
        footprint=model.footprint(args.n, args.d),
        observables=3,
        clusters=True,
        save_states=True,
        noise=0 if noise is None else math.prod(noise.control_shape(args.n, args.d)),
    )


def _field_rate(model: Any, d: int, backend: str) -> float:
    """This machine's arithmetic rate (flop/s) for ``model``'s field on the default device:
    ``pairs (4 d + 8)`` of ``model.footprint(RATE_PROBE_N, d)`` over the fastest of seven jitted
    evaluations at ``RATE_PROBE_N`` particles (after one that compiles); ``REFERENCE_FLOP_RATE``
    where the model cannot be evaluated there (e.g. more prompts than ``RATE_PROBE_N`` tokens)."""
    import jax

    from . import sphere
    from .kernels._exp import _scope_backend

    n = RATE_PROBE_N
    try:
        x = sphere.uniform(jax.random.key(0), n, d)
        aux = model.default_aux(n)

        @jax.jit
        def field(x: Any) -> Any:
            with _scope_backend(backend):
                return model.at_time(0.0).field(x, aux)

        jax.block_until_ready(field(x))
        best = math.inf
        for _ in range(7):  # the fastest: the least disturbed by other processes
            t0 = time.perf_counter()
            jax.block_until_ready(field(x))
            best = min(best, time.perf_counter() - t0)
    except _USER_ERRORS:
        return REFERENCE_FLOP_RATE
    pairs = float(model.footprint(n, d).pairs)
    return pairs * (4.0 * d + 8.0) / max(best, 1e-9)


def _estimate_seconds(
    cost: Any, model: Any, args: argparse.Namespace
) -> tuple[float, float | None]:
    """``(seconds, rate)``: the run's estimated time, its pair arithmetic (``cost.work`` less the
    loop's overhead) at ``rate``, this machine's (``_field_rate``), plus the overhead at
    ``REFERENCE_FLOP_RATE``; ``rate`` is ``None`` (the reference rate throughout) when even ten times
    slower than the reference the run stays under the thresholds (no time spent measuring)."""
    from . import _resources

    overhead = _resources.STEP_OVERHEAD_FLOP * cost.steps
    pair_work = max(cost.work - overhead, 0.0)
    fixed = overhead / REFERENCE_FLOP_RATE
    reference = pair_work / REFERENCE_FLOP_RATE + fixed
    if reference < min(PROGRESS_BAR_S, ESTIMATE_NOTICE_S) / 10:
        return reference, None
    rate = _field_rate(model, args.d, args.backend)
    return pair_work / rate + fixed, rate


def _format_seconds(seconds: float) -> str:
    """``"45 s"``, ``"12 min"``, ``"2.4 h"``, ``"3.1 days"``."""
    if not math.isfinite(seconds):
        return "forever"
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.2g} {unit}"
    return f"{seconds:.2g} s"


def _simulate_attributed(args: argparse.Namespace, *, process: bool = False) -> int:
    """``_simulate``, where the model is not one of meanfield's own (registered by another
    package: ``meanfield.models`` entry points, or ``register`` at run time): an exception its
    code raised, or any exception that is not a user error, becomes ONE line naming the model and
    its class (``ValueError``: exit status 2), not a traceback nor, for a ``SystemExit`` it raised,
    a silent exit. meanfield's own models: unchanged."""
    try:
        return _simulate(args, process=process)
    except (KeyboardInterrupt, MemoryError):
        raise
    except BaseException as e:  # a model's sys.exit too: not the end of the command, one line
        # the registry is loaded once a model was built (before: no model's code ran)
        registry = sys.modules.get("meanfield.kernels._registry")
        error = None if registry is None else registry.plugin_error(args.kernel, e, "--kernel")
        if error is None:
            raise
        raise error from e


@dataclasses.dataclass(frozen=True)
class _SimulateRun:
    """What ``simulate`` runs, once every check before the run has passed (``_prepare_simulation``):
    the model's parameters as resolved from the flags (``params``) and the model built from them,
    the run's time (``mf.integrate.RunTime``), its noise and frequency law (``None`` without
    ``--noise``, ``--frequencies``), the accepted estimate (``_resources.run_cost``), the ``--out``
    directory, the initial states drawn from ``--seed`` (``x0``), the frequencies drawn from the law
    (or ``None``), the backend ``--backend`` resolved to and the model's token labels (``aux``)."""

    params: dict[str, Any]
    model: Any
    run_time: Any
    noise: Any
    law: Any
    cost: Any
    out: Path
    x0: Any
    frequencies: Any
    resolved: str
    aux: Any


def _simulate(args: argparse.Namespace, *, process: bool = False) -> int:
    """``meanfield simulate``: its stages in order. The flags' checks against each other and the
    model's rules (no JAX yet), the process's settings (``process``: ``_configure_process``), the
    model, the run's description and the checks before the run, the warning and estimate lines,
    the run, its summary, the numbers written to ``--out`` and last the figures, the movie and the
    summary line. Returns the exit status: 0, or 1 for a failed run (its outputs written)."""
    given = _check_simulate_flags(args)  # the parser's copy of the registry: no JAX yet
    if process:
        _configure_process()
    run = _prepare_simulation(args, given)
    warning, seconds = _announce_simulation(args, run)
    traj, wall, ts, euclidean = _run_simulation(args, run, seconds)
    result, e_max = _summarize_simulation(args, run, traj, ts, euclidean, wall, seconds, warning)
    _write_simulation(args, run, traj, result)
    return _report_simulation(args, run, traj, result, e_max)


def _check_simulate_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The checks of ``simulate``'s flags across each other, from the parser's copy of the registry
    (no JAX yet), in this order: a parameter flag of another model, a flag that applies only with
    another's value (``_check_switches``), ``--r0`` (``_check_r0``), the model's size rules,
    ``--backend``, the pairs ``--noise``/``--sigma`` and ``--frequencies``/``--spread``,
    ``--frequency-seed`` without ``--frequencies`` and the solvers of ``--step``'s rule; the first
    refused raises ``ValueError``. Returns the model parameters given as flags, by name."""
    models = _models()
    schema = next(m for m in models if m.name == args.kernel)
    given = {
        p.name: getattr(args, p.name) for m in models for p in m.params if hasattr(args, p.name)
    }
    for name in given:
        if name not in {p.name for p in schema.params}:
            accepted = " ".join(_flag(p.name) for p in schema.params) or "none"
            raise ValueError(
                f"{_flag(name)} is not a parameter of --kernel {args.kernel} (its parameters: {accepted})"
            )
    _check_switches(schema, given)
    _check_r0(args, schema, given)
    sized = {  # the model's size rules (the registry's and a sweep spec's text), before JAX
        p.name: given.get(p.name, p.default)
        for p in schema.params
        if p.name in ("prompts", "plane")
    }
    problem = size_problem(
        sized, n=args.n, d=args.d, required_d=schema.d, model=args.kernel, say=say_cli
    )
    if problem is not None:
        raise ValueError(problem)
    check_backend(args.backend, "--backend")
    from . import _cli_schema

    for member, members in (
        ("noise", _cli_schema.NOISES),
        ("frequencies", _cli_schema.FREQUENCIES),
    ):
        scale, is_what, whose, bound = PAIR_WORDS[member]
        problem = pair_problem(
            member,
            getattr(args, member),
            members,
            scale,
            getattr(args, scale),
            is_what=is_what,
            whose=whose,
            bound=bound,
            say=say_cli,
        )
        if problem is not None:
            raise ValueError(problem)
    if args.frequency_seed is not None and args.frequencies is None:
        raise ValueError("--frequency-seed draws the frequencies of --frequencies: give both")
    limited = {step: (solvers, update) for step, solvers, update in _step_solvers()}
    if (
        args.step in limited
    ):  # the rule's own check (mf.steps.StepRule.check), before JAX is imported
        solvers, update = limited[args.step]
        problem = solver_refusal(args.step, solvers, args.solver, update, say_cli)
        if problem is not None:
            raise ValueError(problem)
    return given


def _prepare_simulation(args: argparse.Namespace, given: dict[str, Any]) -> _SimulateRun:
    """Everything ``simulate`` checks and makes before its warning and estimate lines, in this
    order: the model and the run's description with the estimate accepted
    (``_describe_simulation``), the files it will write (``_check_simulate_outputs``) and the
    initial states with the model's own refusals (``_start_simulation``); nothing of the run's
    size is allocated before its estimate is accepted."""
    params, model, run_time, noise, law, cost = _describe_simulation(args, given)
    out = _check_simulate_outputs(args)
    x0, frequencies, resolved, aux = _start_simulation(args, model, law)
    return _SimulateRun(
        params=params,
        model=model,
        run_time=run_time,
        noise=noise,
        law=law,
        cost=cost,
        out=out,
        x0=x0,
        frequencies=frequencies,
        resolved=resolved,
        aux=aux,
    )


def _describe_simulation(
    args: argparse.Namespace, given: dict[str, Any]
) -> tuple[dict[str, Any], Any, Any, Any, Any, Any]:
    """The model built from the flags (``given`` resolved by its registry entry, ``--`` spelling),
    the fixed-step grid rule (``uniform_saves_problem``), the run's time (``RunTime``, its rules in
    the flags' spelling), the noise and the frequency law with their own refusals, and the run's
    estimate, refused past the resource limits (``_resources.check_cost``, ``--force``). Returns
    ``(params, model, run_time, noise, law, cost)``; ``noise`` and ``law`` are ``None`` when not
    asked for."""
    from . import _resources, kernels
    from .integrate import FIXED_STEP_SOLVERS, RunTime, uniform_saves_problem

    entry = kernels.model_entry(args.kernel)
    params = entry.resolve(given, where="--")
    model = kernels.make(args.kernel, d=args.d, **params)  # small: its parameters, not the run
    # the estimate first: nothing of the run's size is allocated before it is accepted
    if args.solver in FIXED_STEP_SOLVERS:  # item 1's grid rule, before the grid is allocated
        problem = uniform_saves_problem(args.t1, args.dt, args.saves)
        if problem is not None:
            raise ValueError(problem)
    # the run's time as mf.simulate and a sweep's [time] describe it, its rules in the flags'
    # spelling, before the estimate line (the save times are made once the run is accepted)
    run_time = RunTime(
        args.t1, args.dt, args.solver, None, args.rtol, args.atol, args.early_stop, step=args.step
    )
    run_time.check(say=say_cli)
    noise = None
    if args.noise is not None:  # the noise's own refusals, in the flags' spelling
        from .noise import Noise
        from .normalization import scheme_of

        noise = Noise.coerce(args.noise, sigma=args.sigma)
        noise.check(
            solver=args.solver,
            scheme=scheme_of(model),
            step=run_time.rule,
            early_stop=args.early_stop,
            say=say_cli,
        )
    law = None
    if args.frequencies is not None:
        from .frequencies import Distribution, check_run
        from .normalization import scheme_of

        law = Distribution.coerce(args.frequencies, spread=args.spread)
        check_run(
            law=law.name,
            d=args.d,
            scheme=scheme_of(model),
            early_stop=args.early_stop,
            say=say_cli,
        )
    cost = _simulate_cost(args, model, noise)
    _resources.check_cost(cost, force=args.force, what="simulate")
    return params, model, run_time, noise, law, cost


def _check_simulate_outputs(args: argparse.Namespace) -> Path:
    """The ``--out`` directory (``_output_dir``: created and checked writable) and every file the
    run writes, checked before it: each of ``_OUTPUT_FILES`` it writes (``summary.json`` alone with
    ``--no-plots``) a regular file or a new one (``_paths.check_output``: a FIFO there would block
    the write forever, after the run), ``run.zarr`` new or an earlier run's store
    (``_labelled.check_run_path``), and the ``--movie`` path (``plotting._movie_path``; a missing
    writer is a ``ValueError``). Returns the directory."""
    out = _output_dir(args.out)
    # every file the run writes, checked before it: a regular file or a new one (a FIFO there
    # would block the write forever, after the run)
    for name in _OUTPUT_FILES[: 1 if args.no_plots else None]:
        _paths.check_output(out / name, "--out file")
    from . import _labelled

    _labelled.check_run_path(out / _labelled.RUN_STORE)  # new, or a run's store it replaces
    if args.movie is not None:
        from . import plotting

        try:
            plotting._movie_path(args.movie)
        except ImportError as e:
            raise ValueError(f"--movie: {e}") from None
    return out


def _start_simulation(args: argparse.Namespace, model: Any, law: Any) -> tuple[Any, Any, str, Any]:
    """The run's start: the initial states drawn from ``--seed`` (``mf.sphere.uniform``), the
    frequencies drawn from ``law`` (``--frequency-seed``; ``None`` without a law), the backend
    ``--backend`` resolves to (``xla`` on an accelerator), the model's token labels, and the
    model's own refusals of them (``check_config``, e.g. beta overflow) before any warning.
    Returns ``(x0, frequencies, resolved, aux)``."""
    import jax

    from . import kernels, sphere

    x0 = sphere.uniform(jax.random.key(args.seed), args.n, args.d)
    frequencies = (
        None
        if law is None
        else law.sample(
            args.n,
            key=None if args.frequency_seed is None else jax.random.key(args.frequency_seed),
            dtype=x0.dtype,
        )
    )
    # "auto" decided once for the run and recorded in summary.json (backend_resolved): the path of
    # the fused exponential-kernel evaluations (the two paths round differently, ~1e-7 in float32);
    # accelerators run XLA whatever the choice
    resolved = (
        "xla"
        if jax.default_backend() != "cpu"
        else kernels.resolve_backend(args.backend, args.n, args.d, x0.dtype)
    )
    aux = model.default_aux(args.n)
    model.check_config(x0, aux)  # the model's own refusals (e.g. beta overflow) before any warning
    return x0, frequencies, resolved, aux


def _announce_simulation(args: argparse.Namespace, run: _SimulateRun) -> tuple[str | None, float]:
    """The lines on stderr before the run: the long-step warning (``_resources.step_warning``),
    then, for a run estimated past ``ESTIMATE_NOTICE_S``, its estimated time, memory and work
    (``_estimate_seconds``: the rate measured on this machine, or assumed). Returns
    ``(warning, seconds)``: the warning's text (``None`` without one) and the estimated seconds."""
    from . import _resources
    from .integrate import ADAPTIVE_SOLVERS

    warning = _resources.step_warning(
        run.model.interaction_rate(),
        args.dt,
        solver=args.solver,
        dt_name="--dt",
        rescaled_hint="--rescaled",
    )
    if warning:
        print(f"meanfield: {warning}", file=sys.stderr)
    seconds, rate = _estimate_seconds(run.cost, run.model, args)
    if seconds > ESTIMATE_NOTICE_S:
        measured = (
            f"{rate:.2g} flop/s measured on this machine"
            if rate is not None
            else f"{REFERENCE_FLOP_RATE:.2g} flop/s assumed"
        )
        # an adaptive solver's step count is its max_steps bound: so is the time
        bound = "up to " if args.solver in ADAPTIVE_SOLVERS else ""
        print(
            f"meanfield: estimate: {bound}~{_format_seconds(seconds)} and "
            f"~{_resources.format_bytes(run.cost.bytes)} of memory ({run.cost.describe()}; {measured})",
            file=sys.stderr,
            flush=True,
        )
    return warning, seconds


def _run_simulation(
    args: argparse.Namespace, run: _SimulateRun, seconds: float
) -> tuple[Any, float, Any, bool]:
    """The run itself (``mf.simulate``, forward mode) at ``--saves`` equally spaced times, with the
    cluster count as an observable for unit tokens, a progress bar when estimated past
    ``PROGRESS_BAR_S`` (``seconds``) and not ``--quiet``, and the noise keyed from ``--seed``.
    Returns ``(traj, wall, ts, euclidean)``: the trajectory, the run's wall time in seconds (until
    the collapse gap is ready), the save times and whether the tokens are in R^d."""
    import diffrax
    import jax
    import numpy as np

    from . import metrics
    from .geometry import geometry_of
    from .integrate import simulate

    noise = run.noise
    ts = np.linspace(0.0, args.t1, args.saves)
    euclidean = not geometry_of(run.model).on_sphere
    t0 = time.perf_counter()
    traj = simulate(
        run.model,
        run.x0,
        time=run.run_time.replace(ts=ts),
        backend=run.resolved,
        # the cluster count is of unit tokens (angular threshold): none for tokens in R^d
        observables={} if euclidean else {"clusters": lambda x: metrics.num_clusters(x, 0.1)},
        adjoint=diffrax.ForwardMode(),  # no gradients wanted: the plain loop traces faster, same states
        r0=args.r0,
        # a bar over simulated time for a long run: the same numbers (mf.simulate's progress)
        progress=seconds > PROGRESS_BAR_S and not args.quiet,
        noise=noise,
        key=None if noise is None else jax.random.fold_in(jax.random.key(args.seed), 1),
        frequencies=run.frequencies,
    )
    jax.block_until_ready(traj.collapse_gap)
    wall = time.perf_counter() - t0
    return traj, wall, ts, euclidean


def _summarize_simulation(
    args: argparse.Namespace,
    run: _SimulateRun,
    traj: Any,
    ts: Any,
    euclidean: bool,
    wall: float,
    seconds: float,
    warning: str | None,
) -> tuple[dict[str, Any], float | None]:
    """The run's summary (``summary.json``, and the line printed): the settings, the final values
    (collapse gap, energy with the theory's maximum, clusters, the mean radius of a scheme with
    one, the order parameter of a noisy run or one with frequencies), the failure's reasons
    (``_failure_reasons``), the save intervals where the energy decreased (``_energy_decreases``,
    for the exact flow only) with the warnings, the wall time and the estimate. Returns
    ``(result, e_max)``: the summary and the theory's maximum energy (``None`` without one)."""
    import numpy as np

    from . import metrics

    model, params, noise, law = run.model, run.params, run.noise, run.law
    # no energy (a masked kernel, sa): no bound on it either, whatever the model's closed form says
    e_theory = model.max_energy() if traj.energy is not None else None
    e_max = None if e_theory is None else float(np.asarray(e_theory))
    gap = np.asarray(traj.collapse_gap, np.float64)
    energy = np.asarray(traj.energy, np.float64) if traj.energy is not None else None
    clusters = (
        np.full(len(ts), np.nan)
        if euclidean
        else np.asarray(traj.observables["clusters"], np.float64)
    )
    xs = np.asarray(traj.xs)
    # the radii r_i = |x_i| of a scheme with one (mf.normalization.RADIAL; xs: the directions)
    radius = None if traj.radius is None else np.asarray(traj.radius, np.float64)
    reasons = _failure_reasons(traj, gap, energy, None if euclidean else clusters, xs, radius)
    failed = bool(reasons)
    # the exact flow never decreases the energy; a noisy one, or one with frequencies, does
    decreases = (
        _energy_decreases(energy, np.dtype(xs.dtype))
        if energy is not None and noise is None and law is None
        else None
    )
    warnings_ = [warning] if warning else []
    if decreases:
        warnings_.append(
            f"warning: the energy decreased in {decreases} of {len(ts) - 1} save intervals (the exact "
            f"flow never decreases it): the step is too long; use a smaller --dt"
        )
    result = {
        "kernel": args.kernel,
        "n": args.n,
        "d": args.d,
        **{k: (list(v) if isinstance(v, tuple) else v) for k, v in params.items()},
        "t1": args.t1,
        "dt": args.dt,
        "solver": args.solver,
        "step": args.step,
        "seed": args.seed,
        **({} if noise is None else {"noise": noise.name, "sigma": args.sigma}),
        **(
            {}
            if law is None
            else {
                "frequencies": law.name,
                "spread": args.spread,
                **({} if args.frequency_seed is None else {"frequency_seed": args.frequency_seed}),
            }
        ),
        "backend": args.backend,
        "backend_resolved": run.resolved,
        "final_collapse_gap": float(gap[-1]),
        "final_energy": float(energy[-1]) if energy is not None else None,
        "theory_max_energy": e_max,
        "final_clusters": int(clusters[-1]) if np.isfinite(clusters[-1]) else None,
        **(
            {}
            if radius is None
            else {
                "r0": 1.0 if args.r0 is None else args.r0,
                "final_mean_radius": float(np.mean(radius[-1])),
            }
        ),
        **(
            {}
            if noise is None and law is None
            else {  # measured next to the theory's n -> infinity value, where the model has one
                "final_order_parameter": float(np.asarray(metrics.order_parameter(xs[-1]))),
                "theory_order_parameter": model.stationary_order_parameter(
                    args.d, noise=noise, frequencies=law
                ),
            }
        ),
        "stop_time": float(traj.stop_time),
        "stopped": bool(traj.stopped),
        "failed": failed,
        "failure": "; ".join(reasons) if reasons else None,
        "energy_decreases": decreases,
        "warnings": warnings_,
        "num_steps": int(traj.num_steps),
        "wall_time_s": round(wall, 3),
        "estimate": run.cost.describe(),
        "estimated_time_s": float(f"{seconds:.3g}"),
    }
    return result, e_max


def _write_simulation(
    args: argparse.Namespace, run: _SimulateRun, traj: Any, result: dict[str, Any]
) -> None:
    """The run's numbers in ``--out``: ``summary.json`` (``result``, strict JSON), then
    ``run.zarr``, the trajectory as labelled data in a one-point sweep store
    (``_labelled.write_run``; ``mf.sweep.load(out)`` opens it) with the settings as attributes and
    the initial states as drawn (``x0``); an earlier version's ``observables.npz`` there is
    removed."""
    import numpy as np

    from . import _labelled

    out = run.out
    with _paths.open_output(out / "summary.json", "--out file") as f:
        f.write(_dumps(result, indent=2).encode("utf-8"))
    # the run as labelled data, a one-point sweep store (mf.sweep.load(out) opens it): the
    # trajectory's arrays and the settings as attributes (the model's from the flags as given)
    settings: dict[str, Any] = {
        **{f"model.{k}": (list(v) if isinstance(v, tuple) else v) for k, v in run.params.items()},
        **{k: result[k] for k in ("t1", "dt", "solver", "step", "seed", "backend")},
        **{
            k: result[k]
            for k in (
                "backend_resolved",
                "r0",
                "noise",
                "sigma",
                "frequencies",
                "spread",
                "frequency_seed",
            )
            if k in result
        },
        "rtol": args.rtol,
        "atol": args.atol,
        "early_stop": args.early_stop,
    }
    ds = traj.to_xarray(run.model, aux=np.asarray(run.aux), attrs=settings)
    # the initial states as drawn (x at time 0 is them renormalised: not bit for bit)
    ds["x0"] = (("token", "dim"), np.asarray(run.x0), {"description": _X0_DESCRIPTION})
    _labelled.write_run(out / _labelled.RUN_STORE, ds)
    # an earlier version's observables.npz in DIR holds an earlier run's numbers: the run replaces it
    stale = out / "observables.npz"
    if stale.is_file() and not stale.is_symlink():
        stale.unlink()


def _report_simulation(
    args: argparse.Namespace,
    run: _SimulateRun,
    traj: Any,
    result: dict[str, Any],
    e_max: float | None,
) -> int:
    """After the numbers are written: the figures (``_simulate_figures``, not with
    ``--no-plots``; a failure drawing them leaves the numbers) and the ``--movie``, then the summary
    as one JSON line on stdout, the energy-decrease warning and a failed run's warning on stderr.
    Returns the exit status: 1 for a failed run, else 0."""
    import numpy as np

    out = run.out
    # the numbers are written: the figures after them (a failure drawing them leaves the numbers)
    if not args.no_plots:
        _simulate_figures(out, args, traj, np.asarray(run.aux), e_max)
    if args.movie is not None:
        from . import plotting

        plotting.animate(traj, args.movie)
    print(_dumps(result))
    if result["energy_decreases"]:
        print(f"meanfield: {result['warnings'][-1]}", file=sys.stderr)
    if result["failed"]:
        print(
            f"meanfield: warning: the run failed ({result['failure']}); outputs written with failed = true "
            f"to {out}; try --rescaled or a smaller --dt",
            file=sys.stderr,
        )
        return 1
    return 0


def _radial() -> tuple[str, ...]:
    """The schemes whose tokens carry a radius (``mf.normalization.RADIAL``), or their JAX-free
    copy in ``meanfield._cli_schema`` where it has one."""
    from . import _cli_schema

    copy = getattr(_cli_schema, "RADIAL", None)
    if copy is not None and "meanfield.normalization" not in sys.modules:
        return tuple(copy)
    from .normalization import radial_names

    return radial_names()


def _check_switches(schema: Any, given: dict[str, Any]) -> None:
    """A flag given on the command line that applies only with another's values (the parameter's
    own ``applies``, ``meanfield._params.Param.applies``: ``--alpha`` with ``--normalization ngpt``,
    ``--switch-time`` with ``mix``, ``--slope`` with ``--mask alibi``, ...) is refused when the other
    is elsewhere, even at its default value: it would change nothing."""
    defaults = {p.name: p.default for p in schema.params}
    rules = _params.applies_rules(schema.params)
    current = {**defaults, **given}
    for name in given:
        problem = applies_problem(name, given[name], rules.get(name, ()), current, say=say_cli)
        if problem is not None:
            raise ValueError(problem)


def _check_r0(args: argparse.Namespace, schema: Any, given: dict[str, Any]) -> None:
    """``--r0`` only for a scheme with a radius (``--normalization pre``, ``mix``, ``peri``)."""
    if args.r0 is None:
        return
    takes = [p for p in schema.params if p.name == "normalization"]
    scheme = given.get("normalization", takes[0].default) if takes else None
    if scheme not in _radial():
        raise ValueError(radius_problem(scheme, _radial(), f"--kernel {args.kernel}", say_cli))


def _failure_reasons(
    traj: Any, gap: Any, energy: Any, clusters: Any, xs: Any, radius: Any = None
) -> list[str]:
    """Why a run failed, or ``[]``: the engine's flag, or any non-finite state (directions or
    radii), energy or observable (never trust only the flag)."""
    import numpy as np

    reasons = []
    bad_radius = radius is not None and not np.all(np.isfinite(radius))
    if bool(traj.failed) or not np.all(np.isfinite(xs)) or bad_radius:
        t = float(traj.stop_time)
        reasons.append(f"non-finite state at t = {t:g}" if math.isfinite(t) else "non-finite state")
    if energy is not None and not np.all(np.isfinite(energy)):
        reasons.append("non-finite energy")
    if not np.all(np.isfinite(gap)):
        reasons.append("non-finite collapse gap")
    if clusters is not None and not np.all(np.isfinite(clusters)):
        reasons.append("non-finite clusters")
    return reasons


def _energy_decreases(energy: Any, dtype: Any) -> int:
    r"""Save intervals over which the energy fell by more than rounding ($1000\, \varepsilon \max|E|$),
    counted over its finite prefix. The exact flow is a gradient ascent of the energy: a
    decrease means the fixed step overshoots."""
    import numpy as np

    finite = np.isfinite(energy)
    k = int(np.argmin(finite)) if not finite.all() else len(energy)
    E = energy[:k]
    if len(E) < 2:
        return 0
    tol = 1000.0 * float(np.finfo(dtype).eps) * float(np.max(np.abs(E)))
    return int(np.sum(np.diff(E) < -tol))


def _simulate_figures(
    out: Path, args: argparse.Namespace, traj: Any, aux: Any, e_max: float | None
) -> None:
    """The figures of ``meanfield simulate`` in ``out`` (``_simulate_figures_unchecked``), with
    NumPy's and matplotlib's warnings of a failed run's NaN kept off stderr."""
    import warnings

    import matplotlib.pyplot as plt
    import numpy as np

    with warnings.catch_warnings():  # a failed run's NaN must not add lines to stderr
        warnings.simplefilter("ignore")
        _simulate_figures_unchecked(out, args, traj, aux, e_max, plt, np)


def _simulate_figures_unchecked(
    out: Path,
    args: argparse.Namespace,
    traj: Any,
    aux: Any,
    e_max: float | None,
    plt: Any,
    np: Any,
) -> None:
    """``configuration.png`` and ``observables.png`` of a run, on figures of their own (no pyplot:
    ``plt`` is not used). The configuration through ``mf.plotting.projection`` of all the run's
    finite states (the view of ``animate``: the circle for d = 2, the sphere from a fixed camera
    for d = 3, the run's principal plane for d > 3); the observables one panel per quantity the
    run has (collapse gap, energy, cluster count), axis ranges from the data
    (``mf.plotting.data_scale``: a log axis only over a decade or more)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from . import plotting

    xs = np.asarray(traj.xs)
    finite = [i for i in range(len(xs)) if np.all(np.isfinite(xs[i]))]
    last = finite[-1] if finite else None  # a failed run: its last finite state
    x = xs[last] if last is not None else np.zeros_like(xs[0])
    t_shown = float(np.asarray(traj.ts)[last]) if last is not None else float("nan")
    view = plotting.projection(xs[finite] if finite else x[None])
    fig = Figure(figsize=(5.2, 4.6))
    ax = fig.add_subplot()
    labels = np.asarray(aux)
    prompts = np.issubdtype(labels.dtype, np.integer)
    color = labels.astype(float) if labels.shape == (len(x),) else None
    plotting.plot_configuration(
        ax,
        x,
        color=color,
        projection=view,
        title=f"{args.kernel}, n={args.n}, d={args.d}, t={t_shown:g}",
    )
    if color is not None and np.ptp(color) > 0:
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize

        bar = fig.colorbar(
            ScalarMappable(Normalize(float(color.min()), float(color.max())), "viridis"),
            ax=ax,
            shrink=0.8,
            label="prompt" if prompts else "position $s_i$",
        )
        if prompts:
            bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    plotting.savefig(fig, out / "configuration.png")

    ts = np.asarray(traj.ts, np.float64)
    panels: list[tuple[str, Any]] = [("gap", np.asarray(traj.collapse_gap, np.float64))]
    if traj.energy is not None and np.any(np.isfinite(np.asarray(traj.energy, np.float64))):
        panels.append(("energy", np.asarray(traj.energy, np.float64)))
    counts = traj.observables.get("clusters") if isinstance(traj.observables, dict) else None
    if counts is not None and np.any(np.isfinite(np.asarray(counts, np.float64))):
        panels.append(("clusters", np.asarray(counts, np.float64)))
    fig = Figure(figsize=(4.2 * len(panels), 3.4))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, y) in zip(axes, panels):
        # a failed run may keep one finite value: a marker, where a line would draw nothing
        mark = {"marker": "o", "ms": 4} if np.sum(np.isfinite(y)) < 3 else {}
        if name == "gap":
            ax.plot(ts, y, color="C0", **mark)
            plotting.data_scale(ax, y, log=True)
            ax.set_ylabel("collapse gap $G_x$")
        elif name == "energy":
            ax.plot(ts, y, color="C0", label="E(t)", **mark)
            shown = y
            if e_max is not None and np.isfinite(e_max):
                ax.axhline(e_max, color="r", ls="--", label="theory max")
                shown = np.append(y, e_max)
                ax.legend(fontsize=8)
            plotting.data_scale(ax, shown, log=False)
            ax.set_ylabel("energy $E$")
        else:
            ax.step(ts, y, where="post", color="C3", **mark)
            finite_y = y[np.isfinite(y)]
            # +-1 around the counts: room for integer ticks even when the count is constant
            plotting.data_scale(ax, np.concatenate([finite_y - 1.0, finite_y + 1.0]))
            if ax.get_yscale() == "linear":
                ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel("clusters (angle 0.1)")
        if not np.any(np.isfinite(y)):
            ax.text(0.5, 0.5, "no finite value", ha="center", transform=ax.transAxes)
        plotting.data_scale(ax, ts, axis="x", log=False, pad=0.0)
        ax.set_xlabel("t")
    plotting.savefig(fig, out / "observables.png")


def _reproduce(args: argparse.Namespace, *, process: bool = False) -> int:
    from . import reproduce

    if args.quick and args.full:
        raise ValueError("--quick and --full exclude each other; pass at most one")
    if process:
        _configure_process()
    names = [args.experiment] if args.experiment else list(reproduce.PAPERS)
    out = _output_dir(args.out)
    # it writes many files under --out: none may be a FIFO or device (a write would wait forever)
    special = _paths.special_file_under(out)
    if special is not None:
        raise ValueError(
            f"--out {args.out} holds {special[1]} at {special[0]}, not a regular file: meanfield "
            "reproduce writes regular files there; remove it or choose another --out"
        )
    reproduce.run_experiments(
        names,
        out,
        quick=args.quick,
        full=args.full,
        quiet=args.quiet,
        jobs=args.jobs,
        report=args.experiment is None,
    )
    if args.experiment is None:
        print(f"report: {out / 'REPORT.md'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
