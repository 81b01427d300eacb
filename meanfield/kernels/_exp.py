r"""The exp kernels $b(\xi, \zeta) e^{\beta \langle x, y\rangle} / \beta$: their tiled and chunked
evaluation, the fused C kernel as an XLA primitive, the backend setting, ``USA`` and ``DistanceBias``."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .. import _native
from .._checks import (
    RealScalarLike,
    _error_if,
    check_flag,
    check_nonnegative,
    check_positive,
    check_scalar,
    is_concrete,
)
from ._base import Kernel

_native.prepare()  # the C compiler runs here, at this module's first import (inside a trace only if that import is)

__all__ = ['DENSE_MAX', 'DENSE_LIMIT', 'DEFAULT_BLOCK', 'BATCH_BYTES', 'NATIVE_MAX_D', 'ACCELERATOR_BATCH_BYTES', 'BACKENDS', 'set_native', 'native', 'backend_scope', 'native_enabled', 'USA', 'DistanceBias']

#: Largest ``n`` evaluated with the dense ``n x n`` weight matrix; above it, tiles.
DENSE_MAX = 1024
#: Entries of the largest dense weight matrix (``DENSE_MAX^2``): larger problems are tiled.
DENSE_LIMIT = DENSE_MAX**2
#: Row-tile size of the tiled evaluation (column tiles are twice as wide), measured fastest
#: on a 2-core CPU (BENCHMARKS.md): the ``512 x 1024`` tile stays in cache.
DEFAULT_BLOCK = 512
#: Bytes of weight matrix evaluated at once when the field of a batch of systems is vmapped
#: (seeds, beta grids): a ``vmap`` over systems runs them in equal chunks of at most
#: ``BATCH_BYTES // (tile * itemsize)`` systems (``lax.map``), where ``tile`` is ``n^2``
#: (dense) or the ``block x 2 block`` tile, instead of materialising a ``(seeds, n, n)``
#: array. Measured (float32, 2-core CPU): 100 x 512 x 3 vmapped, 15 ms materialised vs
#: 6.6 ms in chunks; larger budgets cost fresh pages (minor faults) on every call.
# The fused C kernel serves the exp kernels up to this dimension; above it the XLA path runs.
# Measured (BENCHMARKS.md, contention table): per call the C kernel needs 3.6x less CPU time than
# XLA's GEMM formulation at d = 3, about the same at d = 8, and 1.25-1.3x more at d >= 12
# (2048 x 12, 4096 x 16), so on a loaded machine it would be the slower path there.
NATIVE_MAX_D = 8

BATCH_BYTES = 2**23
#: The same budget on accelerators (GPU/TPU), where larger kernels keep the device busy and
#: the bound only guards memory (not measured: no accelerator was available).
ACCELERATOR_BATCH_BYTES = 2**30

def _native_state():
    """The native-kernel setting: a JAX configuration state that is part of ``jit``'s cache
    key (``include_in_jit_key``), so a function traced with one setting is never reused under
    the other, and switching back finds the first compilation again. It starts off where
    ``MEANFIELD_NATIVE`` is ``0``/``false``/``no``/``off``."""
    from jax._src import config as jax_config  # no public API defines a state in jit's cache key

    off = os.environ.get("MEANFIELD_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")
    return jax_config.bool_state(
        "meanfield_native_kernels",
        not off,
        "Evaluate exp-kernel fields and energies on the CPU with meanfield's fused C kernel.",
        include_in_jit_key=True,
        include_in_trace_context=True,
    )


_NATIVE = _native_state()
#: Accepted values of the ``backend=`` option of the entry points (``None``: the setting).
BACKENDS = ("native", "xla")


def set_native(enabled) -> bool:
    r"""Use (``True``, the default) or not the fused C kernel for exp-kernel fields on the CPU.

    With it, the field and energy of ``USA`` and of the exp-gauge kernels (``RoPE``,
    ``PhaseField``, ``Gauge``, ``Prompt``, in the gauge frame) run on the CPU as one XLA FFI
    call (``meanfield._native.exp_field_xla``: half the exponentials, no $n \times n$ array, see
    ``exp_kernel.c``); without it, or where it cannot be built (no C compiler,
    ``MEANFIELD_NATIVE=0``), as XLA operations (the reference, and the path on accelerators).
    The numbers agree to rounding (tests/test_kernels_native.py), and so do first and second
    derivatives, which the C kernel evaluates too (tests/test_native_ad.py).

    The setting is part of what JAX traces: it is in ``jit``'s cache key, so a jitted function
    called after a change is traced again for the new setting, and its first compilation is
    found again when the setting returns; no cache is cleared. For a scoped choice use
    ``with mf.kernels.native(False):`` or the ``backend=`` option of ``mf.field``,
    ``mf.velocity``, ``mf.energy`` and ``mf.simulate``. ``jax.export`` cannot serialise the FFI
    call: export with ``set_native(False)``. Returns the previous setting.

    Example:
        >>> import meanfield as mf
        >>> previous = mf.kernels.set_native(False)
        >>> mf.kernels.native_enabled()
        False
        >>> _ = mf.kernels.set_native(previous)
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, got {enabled!r}")
    previous = bool(_NATIVE.value)
    jax.config.update("meanfield_native_kernels", enabled)
    return previous


def native(enabled):
    """Context manager: the native-kernel setting (``set_native``) for the code inside only
    (thread-local; part of ``jit``'s cache key).

    Example:
        >>> import meanfield as mf
        >>> with mf.kernels.native(False):
        ...     mf.kernels.native_enabled()
        False
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, got {enabled!r}")
    return _NATIVE(enabled)


def backend_scope(backend: str | None):
    """Context manager of an entry point's ``backend=`` option: ``"native"`` (the fused C
    kernel on the CPU where it is built, else XLA), ``"xla"`` (the XLA formulation) or
    ``None`` (the current ``set_native`` setting).

    Example:
        >>> import meanfield as mf
        >>> with mf.kernels.backend_scope("xla"):
        ...     mf.kernels.native_enabled()
        False
    """
    if backend is None:
        return contextlib.nullcontext()
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))} or None, got {backend!r}")
    return _NATIVE(backend == "native")


def native_enabled() -> bool:
    """Whether exp-kernel fields traced now use the fused C kernel on the CPU (``set_native``,
    ``native``, ``backend=``, and whether the kernels are built: ``meanfield info``)."""
    return bool(_NATIVE.value) and _native.exp_available()


# ----------------------------------------------------------------------------
# exp kernels: h = b(xi, zeta) exp(beta <x, y>) / beta
# ----------------------------------------------------------------------------


def _tiled_exp(x, log_bias: Callable | None, beta, shift, block_size, gauge=None, parts: str = "FS"):
    """``F = (1/n) W x`` and ``M = (1/n^2) sum_ij W_ij`` with
    ``W_ij = exp(beta <x_i, x_j> - shift + bias_ij)``.

    Dense for ``n <= DENSE_MAX`` (or ``block_size >= n``); otherwise flash-attention
    style tiles: a ``lax.map`` over row tiles of ``block_size`` rows (default
    ``DEFAULT_BLOCK``), each accumulating over column tiles of ``2 * block_size``
    columns with ``lax.scan``. Memory O(n d + block^2): the ``n x n`` matrix is never
    formed (n = 2^17 runs in about 1 GB). ``log_bias(rows, cols)`` returns the
    ``(B, C)`` log-bias (``<= 0``) for row and column indices.

    ``gauge``: optional ``(n, d, d)`` gauge matrices ``Psi_i``; then the weights are those
    of ``y_i = Psi_i x_i`` and ``F_i = Psi_i^T (1/n) sum_j W_ij y_j`` (exp-gauge kernels).

    The exponentials are evaluated as ``exp(beta (<x_i, x_j> - 1))`` (at most 1 on unit
    rows) and the factor ``e^{beta - shift}`` is applied to the reduced results: sums of
    up to ``n^2`` terms never overflow unless the result itself does (DESIGN: factored
    ``e^beta``).

    Without a bias the evaluation goes through ``_exp_op``: on the CPU the fused C kernel
    (``set_native``), else XLA operations whose batching rule runs a vmapped batch of systems
    in cache-sized chunks (``BATCH_BYTES``).

    ``parts``: which results are computed, ``"F"`` (field), ``"S"`` (sum) or ``"FS"``; the
    other is returned as zeros (a field skips the reduction over the weights, an energy
    skips the product with ``x``).
    """
    n, _ = x.shape
    if log_bias is None:
        args = (x, beta) if gauge is None else (x, beta, gauge)
        F, S = _exp_op(block_size, gauge is not None, parts)(*args)
    else:
        F, S = _tiled_exp_unit(x, log_bias, beta, block_size, parts)
    scale = jnp.exp(beta - shift)
    return F * scale, (S / n / n) * scale


def _gauged_exp_unit(x, beta, gauge, block_size, parts: str = "FS"):
    """``_tiled_exp_unit`` without bias, in the frame ``y_i = Psi_i x_i`` when ``gauge`` is given."""
    if gauge is None:
        return _tiled_exp_unit(x, None, beta, block_size, parts)
    y = _apply_gauge(gauge, x)
    F, S = _tiled_exp_unit(y, None, beta, block_size, parts)
    return _apply_gauge_transpose(gauge, F), S


def _apply_gauge(P, x):
    """``y_i = P_i x_i`` as a sum of ``d`` broadcast products (elementwise, fuses; an einsum
    is a batched ``d x d`` matmul per particle, measured 2-8x slower on XLA:CPU)."""
    return sum(P[:, :, j] * x[:, None, j] for j in range(x.shape[-1]))


def _apply_gauge_transpose(P, y):
    """``x_i = P_i^T y_i`` (see ``_apply_gauge``)."""
    return sum(P[:, j, :] * y[:, j, None] for j in range(y.shape[-1]))


def _batch_chunk(n: int, block_size, itemsize: int) -> int:
    """Largest number of systems per chunk of a vmapped batch (``BATCH_BYTES`` of weights)."""
    dense = (block_size is None and n <= DENSE_MAX) or (block_size is not None and block_size >= n)
    if dense:
        tile = n * n
    else:
        b = DEFAULT_BLOCK if block_size is None else int(block_size)
        tile = b * min(2 * b, n)
    return max(1, _batch_bytes() // (tile * itemsize))


def _batch_bytes() -> int:
    """``BATCH_BYTES`` on the CPU, ``ACCELERATOR_BATCH_BYTES`` on other default backends."""
    return BATCH_BYTES if jax.default_backend() == "cpu" else ACCELERATOR_BATCH_BYTES


@functools.cache
def _exp_op(block_size, gauged: bool, parts: str = "FS"):
    """``(x, beta[, gauge]) -> (F, S)`` of ``_gauged_exp_unit`` with a chunked batching rule.

    On the CPU, while ``native_enabled()``, the batch runs as one call of the fused C kernel
    (``_native.exp_field_xla``, gauge transforms included) in a ``platform_dependent`` branch;
    the XLA formulation below is the other branch (accelerators) and the derivative.

    Under ``vmap`` (any nesting: seeds, beta grids) the batch axes are folded into one
    and the systems run in chunks of ``_batch_chunk`` (``lax.map`` of a ``vmap``), so
    at most ``BATCH_BYTES`` of weights are live: a plain ``vmap`` materialises a
    ``(seeds, n, n)`` array that leaves the cache and, past the allocator's threshold,
    costs fresh pages on every call. Derivatives (``custom_jvp`` with symbolic zeros): with the
    native kernel, ``_native_jvp`` (the tangent through the C kernel, ``_exp_tangent``); without
    it, those of the plain formulas (``jax.jvp`` of ``_gauged_exp_unit``, evaluated without
    chunking under ``vmap``). ``grad``, ``jvp`` and higher orders work on both.
    """

    def unit(args):
        x, beta = args[0], args[1]
        return _gauged_exp_unit(x, beta, args[2] if gauged else None, block_size, parts)

    def native(xs, betas, *gauges):
        """The batch through the fused C kernel (an XLA FFI call; CPU only), gauge transforms
        included (``y_i = Psi_i x_i`` on loading, ``Psi_i^T`` on the field)."""
        gauge = None
        if gauged:
            g = gauges[0]
            gauge = g[0] if g.shape[0] != xs.shape[0] else g  # one gauge shared by the batch
        F, S = _native.exp_field_xla(xs, betas, field="F" in parts, gauge=gauge)
        return (jnp.zeros_like(xs) if F is None else F), S

    @jax.custom_batching.custom_vmap
    def batched(xs, betas, *gauges):
        if _native_ok(xs):
            args = (xs, betas, *gauges)
            return jax.lax.platform_dependent(*args, cpu=_varying_as(native, args), default=_varying_as(xla, args))
        return xla(xs, betas, *gauges)

    def xla(xs, betas, *gauges):
        B, n = xs.shape[0], xs.shape[1]
        chunk = _batch_chunk(n, block_size, xs.dtype.itemsize)
        if gauged and gauges[0].shape[0] != B:  # one gauge shared by the batch
            shared = gauges[0][0]
            f = lambda a: unit((a[0], a[1], shared))  # noqa: E731
            args = (xs, betas)
        else:
            f, args = unit, (xs, betas, *gauges)
        if chunk >= B:
            return jax.vmap(f)(args)
        # k equal chunks (a ragged last chunk would compile a second program): pad with
        # copies of the first systems, drop their results
        k = -(-B // chunk)
        chunk = -(-B // k)
        pad = k * chunk - B
        if pad:
            args = jax.tree.map(lambda a: jnp.concatenate([a, a[:pad]]), args)
        split = jax.tree.map(lambda a: a.reshape(k, chunk, *a.shape[1:]), args)
        out = jax.lax.map(jax.vmap(f), split)
        return jax.tree.map(lambda a: a.reshape(k * chunk, *a.shape[2:])[:B], out)

    @batched.def_vmap
    def _rule(axis_size, in_batched, xs, betas, *gauges):
        A = axis_size
        xs = xs if in_batched[0] else jnp.broadcast_to(xs, (A, *xs.shape))
        betas = betas if in_batched[1] else jnp.broadcast_to(betas, (A, *betas.shape))
        B = xs.shape[1]
        flat = [xs.reshape(A * B, *xs.shape[2:]), betas.reshape(A * B)]
        if gauged:
            g = gauges[0]
            if in_batched[2]:  # (A, B or 1, n, d, d)
                g = jnp.broadcast_to(g, (A, B, *g.shape[2:])).reshape(A * B, *g.shape[2:])
            elif g.shape[0] != 1:  # (B, n, d, d), the same for every member of the new axis
                g = jnp.broadcast_to(g, (A, *g.shape)).reshape(A * B, *g.shape[1:])
            flat.append(g)
        F, S = batched(*flat)
        return (F.reshape(A, B, *F.shape[1:]), S.reshape(A, B)), (True, True)

    @jax.custom_jvp
    def op(x, beta, *gauge):
        F, S = batched(x[None], beta[None], *(g[None] for g in gauge))
        return F[0], S[0]

    def _jvp(primals, tangents):
        if _native_ok(primals[0]):
            return _native_jvp(block_size, parts, primals, tangents)
        out = op(*primals)
        tangents = tuple(jnp.zeros(t.shape, t.dtype) if isinstance(t, SymbolicZero) else t for t in tangents)
        _, dout = jax.jvp(lambda *a: unit(a), primals, tangents)
        return out, dout

    op.defjvp(_jvp, symbolic_zeros=True)
    return op


def _native_ok(x) -> bool:
    """Whether exp-kernel evaluations of states like ``x`` traced now take the fused C kernel on
    the CPU (float32/float64, ``d <= NATIVE_MAX_D``, ``native_enabled()``)."""
    return x.dtype in (jnp.float32, jnp.float64) and x.shape[-1] <= NATIVE_MAX_D and native_enabled()


def _native_jvp(block_size, parts: str, primals, tangents):
    r"""The JVP of ``_exp_op`` through the fused C kernel (``tangents``: ``SymbolicZero`` where zero).

    In the frame $y_i = \Psi_i x_i$ (``y = x`` without gauge), with $F^y, S$ the unscaled field and
    sum of ``y`` (one native call) and $dy_i = \Psi_i\, dx_i + d\Psi_i\, x_i$:

    $$dS = 2 \beta n \sum_i \langle dy_i, F^y_i\rangle, \quad dF^y = T(y, dy), \quad dF_i = \Psi_i^\top dF^y_i + d\Psi_i^\top F^y_i,$$

    since $\nabla_{y_i} S = 2 \beta n F^y_i$ ($T$: ``_exp_tangent``). A tangent of ``beta`` adds the XLA formulation's
    (``jax.jvp`` of ``_tiled_exp_unit`` in ``beta``). Everything but $T$ is a few ``O(n d^2)``
    operations; $T$ is linear in $dy$ with a declared transpose (itself), so ``jax.grad``,
    ``jax.vjp`` and Hessian-vector products run the kernel too. The primal $F^y, S$ come from
    the differentiable ``_exp_op`` of ``y``, so higher orders work."""
    x, beta, *gauge = primals
    tx, tbeta, *tgauge = tangents
    zero = lambda t: isinstance(t, SymbolicZero)  # noqa: E731
    G = gauge[0] if gauge else None
    y = x if G is None else _apply_gauge(G, x)
    Fy, S = _exp_op(block_size, False, "FS")(y, beta)
    n = x.shape[0]
    dy = None if zero(tx) else (tx if G is None else _apply_gauge(G, tx))
    if gauge and not zero(tgauge[0]):
        dG = _apply_gauge(tgauge[0], x)
        dy = dG if dy is None else dy + dG
    dFy = jnp.zeros_like(x)
    dS = jnp.zeros((), x.dtype)
    if dy is not None:
        if "F" in parts:
            dFy = _exp_tangent(y, dy, beta)
        if "S" in parts:
            dS = 2 * beta * n * jnp.sum(dy * Fy)
    if not zero(tbeta):
        _, (dFb, dSb) = jax.jvp(lambda b: _tiled_exp_unit(y, None, b, block_size, parts), (beta,), (tbeta,))
        dFy, dS = dFy + dFb, dS + dSb
    F, dF = Fy, dFy
    if G is not None:
        F, dF = _apply_gauge_transpose(G, Fy), _apply_gauge_transpose(G, dFy)
        if not zero(tgauge[0]):
            dF = dF + _apply_gauge_transpose(tgauge[0], Fy)
    if "F" not in parts:
        F, dF = jnp.zeros_like(x), jnp.zeros_like(x)
    if "S" not in parts:
        S, dS = jnp.zeros_like(S), jnp.zeros_like(S)
    return (F, S), (dF, dS)


def _exp_tangent(y, dy, beta):
    r"""$T(y, dy)_i = \frac1n \sum_j [\beta w_{ij} (\langle dy_i, y_j\rangle + \langle y_i, dy_j\rangle) y_j + w_{ij}\, dy_j]$,
    $w_{ij} = e^{\beta (\langle y_i, y_j\rangle - 1)}$: the derivative of the unscaled field of
    ``y`` ``(..., n, d)`` along ``dy`` (``beta`` ``(...)``), one primitive: the fused C kernel on
    the CPU (``_native.exp_tangent``), the XLA formulation on other platforms."""
    return _exp_tangent_p.bind(y, dy, beta)


def _tangent_xla(y, dy, beta):
    """``_exp_tangent`` as XLA operations (the reference; other platforms): ``jax.jvp`` of the
    unscaled field of each system."""
    n, d = y.shape[-2:]
    one = lambda a, da, b: jax.jvp(lambda z: _tiled_exp_unit(z, None, b, None, "F")[0], (a,), (da,))[1]  # noqa: E731
    out = jax.vmap(one)(y.reshape(-1, n, d), dy.reshape(-1, n, d), beta.reshape(-1))
    return out.reshape(y.shape)


def _tangent_abstract(y, dy, beta):
    if y.shape != dy.shape or y.dtype != dy.dtype or beta.shape != y.shape[:-2]:
        raise ValueError(f"exp tangent: y and dy must be (..., n, d) of one dtype and beta (...), got "
                         f"{y.shape} {y.dtype}, {dy.shape} {dy.dtype}, {beta.shape}")
    return dy.update(weak_type=False)


def _tangent_cpu_lowering(ctx, y, dy, beta):
    """The FFI call, with a sharding rule (``_native._tangent_call``: a sharded batch stays
    sharded) where JAX lowers it with its devices, else plain (``_TANGENT_PARTITIONED``)."""
    name = np.dtype(ctx.avals_in[0].dtype).name
    if not _TANGENT_PARTITIONED:
        return jax.ffi.ffi_lowering(_native.EXP_TANGENT_TARGETS[name])(ctx, y, dy, beta)
    call = _native._tangent_call(name)
    return mlir.lower_fun(lambda *a: call(*a), multiple_results=False)(ctx, y, dy, beta)


def _tangent_batch(args, dims):
    size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
    lead = [jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
            for a, d in zip(args, dims, strict=True)]
    return _exp_tangent_p.bind(*lead), 0


def _tangent_jvp(primals, tangents):
    """Linear in ``dy`` (the kernel again); the derivative in ``y`` and ``beta`` (third
    derivatives of the energy) is the XLA formulation's."""
    y, dy, beta = primals
    ty, tdy, tbeta = tangents
    out = _exp_tangent_p.bind(y, dy, beta)
    tout = jnp.zeros_like(out)
    if type(tdy) is not ad.Zero:
        tout = tout + _exp_tangent_p.bind(y, tdy, beta)
    if type(ty) is not ad.Zero or type(tbeta) is not ad.Zero:
        ty, tbeta = ad.instantiate_zeros(ty), ad.instantiate_zeros(tbeta)
        tout = tout + jax.jvp(lambda a, b: _tangent_xla(a, dy, b), (y, beta), (ty, tbeta))[1]
    return out, tout


def _tangent_transpose(ct, y, dy, beta):
    """Symmetric (the Hessian of ``S / (2 beta n)`` in the frame): its own transpose in ``dy``."""
    if ad.is_undefined_primal(y) or ad.is_undefined_primal(beta) or not ad.is_undefined_primal(dy):
        raise NotImplementedError("the exp-kernel tangent is linear in dy only")
    if type(ct) is ad.Zero:
        return None, ad.Zero(dy.aval), None
    return None, _exp_tangent_p.bind(y, ct, beta), None


_exp_tangent_p = Primitive("meanfield_exp_tangent")
_exp_tangent_p.def_impl(lambda y, dy, beta: jax.jit(_exp_tangent_p.bind)(y, dy, beta))
_exp_tangent_p.def_abstract_eval(_tangent_abstract)
mlir.register_lowering(_exp_tangent_p, _tangent_cpu_lowering, platform="cpu")
mlir.register_lowering(_exp_tangent_p, mlir.lower_fun(_tangent_xla, multiple_results=False))
batching.primitive_batchers[_exp_tangent_p] = _tangent_batch
ad.primitive_jvps[_exp_tangent_p] = _tangent_jvp
ad.primitive_transposes[_exp_tangent_p] = _tangent_transpose


def _tangent_needs_devices() -> bool:
    """Declare that the tangent's lowering needs the devices (its CPU lowering holds a
    ``custom_partitioning`` call, which does): no public API declares it, so ``False`` (and the
    call without a sharding rule) where this JAX lacks the table."""
    try:
        from jax._src import dispatch  # no public API: the set of primitives lowered with devices

        dispatch.prim_requires_devices_during_lowering.add(_exp_tangent_p)
        return True
    except (ImportError, AttributeError):
        return False


_TANGENT_PARTITIONED = _tangent_needs_devices()


def _varying_as(f, inputs):
    """``f`` with outputs varying over every manual mesh axis its inputs vary over (inside
    ``shard_map``): an FFI call's outputs carry no such axes, the XLA branch's do, and the
    branches of ``platform_dependent`` must agree."""
    axes = set().union(*(_varying_axes(a) for a in inputs))
    if not axes:  # outside shard_map (or a JAX without varying-axis types): nothing to cast
        return f

    def cast(o):
        missing = tuple(sorted(axes - _varying_axes(o)))
        return jax.lax.pcast(o, missing, to="varying") if missing else o

    return lambda *a: jax.tree.map(cast, f(*a))


def _varying_axes(a) -> set:
    """The manual mesh axes ``a`` varies over (empty where JAX has no such types)."""
    typeof = getattr(jax, "typeof", None)
    mat = getattr(typeof(a), "mat", None) if typeof is not None else None
    return set(getattr(mat, "varying", ()) or ())


def _tiled_exp_unit(x, log_bias, beta, block_size, parts: str = "FS"):
    n, d = x.shape
    want_F, want_S = "F" in parts, "S" in parts
    if block_size is None:
        block_size = n if n <= DENSE_MAX else DEFAULT_BLOCK
    if block_size >= n:
        logits = beta * (x @ x.T - 1.0)
        if log_bias is not None:
            idx = jnp.arange(n)
            logits = logits + log_bias(idx, idx)
        W = jnp.exp(logits)
        F = (W @ x) / n if want_F else jnp.zeros_like(x)
        return F, (jnp.sum(W) if want_S else jnp.zeros((), x.dtype))
    B = int(block_size)
    C = min(2 * B, n)
    R, K = -(-n // B) * B, -(-n // C) * C
    xr = jnp.concatenate([x, jnp.zeros((R - n, d), x.dtype)]) if R > n else x
    xc = jnp.concatenate([x, jnp.zeros((K - n, d), x.dtype)]) if K > n else x
    rows_idx = jnp.minimum(jnp.arange(R), n - 1).reshape(R // B, B)
    cols_idx = jnp.minimum(jnp.arange(K), n - 1).reshape(K // C, C)
    col_ok = (jnp.arange(K) < n).reshape(K // C, C)
    row_ok = (jnp.arange(R) < n).reshape(R // B, B)

    def rows(args):
        xb, ri, rok = args

        def body(carry, inp):
            Fb, sb = carry
            xcol, ci, cok = inp
            logits = beta * (xb @ xcol.T - 1.0)
            if log_bias is not None:
                logits = logits + log_bias(ri, ci)
            W = jnp.where(cok[None, :], jnp.exp(logits), 0.0)  # padded columns add nothing
            return (Fb + W @ xcol if want_F else Fb, sb + jnp.sum(W, axis=1) if want_S else sb), None

        init = (jnp.zeros((B, d), x.dtype), jnp.zeros((B,), x.dtype))
        (Fb, sb), _ = jax.lax.scan(body, init, (xc.reshape(K // C, C, d), cols_idx, col_ok))
        return Fb, jnp.sum(jnp.where(rok, sb, 0.0))

    F, s = jax.lax.map(rows, (xr.reshape(R // B, B, d), rows_idx, row_ok))
    return F.reshape(R, d)[:n] / n, jnp.sum(s)


class _ExpKernel(Kernel):
    """Shared machinery of kernels ``b(xi, zeta) exp(beta <A x, B y>) / beta``."""

    beta: RealScalarLike
    rescaled: bool = eqx.field(static=True, kw_only=True, default=False)

    def __check_init__(self):
        # equinox runs the __check_init__ of every class in the MRO: subclasses inherit these
        check_scalar("beta", self.beta)
        check_positive("beta", self.beta)
        check_flag("rescaled", self.rescaled)

    def _shift(self, dtype):
        beta = jnp.asarray(self.beta, dtype)
        return beta if self.rescaled else jnp.zeros((), dtype)

    def _exp(self, dot):
        beta = jnp.asarray(self.beta, dot.dtype)
        return jnp.exp(beta * dot - self._shift(dot.dtype))

    def check_config(self, x, aux) -> None:
        if self.rescaled or not is_concrete(self.beta):
            return
        dtype = jnp.asarray(x).dtype if hasattr(x, "dtype") else jnp.result_type(float)
        limit = float(np.log(np.finfo(dtype).max))
        beta_max = float(np.max(np.asarray(self.beta)))
        if beta_max >= limit:
            raise ValueError(
                f"beta = {beta_max:g} overflows exp(beta <x, y>) in {np.dtype(dtype).name} "
                f"(limit about {limit:.1f}); build the kernel with rescaled=True "
                f"(field and energy times e^(-beta), an exact change of time scale t = e^(-beta) s; "
                f"see mf.kernels.original_time)"
            )

    def check_traced_energy(self, x, aux):
        """Unless ``rescaled``, the overflow bound of ``check_config`` on a traced ``beta``:
        ``beta >= log(finfo(dtype).max)`` (88.7 in float32) stops ``mf.energy``, ``mf.field`` and
        ``mf.velocity`` with an error instead of returning ``inf`` (or NaN). (``mf.simulate`` does
        not call it: a run records the overflow as a failed run, ``Trajectory.failed``.)"""
        if self.rescaled or is_concrete(self.beta):
            return x
        dtype = jnp.asarray(x).dtype
        limit = float(np.log(np.finfo(dtype).max))
        bad = jnp.any(jnp.asarray(self.beta, dtype) >= limit)
        return _error_if(
            x, bad,
            f"beta overflows exp(beta <x, y>) in {np.dtype(dtype).name} (limit about {limit:.1f}); a traced beta "
            f"was past it: build the kernel with rescaled=True",
        )


class USA(_ExpKernel):
    r"""Unbiased self-attention kernel $h(x, y) = e^{\beta \langle x, y\rangle} / \beta$ (labels ignored).

    $\nabla_x h = e^{\beta \langle x, y\rangle} y$. Maximiser: a Dirac mass (collapse), $E_{\max} = e^\beta / (2 \beta)$.

    Args:
        beta: inverse temperature, ``> 0`` (traced).
        rescaled: multiply by $e^{-\beta}$ (time change, see module docstring).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> k = mf.kernels.USA(1.0)
        >>> float(k(jnp.array([1.0, 0, 0]), 0.0, jnp.array([1.0, 0, 0]), 0.0))  # e / 1
        2.718281...
    """

    def __call__(self, x, xi, y, zeta):
        return self._exp(jnp.dot(x, y)) / self.beta

    def grad_x(self, x, xi, y, zeta):
        return self._exp(jnp.dot(x, y)) * y

    def field(self, x, aux, *, block_size=None):
        beta = jnp.asarray(self.beta, x.dtype)
        return _tiled_exp(x, None, beta, self._shift(x.dtype), block_size, parts="F")[0]

    def energy(self, x, aux, *, block_size=None):
        beta = jnp.asarray(self.beta, x.dtype)
        M = _tiled_exp(x, None, beta, self._shift(x.dtype), block_size, parts="S")[1]
        return M / (2.0 * beta)


class DistanceBias(_ExpKernel):
    r"""Distance-bias kernel $h = e^{-\lambda |s - t|} e^{\beta \langle x, y\rangle} / \beta$ (USA-AV Sec. 5).

    ``lam >= 0``. Its long-time law is still a Dirac mass (Prop. 11): the bias
    reweights interactions but does not prevent collapse.

    Args:
        beta: inverse temperature, ``> 0`` (traced).
        lam: bias rate, ``>= 0`` (traced).
        rescaled: multiply by $e^{-\beta}$ (time change, see module docstring).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> k = mf.kernels.DistanceBias(1.0, 2.0)
        >>> x = jnp.array([1.0, 0.0, 0.0])
        >>> round(float(k(x, 0.0, x, 0.5)), 4)   # e^{-1} e^{1} / 1
        1.0
    """

    lam: RealScalarLike = 0.0

    def __init__(self, beta, lam, *, rescaled: bool = False):
        self.beta, self.lam, self.rescaled = beta, lam, rescaled

    def __check_init__(self):
        check_scalar("beta", self.beta)
        check_positive("beta", self.beta)
        check_scalar("lam", self.lam)
        check_nonnegative("lam", self.lam)

    def __call__(self, x, xi, y, zeta):
        return jnp.exp(-self.lam * jnp.abs(xi - zeta)) * self._exp(jnp.dot(x, y)) / self.beta

    def grad_x(self, x, xi, y, zeta):
        return jnp.exp(-self.lam * jnp.abs(xi - zeta)) * self._exp(jnp.dot(x, y)) * y

    def _both(self, x, aux, block_size):
        beta = jnp.asarray(self.beta, x.dtype)
        lam = jnp.asarray(self.lam, x.dtype)
        s = jnp.asarray(aux, x.dtype)
        bias = lambda ri, ci: -lam * jnp.abs(s[ri][:, None] - s[ci][None, :])  # noqa: E731
        return _tiled_exp(x, bias, beta, self._shift(x.dtype), block_size)

    def field(self, x, aux, *, block_size=None):
        return self._both(x, aux, block_size)[0]

    def energy(self, x, aux, *, block_size=None):
        M = self._both(x, aux, block_size)[1]
        return M / (2.0 * jnp.asarray(self.beta, x.dtype))

