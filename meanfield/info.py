"""``meanfield info``: what this installation runs on, and whether the native kernels work.

One report: meanfield's and its dependencies' versions, JAX's default backend and devices,
whether x64 is enabled, and for each fused CPU kernel of ``meanfield._native`` (the exp-kernel
field, ``exp_kernel.c``; the phase-diagram sweep, ``phase_kernel.c``) whether it is built and
usable (and where ``backend="auto"`` takes it: its crossover, measured on this machine) and, if
not, why (no compiler, ``MEANFIELD_NATIVE=0``, a compiler error recorded with
the compiler's identity, a damaged library, a cache directory or library refused because others
can write it), with the compiler, the cache directory and whether it is private, and the
threads (the most per call, and what a call would use now on this machine's load).
``meanfield info --rebuild-native`` compiles both kernels again (after installing a compiler,
or to clear a recorded failure). It also shows JAX's persistent compilation cache
(``meanfield.compilation_cache``): its directory, on or off (and why), its entries and their
size, and equinox's error mode; ``meanfield info --clear-cache`` empties it. And the models of
other packages (entry-point group ``meanfield.models``): those registered, and those skipped
with the error that skipped them (a plugin that failed to import, called ``sys.exit`` at
import, or that ``register`` refused: ``mf.kernels._registry.PLUGIN_FAILURES``).

``--rebuild-native`` works whatever the cache holds: the import before it loads a cached library
only if it matches its manifest (written after a child process loaded it) and its ELF headers
are whole, so a truncated library cannot crash it; a damaged one is rebuilt.

Environment: ``MEANFIELD_CACHE_DIR`` (the cache directory), ``MEANFIELD_COMPILATION_CACHE=0`` (no
compilation cache), ``MEANFIELD_NATIVE=0`` (no native
kernels), ``MEANFIELD_NATIVE_QUIET=1`` (no line on stderr when they are unavailable), ``CC``,
``MEANFIELD_CC_TIMEOUT`` (seconds a build may take, default 120) and
``MEANFIELD_CC_VERSION_TIMEOUT`` (seconds ``$CC --version`` may take, default 10).

An edge module: nothing in the core imports it. ``summary()`` initialises JAX's backend (it
lists the devices), which an ordinary ``import meanfield`` never does.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
from pathlib import Path
from typing import Any

from . import _native, compilation_cache
from ._native import _cache

__all__ = ["PACKAGES", "summary", "format_summary", "main"]

#: the distributions whose versions ``summary()`` reports (``None`` where not installed)
PACKAGES = ("jax", "jaxlib", "equinox", "diffrax", "optax", "numpy", "xarray", "zarr")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _compiler() -> tuple[str | None, str | None]:
    """``(path, first line of --version)`` of the C compiler the native kernels would use."""
    cc = _cache._compiler()
    if cc is None:
        return None, None
    try:
        lines = _cache._compiler_version(cc).strip().splitlines()
    except RuntimeError as e:  # not runnable, or its --version ran past its timeout
        return cc, f"({e})"
    return cc, lines[0] if lines else ""


def _libraries(source: Path, include: list[str]) -> list[str]:
    """The cached libraries (one per dtype) of ``source`` for the current compiler and CPU."""
    try:
        cc, version = _cache._toolchain()
    except (RuntimeError, OSError):
        return []
    found = []
    for _, defines, _, _ in _cache._BUILDS:
        for _, path in _cache._library_paths(cc, version, source, defines, include):
            if path.exists():
                found.append(str(path))
                break
    return found


def _cache_problem() -> str | None:
    """Why the cache directory is refused (or missing), ``None`` when it is private to this user."""
    try:
        _cache._private_dir(create=False)
    except RuntimeError as e:
        return str(e)
    return None


def _crossover(crossover: _native.Crossover | None) -> dict[str, Any] | None:
    """A measured crossover as ``summary()`` reports it (``None`` stays ``None``)."""
    if crossover is None:
        return None
    return {
        "max_d": crossover.max_d,
        "min_n": crossover.min_n,
        "times": crossover.times,
        "seconds": crossover.seconds,
        "recorded": crossover.recorded,
        "rule": crossover.describe(),
    }


def _plugins() -> dict[str, Any]:
    """The models of other packages: ``{"models": [{"name", "class"}], "failed": [{"entry_point",
    "value", "error"}]}`` (every registered model not meanfield's own; every entry point of
    ``meanfield.models`` that was skipped, with why)."""
    from .kernels import _registry

    return {
        "models": [
            {"name": e.name, "class": f"{e.cls.__module__}.{e.cls.__qualname__}" if e.cls else None}
            for e in _registry.MODELS.values()
            if not e.builtin
        ],
        "failed": [
            {"entry_point": name, "value": f["value"], "error": f["error"]}
            for name, f in _registry.PLUGIN_FAILURES.items()
        ],
    }


def summary() -> dict[str, Any]:
    r"""The installation as a dictionary (JSON-serialisable).

    Keys: ``meanfield`` (version), ``python``, ``platform``, ``packages`` (``{name: version}``
    for ``PACKAGES``), ``jax`` (``backend``, ``devices``, ``x64``) and ``native``: ``disabled``
    (``MEANFIELD_NATIVE=0``), ``cache_dir``, ``cache_problem`` (why
    the directory is refused or missing; ``None`` when it is private to this user), ``quiet``
    (``MEANFIELD_NATIVE_QUIET``), ``compiler`` and ``compiler_version`` (``None`` when there is
    none), ``threads`` (of the phase kernel), ``exp_threads`` (the most of one exp-kernel call)
    and ``exp_threads_now`` (what a call on one system of $2048 \times 3$ would use on the load now; both
    ``None`` when unavailable), and ``exp_kernel`` and
    ``phase_kernel``: ``{"available", "reason", "libraries", "crossover"}`` (``reason`` is
    ``None`` when available; ``libraries`` are the cached shared libraries; ``crossover``: what
    ``backend="auto"`` follows, ``{"max_d", "min_n", "times", "seconds", "recorded", "rule"}``
    measured on this machine, ``None`` when unavailable; the phase kernel's is that of the phase
    diagrams' default dtype, JAX's default float), ``compilation_cache``
    (``meanfield.compilation_cache.info()``: ``enabled``, ``dir``, ``entries``, ``bytes``,
    ``eqx_on_error``, ``problem``) and ``plugins``: the models of other packages registered
    (``models``: ``{"name", "class"}``) and the entry points skipped (``failed``:
    ``{"entry_point", "value", "error"}``).

    Initialises JAX's backend, runs the exp kernel's self-test, builds the phase kernel if it is
    not cached (its first use would), and reads (or measures, a second or two each, once per
    built library) both kernels' crossovers.

    Example:
        >>> import meanfield.info
        >>> d = meanfield.info.summary()
        >>> sorted(d), sorted(d["jax"])
        (['compilation_cache', 'jax', 'meanfield', 'native', 'packages', 'platform', 'plugins', 'python'], ['backend', 'devices', 'x64'])
        >>> exp = d["native"]["exp_kernel"]
        >>> exp["available"] == (exp["reason"] is None)
        True
    """
    import jax

    import meanfield

    from . import phase_diagram  # its XLA sweep kernel is what the phase kernel is timed against

    cc, cc_version = _compiler()
    exp, phase = _native.exp_library(), _native.phase_library()
    exp_ok, phase_ok = exp.available, phase.available
    crossover = exp.crossover
    phase_dtype = jax.dtypes.canonicalize_dtype(float)  # the phase diagrams' default dtype
    phase_crossover = phase_diagram._phase_crossover(phase_dtype) if phase_ok else None
    try:
        include = [_native._exp._exp_include()]
    except (ImportError, AttributeError):
        include = []
    return {
        "meanfield": meanfield.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "jax": {
            "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()],
            "x64": jax.dtypes.canonicalize_dtype(float) == "float64",
        },
        "native": {
            "disabled": _cache._disabled(),
            "cache_dir": str(_cache._cache_dir()),
            "cache_problem": _cache_problem(),
            "quiet": _cache._quiet(),
            "compiler": cc,
            "compiler_version": cc_version,
            "threads": _native.default_threads(),
            "exp_threads": _native.exp_threads() if exp_ok else None,
            "exp_threads_now": _native.exp_threads_now() if exp_ok else None,
            "exp_kernel": {
                "available": exp_ok,
                "reason": exp.reason,
                "libraries": _libraries(_native.EXP_SOURCE, include),
                "crossover": _crossover(crossover),
            },
            "phase_kernel": {
                "available": phase_ok,
                "reason": phase.reason,
                "libraries": _libraries(_native.SOURCE, []),
                "crossover": _crossover(phase_crossover),
            },
        },
        "compilation_cache": compilation_cache.info(),
        "plugins": _plugins(),
    }


def _size(n: int) -> str:
    return (
        f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB" if n >= 2**10 else f"{n} B"
    )


def _format_compilation_cache(cc: dict[str, Any]) -> str:
    """One line: ``compilation cache: on|off (why), DIR, N entries, SIZE; EQX_ON_ERROR=MODE``."""
    if compilation_cache.disabled():
        state = "off (MEANFIELD_COMPILATION_CACHE=0)"
    elif cc.get("problem"):
        state = f"off (refused: {cc['problem']})"
    else:
        state = "on"
    return (
        f"compilation cache: {state}, {cc['dir']}, {cc['entries']} entries, {_size(cc['bytes'])}; "
        f"in-program checks in this process: EQX_ON_ERROR={cc['eqx_on_error']}"
    )


def format_summary(d: dict[str, Any]) -> str:
    """``summary()``'s dictionary as readable lines (what ``meanfield info`` prints).

    Example:
        >>> import meanfield.info
        >>> text = meanfield.info.format_summary(meanfield.info.summary())
        >>> print(text.splitlines()[0])
        meanfield ... (Python ..., ...)
        >>> "exp kernel:" in text and "phase kernel:" in text
        True
    """
    nat = d["native"]
    pkgs = ", ".join(
        f"{k} {v if v is not None else '(not installed)'}" for k, v in d["packages"].items()
    )
    lines = [
        f"meanfield {d['meanfield']} (Python {d['python']}, {d['platform']})",
        f"packages: {pkgs}",
        f"jax: backend {d['jax']['backend']}, devices {', '.join(d['jax']['devices'])}, "
        f"x64 {'on' if d['jax']['x64'] else 'off'}",
        "native CPU kernels (backend='native'; 'auto' follows the crossover below): "
        + (
            "switched off (MEANFIELD_NATIVE=0)"
            if nat.get("disabled")
            else "on"
            if nat["exp_kernel"]["available"]
            else "not available"
        ),
        f"  compiler: {nat['compiler'] or '(none found)'}"
        + (f" ({nat['compiler_version']})" if nat["compiler_version"] else ""),
        f"  cache: {nat['cache_dir']}"
        + (f" ({nat['cache_problem']})" if nat.get("cache_problem") else ""),
        f"  threads: {nat['threads']}"
        + (
            f" (exp kernel: at most {nat['exp_threads']} per call; {nat.get('exp_threads_now')} for a 2048 x 3 system "
            "on the load now)"
            if nat["exp_threads"] is not None
            else ""
        ),
    ]
    for key, name in (("exp_kernel", "exp kernel"), ("phase_kernel", "phase kernel")):
        k = nat[key]
        state = "available" if k["available"] else f"not available: {k['reason']}"
        lines.append(f"  {name}: {state}")
        lines.extend(f"    {path}" for path in k["libraries"])
        if k.get("crossover"):
            lines.append(f"    backend='auto': {k['crossover']['rule']}")
    if "compilation_cache" in d:
        lines.append(_format_compilation_cache(d["compilation_cache"]))
    if "plugins" in d:
        lines.extend(_format_plugins(d["plugins"]))
    return "\n".join(lines)


def _format_plugins(plugins: dict[str, Any]) -> list[str]:
    """``plugins (meanfield.models): NAME (CLASS), ...`` and one line per entry point skipped.

    Example:
        >>> _format_plugins({"models": [], "failed": [
        ...     {"entry_point": "x", "value": "x:X", "error": "SystemExit(0) at import"}]})
        ['plugins (meanfield.models): none registered', "  not registered: 'x' (x:X): SystemExit(0) at import"]
    """
    models = ", ".join(f"{m['name']} ({m['class']})" for m in plugins["models"])
    lines = [f"plugins (meanfield.models): {models or 'none registered'}"]
    lines.extend(
        f"  not registered: {f['entry_point']!r} ({f['value']}): {f['error']}"
        for f in plugins["failed"]
    )
    return lines


def _rebuild() -> dict[str, str | None]:
    """Compile both kernels again (``force``); ``{kernel: error or None}``."""
    errors: dict[str, str | None] = {}
    for key, build in (("exp_kernel", _native.build_exp), ("phase_kernel", _native.build_phase)):
        try:
            build(force=True)
            errors[key] = None
        except RuntimeError as e:
            errors[key] = str(e)
    _native._forget_failures()  # a kernel that failed before is loaded at its next use
    _native.prepare()
    return errors


def main(argv: list[str] | None = None) -> int:
    """``meanfield info [--json] [--rebuild-native] [--clear-cache]``: print ``summary()`` (readable, or JSON).

    ``--rebuild-native`` first removes the cached libraries, manifests and recorded failures of
    both kernels (for this source and compiler) and compiles them again. ``--clear-cache`` first
    empties the compilation cache (``meanfield.compilation_cache.clear()``) and prints how many
    entries it removed (on stderr with ``--json``, so that stdout stays JSON). Returns 0, or 1
    when a rebuild was asked for and a kernel is not built (disabled, no compiler, or a compiler
    error) or the cache could not be emptied (one line on stderr).

    Example:
        >>> import contextlib, io, json
        >>> import meanfield.info
        >>> out = io.StringIO()
        >>> with contextlib.redirect_stdout(out):
        ...     status = meanfield.info.main(["--json"])
        >>> status, sorted(json.loads(out.getvalue()))
        (0, ['compilation_cache', 'jax', 'meanfield', 'native', 'packages', 'platform', 'plugins', 'python'])
    """
    from ._argparse import OneLineParser  # one-line argparse errors, as every meanfield command

    p = OneLineParser(
        prog="meanfield info",
        description="versions, devices, and the native CPU kernels: built or not, and why",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--rebuild-native",
        action="store_true",
        help="remove the cached native kernels (and recorded build failures) and compile them again",
    )
    p.add_argument(
        "--clear-cache",
        action="store_true",
        help="empty the persistent compilation cache (compiled programs; not the native kernels)",
    )
    args = p.parse_args(argv)
    failed = False
    if args.clear_cache:
        where = compilation_cache.cache_dir()
        try:
            removed = compilation_cache.clear()
        except OSError as e:
            print(
                f"meanfield info: error: cannot empty the compilation cache {where}: {e}",
                file=sys.stderr,
            )
            failed = True
        else:
            print(
                f"removed {removed} compilation cache entr{'y' if removed == 1 else 'ies'} from {where}",
                file=sys.stderr if args.json else sys.stdout,
            )
    if args.rebuild_native:
        failed = any(e is not None for e in _rebuild().values()) or failed
    d = summary()
    print(json.dumps(d, indent=2) if args.json else format_summary(d))
    sys.stdout.flush()
    return 1 if failed else 0
