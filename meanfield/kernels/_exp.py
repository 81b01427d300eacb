r"""The exp kernels $b(\xi, \zeta) e^{\beta \langle x, y\rangle} / \beta$: their tiled and chunked
evaluation, the fused C kernel as an XLA primitive, the ``backend`` option, ``USA`` and ``DistanceBias``."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jaxtyping import Array, ArrayLike, Float, Int

from .. import _native, sphere, theory
from .._checks import (
    RealScalarLike,
    _error_if,
    check_int,
    is_concrete,
)
from .._native import BACKENDS, check_backend
from .._precision import ScopedValue, dot, matmul
from .._resources import Footprint, as_float
from ..masks import Mask
from ..models import (
    BETA_DOC,
    RESCALED_DOC,
    ExpProfile,
    _check_normalization,
    _fold_scheme,
    _FoldScheme,
    _normalization_param,
    _SchemeArg,
    _with_scheme_attributes,
    exp_interaction_rate,
    exp_reference_step,
    param,
)
from ..normalization import require_post
from ._base import Kernel, masked_pairwise_field

_native.prepare()  # the C compiler runs here, at this module's first import (inside a trace only if that import is)

__all__ = [
    "DENSE_MAX",
    "DENSE_LIMIT",
    "DEFAULT_BLOCK",
    "BATCH_BYTES",
    "ACCELERATOR_BATCH_BYTES",
    "BACKENDS",
    "check_backend",
    "use_backend",
    "resolve_backend",
    "BackendUnavailable",
    "USA",
    "DistanceBias",
    "tile_shape",
]

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
BATCH_BYTES = 2**23
#: The same budget on accelerators (GPU/TPU), where larger kernels keep the device busy and
#: the bound only guards memory (not measured: no accelerator was available).
ACCELERATOR_BATCH_BYTES = 2**30


#: The backend of exp-kernel evaluations traced now (``meanfield._precision.ScopedValue``): set
#: by the entry points from their ``backend`` argument for their call (``_scope_backend``: a
#: context variable only, the backend being a static argument of their program), and by
#: ``use_backend``, which also puts it in ``jit``'s cache key (a public JAX user context, created at
#: the first ``use_backend``: never at import, which would make every function a user had jitted
#: trace again); never process-wide.
_BACKEND = ScopedValue("auto", "meanfield_backend")


def _scope_backend(backend: str) -> contextlib.AbstractContextManager[Any]:
    """The engine's own scope of ``backend`` (checked) for the evaluations it traces: what
    ``mf.field``, ``mf.energy``, ``mf.simulate`` & co. enter with their resolved ``backend``
    argument (a static argument of their program). Unlike ``use_backend`` it creates no JAX user
    context, so an engine call leaves the cache keys of a user's jitted functions alone."""
    return _BACKEND.internal(check_backend(backend))


def use_backend(backend: str) -> contextlib.AbstractContextManager[Any]:
    """Context manager: the ``backend`` (``check_backend``) of the exp-kernel methods called
    directly inside it (``k.field(x, aux)``, ``k.energy(x, aux)``, in a jitted function of your
    own too: a public JAX user context, part of ``jit``'s cache key, so a function traced under
    one backend is traced again under another), and of ``mf.field``, ``mf.velocity``,
    ``mf.energy`` and ``mf.simulate`` called inside it without their own ``backend=``.
    Outside any ``use_backend`` the backend is ``"auto"``. The JAX user context is created at
    the first ``use_backend`` of the process (creating one changes every cache key: each function
    jitted before is traced once more at its next call); the entry points' own ``backend=``
    creates none.
    ``jax.export`` cannot serialise the FFI call: export under ``use_backend("xla")``.

    Example:
        >>> import jax, meanfield as mf
        >>> k, x = mf.kernels.USA(1.0), mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> with mf.kernels.use_backend("xla"):
        ...     F = k.field(x, mf.positions(8))
        >>> bool(abs(F - mf.field(k, x, backend="xla")).max() == 0)
        True
    """
    return _BACKEND(check_backend(backend))


def _entry_backend(backend: str | None) -> str:
    """The ``backend`` argument of an entry point (``mf.field``, ``mf.simulate``, ...): ``None``
    is the enclosing ``use_backend`` (``"auto"`` outside any), anything else is checked
    (``check_backend``). What it returns is passed on explicitly (a static argument of the run).
    ``"native"`` where the fused kernel is not available here (no compiler, ``MEANFIELD_NATIVE=0``,
    a failed build) is ``BackendUnavailable`` (a ``ValueError``) now, before anything is traced."""
    chosen = _BACKEND.value if backend is None else check_backend(backend)
    if chosen == "native":
        lib = _native.exp_library()
        if not lib.available:
            raise BackendUnavailable(_unavailable_message(lib.reason))
    return chosen


class BackendUnavailable(ValueError, RuntimeError):
    """``backend="native"`` where the fused C kernel cannot run: not available on this machine, a
    dtype or a dimension it does not take. A ``ValueError`` (one line from the CLI; a
    ``RuntimeError`` too, what earlier versions raised for an unavailable kernel); its message
    names the backend, why, and what is accepted."""


def _unavailable_message(reason: str | None) -> str:
    return (
        f"backend='native': the fused C kernel is not available ({reason}); "
        "use backend='xla' or 'auto'"
    )


def resolve_backend(backend: str, n: int, d: int, dtype: Any, *, measured: bool = True) -> str:
    """``"native"`` or ``"xla"``: what ``backend`` runs for systems of ``n`` particles in dimension
    ``d`` of ``dtype`` on the CPU (accelerators run XLA whatever the choice).

    ``"auto"``: the fused kernel where it is available, takes the dtype and ``d`` and (with
    ``measured``, what every call does) was measured faster at ``(n, d)`` on this machine
    (``exp_library().crossover``, read from the record in the kernel cache directory or measured
    at the first use), else XLA. The two paths round differently (float32: about 1e-7 relative),
    so with ``measured`` a call's last bits follow a timing: the crossover record of the cache it
    found (``$MEANFIELD_CACHE_DIR``). It is resolved when a program is traced and stays with that
    program for the process. Pass ``"native"`` or ``"xla"`` for numbers that do not depend on
    any timing. ``measured=False`` drops the timing: the fused kernel wherever it is available
    and takes the dtype and ``d``; a sweep decides ``"auto"`` this way once, when it creates its
    store, and records the decision there (``meanfield.sweep``).

    ``"native"`` where it cannot run: ``BackendUnavailable``, a ``ValueError`` naming why (a dtype
    other than float32/float64, ``d`` above ``meanfield._native.EXP_MAX_D``, the kernel not
    available here, with the reason).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> mf.kernels.resolve_backend("xla", 512, 3, jnp.float32)
        'xla'
        >>> mf.kernels.resolve_backend("auto", 512, 3, jnp.float16)   # no fused kernel for float16
        'xla'
    """
    check_backend(backend)
    if backend == "xla":
        return "xla"
    fits = jnp.dtype(dtype) in (jnp.float32, jnp.float64) and d <= _native.EXP_MAX_D
    lib = _native.exp_library()
    if backend == "auto":
        if not (fits and lib.available):
            return "xla"
        if not measured:
            return "native"
        crossover = lib.crossover
        return "native" if crossover is not None and crossover.prefers_native(n, d) else "xla"
    if jnp.dtype(dtype) not in (jnp.float32, jnp.float64):
        raise BackendUnavailable(
            f"backend='native' runs float32 and float64, got {jnp.dtype(dtype)}; use backend='xla' or 'auto'"
        )
    if d > _native.EXP_MAX_D:
        raise BackendUnavailable(
            f"backend='native' supports d <= {_native.EXP_MAX_D}, got d = {d}; use backend='xla' or 'auto'"
        )
    if not lib.available:
        raise BackendUnavailable(_unavailable_message(lib.reason))
    return "native"


# ----------------------------------------------------------------------------
# exp kernels: h = b(xi, zeta) exp(beta <x, y>) / beta
# ----------------------------------------------------------------------------


def _tiled_exp(
    x: Float[Array, "n d"],
    log_bias: Callable | None,
    beta: Array,
    shift: Array,
    block_size: int | None,
    gauge: Float[Array, "n d d"] | None = None,
    parts: str = "FS",
) -> tuple[Float[Array, "n d"], Float[Array, ""]]:
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

    Without a bias the evaluation goes through ``_exp_op`` with the backend of the context
    (``use_backend``, set by the entry points' ``backend=``) resolved for ``(n, d)``
    (``resolve_backend``): on the CPU the fused C kernel, or XLA operations whose batching rule runs a vmapped batch of systems
    in cache-sized chunks (``BATCH_BYTES``).

    ``parts``: which results are computed, ``"F"`` (field), ``"S"`` (sum) or ``"FS"``; the
    other is returned as zeros (a field skips the reduction over the weights, an energy
    skips the product with ``x``).
    """
    n, d = x.shape
    if log_bias is None:
        args = (x, beta) if gauge is None else (x, beta, gauge)
        backend = resolve_backend(_BACKEND.value, n, d, x.dtype)
        F, S = _exp_op(block_size, gauge is not None, parts, backend)(*args)
    else:
        F, S = _tiled_exp_unit(x, log_bias, beta, block_size, parts)
    scale = jnp.exp(beta - shift)
    return F * scale, (S / n / n) * scale


def _gauged_exp_unit(
    x: Float[Array, "n d"],
    beta: Array,
    gauge: Float[Array, "n d d"] | None,
    block_size: int | None,
    parts: str = "FS",
) -> tuple[Float[Array, "n d"], Float[Array, ""]]:
    """``_tiled_exp_unit`` without bias, in the frame ``y_i = Psi_i x_i`` when ``gauge`` is given."""
    if gauge is None:
        return _tiled_exp_unit(x, None, beta, block_size, parts)
    y = _apply_gauge(gauge, x)
    F, S = _tiled_exp_unit(y, None, beta, block_size, parts)
    return _apply_gauge_transpose(gauge, F), S


def _apply_gauge(P: Float[Array, "n d d"], x: Float[Array, "n d"]) -> Float[Array, "n d"]:
    """``y_i = P_i x_i`` as a sum of ``d`` broadcast products (elementwise, fuses; an einsum
    is a batched ``d x d`` matmul per particle, measured 2-8x slower on XLA:CPU)."""
    return jnp.asarray(sum(P[:, :, j] * x[:, None, j] for j in range(x.shape[-1])))


def _apply_gauge_transpose(P: Float[Array, "n d d"], y: Float[Array, "n d"]) -> Float[Array, "n d"]:
    """``x_i = P_i^T y_i`` (see ``_apply_gauge``)."""
    return jnp.asarray(sum(P[:, j, :] * y[:, j, None] for j in range(y.shape[-1])))


def tile_shape(n: int, block_size: int | None = None) -> tuple[int, int]:
    """The ``(rows, columns)`` of the weights an exp-kernel evaluation forms at once: the whole
    ``(n, n)`` matrix when dense (``n <= DENSE_MAX`` with ``block_size=None``, or ``block_size >= n``),
    else tiles of ``block_size`` (default ``DEFAULT_BLOCK``) rows and twice as many columns. The one
    dense-or-tiled rule: the evaluation, the batch chunking and the cost estimate use it.

    Example:
        >>> tile_shape(256), tile_shape(8192), tile_shape(8192, 256)
        ((256, 256), (512, 1024), (256, 512))
    """
    if (block_size is None and n <= DENSE_MAX) or (block_size is not None and block_size >= n):
        return n, n
    b = DEFAULT_BLOCK if block_size is None else int(block_size)
    return b, min(2 * b, n)


def _batch_chunk(n: int, block_size: int | None, itemsize: int) -> int:
    """Largest number of systems per chunk of a vmapped batch (``BATCH_BYTES`` of weights)."""
    rows, cols = tile_shape(n, block_size)
    return max(1, _batch_bytes() // (rows * cols * itemsize))


def _batch_bytes() -> int:
    """``BATCH_BYTES`` on the CPU, ``ACCELERATOR_BATCH_BYTES`` on other default backends."""
    return BATCH_BYTES if jax.default_backend() == "cpu" else ACCELERATOR_BATCH_BYTES


@functools.cache
def _exp_op(block_size: int | None, gauged: bool, parts: str, backend: str) -> Callable[..., Any]:
    """``(x, beta[, gauge]) -> (F, S)`` of ``_gauged_exp_unit`` with a chunked batching rule.

    ``backend`` (``"native"`` or ``"xla"``, resolved by ``resolve_backend``) is part of the
    cache key: one traced function per backend. With ``"native"``, on the CPU the batch runs as one call of the fused C kernel
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

    def unit(args: tuple[Any, ...]) -> tuple[Array, Array]:
        x, beta = args[0], args[1]
        return _gauged_exp_unit(x, beta, args[2] if gauged else None, block_size, parts)

    def native(xs: Array, betas: Array, *gauges: Array) -> tuple[Array, Array]:
        """The batch through the fused C kernel (an XLA FFI call; CPU only), gauge transforms
        included (``y_i = Psi_i x_i`` on loading, ``Psi_i^T`` on the field)."""
        gauge = None
        if gauged:
            g = gauges[0]
            gauge = g[0] if g.shape[0] != xs.shape[0] else g  # one gauge shared by the batch
        F, S = _native.exp_field_xla(xs, betas, field="F" in parts, gauge=gauge)
        return (jnp.zeros_like(xs) if F is None else F), S

    @jax.custom_batching.custom_vmap
    def batched(xs: Array, betas: Array, *gauges: Array) -> tuple[Array, Array]:
        if backend == "native":
            args = (xs, betas, *gauges)
            return jax.lax.platform_dependent(
                *args, cpu=_varying_as(native, args), default=_varying_as(xla, args)
            )
        return xla(xs, betas, *gauges)

    def xla(xs: Array, betas: Array, *gauges: Array) -> Any:
        B, n = xs.shape[0], xs.shape[1]
        chunk = _batch_chunk(n, block_size, xs.dtype.itemsize)
        if gauged and gauges[0].shape[0] != B:  # one gauge shared by the batch
            shared = gauges[0][0]
            f = lambda a: unit((a[0], a[1], shared))  # noqa: E731
            args: tuple[Array, ...] = (xs, betas)
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
    def _rule(
        axis_size: int, in_batched: Any, xs: Array, betas: Array, *gauges: Array
    ) -> tuple[tuple[Array, Array], tuple[bool, bool]]:
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
    def op(x: Array, beta: Array, *gauge: Array) -> tuple[Array, Array]:
        F, S = batched(x[None], beta[None], *(g[None] for g in gauge))
        return F[0], S[0]

    def _jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
        if backend == "native":
            return _native_jvp(block_size, parts, primals, tangents)
        out = op(*primals)
        tangents = tuple(
            jnp.zeros(t.shape, t.dtype) if isinstance(t, SymbolicZero) else t for t in tangents
        )
        _, dout = jax.jvp(lambda *a: unit(a), primals, tangents)
        return out, dout

    op.defjvp(_jvp, symbolic_zeros=True)
    return op


def _native_jvp(
    block_size: int | None, parts: str, primals: tuple[Any, ...], tangents: tuple[Any, ...]
) -> tuple[tuple[Array, Array], tuple[Array, Array]]:
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
    Fy, S = _exp_op(block_size, False, "FS", "native")(y, beta)
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
        _, (dFb, dSb) = jax.jvp(
            lambda b: _tiled_exp_unit(y, None, b, block_size, parts), (beta,), (tbeta,)
        )
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


def _exp_tangent(y: Array, dy: Array, beta: Array) -> Array:
    r"""$T(y, dy)_i = \frac1n \sum_j [\beta w_{ij} (\langle dy_i, y_j\rangle + \langle y_i, dy_j\rangle) y_j + w_{ij}\, dy_j]$,
    $w_{ij} = e^{\beta (\langle y_i, y_j\rangle - 1)}$: the derivative of the unscaled field of
    ``y`` ``(..., n, d)`` along ``dy`` (``beta`` ``(...)``), one primitive: the fused C kernel on
    the CPU (``_native.exp_tangent``), the XLA formulation on other platforms."""
    return _exp_tangent_p.bind(y, dy, beta)


def _tangent_xla(y: Array, dy: Array, beta: Array) -> Array:
    """``_exp_tangent`` as XLA operations (the reference; other platforms): ``jax.jvp`` of the
    unscaled field of each system."""
    n, d = y.shape[-2:]

    def one(a: Array, da: Array, b: Array) -> Array:
        return jax.jvp(lambda z: _tiled_exp_unit(z, None, b, None, "F")[0], (a,), (da,))[1]

    out = jax.vmap(one)(y.reshape(-1, n, d), dy.reshape(-1, n, d), beta.reshape(-1))
    return out.reshape(y.shape)


def _tangent_abstract(y: Any, dy: Any, beta: Any) -> Any:  # ShapedArrays in, one out
    if y.shape != dy.shape or y.dtype != dy.dtype or beta.shape != y.shape[:-2]:
        raise ValueError(
            f"exp tangent: y and dy must be (..., n, d) of one dtype and beta (...), got "
            f"{y.shape} {y.dtype}, {dy.shape} {dy.dtype}, {beta.shape}"
        )
    return dy.update(weak_type=False)


def _tangent_cpu_lowering(ctx: Any, y: Any, dy: Any, beta: Any) -> Any:  # MLIR values
    """The FFI call, with a sharding rule (``_native._exp._tangent_call``: a sharded batch stays
    sharded) where JAX lowers it with its devices, else plain (``_TANGENT_PARTITIONED``)."""
    name = np.dtype(ctx.avals_in[0].dtype).name
    if not _TANGENT_PARTITIONED:
        return jax.ffi.ffi_lowering(_native.EXP_TANGENT_TARGETS[name])(ctx, y, dy, beta)
    call = _native._exp._tangent_call(name)
    return mlir.lower_fun(lambda *a: call(*a), multiple_results=False)(ctx, y, dy, beta)


def _tangent_batch(args: tuple[Array, ...], dims: tuple[int | None, ...]) -> tuple[Array, int]:
    size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
    lead = [
        jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
        for a, d in zip(args, dims, strict=True)
    ]
    return _exp_tangent_p.bind(*lead), 0


def _tangent_jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Array, Array]:
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


def _tangent_transpose(
    ct: Any, y: Any, dy: Any, beta: Any
) -> tuple[None, Any, None]:  # ad.Zero / UndefinedPrimal
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


def _varying_as(f: Callable[..., Any], inputs: tuple[Any, ...]) -> Callable[..., Any]:
    """``f`` with outputs varying over every manual mesh axis its inputs vary over (inside
    ``shard_map``): an FFI call's outputs carry no such axes, the XLA branch's do, and the
    branches of ``platform_dependent`` must agree."""
    axes = set().union(*(_varying_axes(a) for a in inputs))
    if not axes:  # outside shard_map (or a JAX without varying-axis types): nothing to cast
        return f

    def cast(o: Array) -> Array:
        missing = tuple(sorted(axes - _varying_axes(o)))
        return jax.lax.pcast(o, missing, to="varying") if missing else o

    return lambda *a: jax.tree.map(cast, f(*a))


def _varying_axes(a: Any) -> set[str]:
    """The manual mesh axes ``a`` varies over (empty where JAX has no such types)."""
    typeof = getattr(jax, "typeof", None)
    mat = getattr(typeof(a), "mat", None) if typeof is not None else None
    return set(getattr(mat, "varying", ()) or ())


def _tiled_exp_unit(
    x: Array,
    log_bias: Callable[[Array, Array], Array] | None,
    beta: ArrayLike,
    block_size: int | None,
    parts: str = "FS",
) -> tuple[Array, Array]:
    n, d = x.shape
    want_F, want_S = "F" in parts, "S" in parts
    tile_rows, _ = tile_shape(n, block_size)
    if tile_rows >= n:
        logits = beta * (matmul(x, x.T) - 1.0)
        if log_bias is not None:
            idx = jnp.arange(n)
            logits = logits + log_bias(idx, idx)
        W = jnp.exp(logits)
        F = matmul(W, x) / n if want_F else jnp.zeros_like(x)
        return F, (jnp.sum(W) if want_S else jnp.zeros((), x.dtype))
    B, C = tile_shape(n, block_size)
    R, K = -(-n // B) * B, -(-n // C) * C
    xr = jnp.concatenate([x, jnp.zeros((R - n, d), x.dtype)]) if R > n else x
    xc = jnp.concatenate([x, jnp.zeros((K - n, d), x.dtype)]) if K > n else x
    rows_idx = jnp.minimum(jnp.arange(R), n - 1).reshape(R // B, B)
    cols_idx = jnp.minimum(jnp.arange(K), n - 1).reshape(K // C, C)
    col_ok = (jnp.arange(K) < n).reshape(K // C, C)
    row_ok = (jnp.arange(R) < n).reshape(R // B, B)

    def rows(args: tuple[Array, Array, Array]) -> tuple[Array, Array]:
        xb, ri, rok = args

        def body(
            carry: tuple[Array, Array], inp: tuple[Array, Array, Array]
        ) -> tuple[tuple[Array, Array], None]:
            Fb, sb = carry
            xcol, ci, cok = inp
            logits = beta * (matmul(xb, xcol.T) - 1.0)
            if log_bias is not None:
                logits = logits + log_bias(ri, ci)
            W = jnp.where(cok[None, :], jnp.exp(logits), 0.0)  # padded columns add nothing
            return (
                Fb + matmul(W, xcol) if want_F else Fb,
                sb + jnp.sum(W, axis=1) if want_S else sb,
            ), None

        init = (jnp.zeros((B, d), x.dtype), jnp.zeros((B,), x.dtype))
        (Fb, sb), _ = jax.lax.scan(body, init, (xc.reshape(K // C, C, d), cols_idx, col_ok))
        return Fb, jnp.sum(jnp.where(rok, sb, 0.0))

    F, s = jax.lax.map(rows, (xr.reshape(R // B, B, d), rows_idx, row_ok))
    return F.reshape(R, d)[:n] / n, jnp.sum(s)


@_with_scheme_attributes
class _ExpKernel(Kernel):
    """Shared machinery of kernels ``b(xi, zeta) exp(beta <A x, B y>) / beta``."""

    beta: RealScalarLike = param(1.0, kind="float>0", doc=BETA_DOC)
    rescaled: bool = param(False, kind="bool", static=True, kw_only=True, doc=RESCALED_DOC)
    normalization: _SchemeArg = _normalization_param("normalization")
    alpha: dataclasses.InitVar[RealScalarLike | None] = _normalization_param("alpha")
    switch_time: dataclasses.InitVar[RealScalarLike | None] = _normalization_param("switch_time")

    #: True on a subclass with an ``__init__`` of its own (it folds the scheme itself: ``_fold_scheme``).
    own_init: ClassVar[bool] = False
    __post_init__ = _FoldScheme()  # type: ignore[misc,assignment]

    def __check_init__(self) -> None:
        super().__check_init__()
        _check_normalization(self)

    def field(
        self,
        x: Float[Array, "n d"],
        aux: ArrayLike | None,
        *,
        block_size: int | None = None,
    ) -> Float[Array, "n d"]:
        r"""The unprojected field: the kernel's $F_i$ (``attention_field``) after the normalisation
        of ``normalization`` (``mf.normalization.output``: $\alpha F_i / \|F_i\|$ for nGPT,
        $F_i / \|F_i\|$ for Peri-LN, $F_i$ otherwise), ``(n, d)``.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> x = jnp.array([[1.0, 0.0], [1.0, 0.0]])
            >>> mf.kernels.USA(1.0, normalization="peri").field(x, None).tolist()
            [[1.0, 0.0], [1.0, 0.0]]
        """
        F = self.attention_field(x, aux, block_size=block_size)
        return self.normalization.output(F)

    def attention_field(
        self,
        x: Float[Array, "n d"],
        aux: ArrayLike | None,
        *,
        block_size: int | None = None,
    ) -> Float[Array, "n d"]:
        r"""$F_i = \frac1n \sum_j \nabla_x h(z_i, z_j)$ before any normalisation (``Kernel.field``)."""
        return super().field(x, aux, block_size=block_size)

    def interaction_rate(self) -> ArrayLike:
        r"""$\sqrt\beta\, e^{\beta - 1/2}$, or $\sqrt\beta\, e^{-1/2}$ when ``rescaled``
        (``mf.models.exp_interaction_rate``; ``Model.interaction_rate``)."""
        return exp_interaction_rate(self.beta, self.rescaled)

    #: Weight-sized arrays the XLA formulation holds at once, dense (``(n, n)``) and tiled: XLA:CPU's
    #: measured peak (``compiled.memory_analysis()``, tests/test_cost_model.py) is about one ``(n, n)``
    #: array dense and two tiles tiled; these keep a margin above it. A bias adds one.
    dense_arrays: ClassVar[float] = 1.5
    tile_arrays: ClassVar[float] = 2.5

    def footprint(self, n: int, d: int, *, block_size: int | None = None) -> Footprint:
        """``dense_arrays`` ``(n, n)`` arrays, or ``tile_arrays`` tiles, of the rule ``tile_shape(n,
        block_size)`` in the XLA formulation (the fused C kernel on the CPU forms none: there the
        estimate is an upper bound)."""
        if self.mask is not None:  # the masked evaluation: pairwise (a dense (n, n) for USA)
            return super().footprint(n, d, block_size=block_size)
        rows, cols = tile_shape(n, block_size)
        k = self.dense_arrays if rows >= n else self.tile_arrays
        return Footprint(entries=k * as_float(rows) * as_float(cols), pairs=as_float(n) ** 2)

    def reference_step(self, base_dt: ArrayLike) -> ArrayLike:
        """``Model.reference_step`` in the overflow-free form ``mf.models.exp_reference_step``."""
        return exp_reference_step(self.beta, base_dt, self.rescaled)

    def overflows(self, dtype: Any) -> ArrayLike:
        """Not rescaled: ``beta >= log(finfo(dtype).max)`` (88.7 in float32), as ``check_config`` refuses."""
        if self.rescaled:
            return False
        return np.asarray(self.beta) >= np.log(np.finfo(dtype).max)

    def max_energy(self) -> ArrayLike | None:
        r"""$e^\beta / (2 \beta)$ (a Dirac mass; times $e^{-\beta}$ when ``rescaled``), as for USA in the
        gauge frame of every exp-gauge kernel (``mf.theory.max_energy``); None when masked (no energy)."""
        if self.mask is not None:
            return None
        return theory.max_energy(self.beta, rescaled=self.rescaled)

    def _shift(self, dtype: Any) -> Array:
        beta = jnp.asarray(self.beta, dtype)
        return beta if self.rescaled else jnp.zeros((), dtype)

    def _exp(self, dot: Array) -> Array:
        beta = jnp.asarray(self.beta, dot.dtype)
        return jnp.exp(beta * dot - self._shift(dot.dtype))

    def check_config(self, x: ArrayLike, aux: ArrayLike | None) -> None:
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

    def check_traced_energy(self, x: Array, aux: ArrayLike | None) -> Array:
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
            x,
            bad,
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

    name = "usa"
    summary = "unbiased self-attention exp(beta <x, y>) / beta: collapses to a point"

    @classmethod
    def zonal_profile(cls, rescaled: bool = False) -> ExpProfile:
        r"""The exp profile $h(t) = e^{\beta t} / \beta$ (times $e^{-\beta}$ when ``rescaled``).

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.USA.zonal_profile(rescaled=True).rescaled
            True
        """
        return ExpProfile(rescaled=bool(rescaled))

    def __call__(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, ""]:
        return self._exp(dot(x, y)) / self.beta

    def grad_x(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, " d"]:
        return self._exp(dot(x, y)) * y

    def attention_field(
        self,
        x: Float[Array, "n d"],
        aux: ArrayLike | None,
        *,
        block_size: int | None = None,
    ) -> Float[Array, "n d"]:
        if self.mask is not None:  # dense: (m * e^{beta x x^T}) x, m the mask's pair weights
            return matmul(self.attention_weights(x), x)
        beta = jnp.asarray(self.beta, x.dtype)
        return _tiled_exp(x, None, beta, self._shift(x.dtype), block_size, parts="F")[0]

    def attention_weights(self, x: Float[Array, "n d"]) -> Float[Array, "n n"]:
        r"""The weights of the field as attention, $F = A x$: $A_{ij} = m_{ij} e^{\beta \langle x_i,
        x_j\rangle}$ ($m_{ij} = 1/n$, or the mask's ``pair_weights``; times $e^{-\beta}$ when
        ``rescaled``), ``(n, n)`` (``mf.models.attention_matrix``).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> mf.kernels.USA(1.0, rescaled=True).attention_weights(jnp.array([[1.0, 0.0], [1.0, 0.0]])).tolist()
            [[0.5, 0.5], [0.5, 0.5]]
        """
        n = x.shape[0]
        W = (
            jnp.full((n, n), 1.0 / n, x.dtype)
            if self.mask is None
            else self.mask.pair_weights(n, x.dtype)
        )
        return W * self._exp(matmul(x, x.T))

    def energy(
        self,
        x: Float[Array, "n d"],
        aux: ArrayLike | None,
        *,
        block_size: int | None = None,
    ) -> Float[Array, ""]:
        self.refuse_masked_energy()
        beta = jnp.asarray(self.beta, x.dtype)
        M = _tiled_exp(x, None, beta, self._shift(x.dtype), block_size, parts="S")[1]
        return M / (2.0 * beta)

    def scaled_velocity(
        self,
        x: Float[Array, "n d"],
        groups: Int[Array, " n"],
        *,
        block_size: int = 128,
    ) -> tuple[Float[Array, ""], Float[Array, "n d"]]:
        r"""The velocity of the unmasked Post-LN flow on the sphere in scaled form, ``(c, G)`` with
        $P_{x_i} F_i = e^{c} G_i$: the same field as ``mf.velocity`` of this kernel (its pairs in
        different ``groups`` only), for times at which $F$ itself underflows (``mf.metastability.simulate_long``:
        $t \sim e^{\beta}$, $\beta$ up to thousands).

        For unit rows $e^{\beta \langle x_i, x_j \rangle} = e^{\beta} e^{-\beta |x_i - x_j|^2 / 2}$
        and the pull of $x_i$ on itself is radial, so
        $P_{x_i} F_i = \frac{e^{\beta}}{n} P_{x_i} \sum_j e^{-\beta |x_i - x_j|^2/2} (x_j - x_i)$
        (without the $e^{\beta}$ when ``rescaled``). Each row's sum is taken with its largest exponent
        $c_i$ factored out, and $c = \max_i c_i$ (plus $\beta$ unless ``rescaled``); pairs of one
        group (equal ``groups``: copies of one merged cluster) are left out, since their pull is
        radial and their rounding would swamp a field of $e^{-\beta u}$. ``c = -inf`` when every
        pair is in one group (the field is zero). Row tiles of ``block_size`` (memory
        ``block x n x d``). A mask or a scheme other than Post-LN is refused (``ValueError``):
        this form applies neither.

        Example:
            >>> import jax, jax.numpy as jnp, meanfield as mf
            >>> x = mf.sphere.uniform(jax.random.key(0), 6, 3)
            >>> k = mf.kernels.USA(2.0)
            >>> c, G = k.scaled_velocity(x, jnp.arange(6))
            >>> bool(jnp.allclose(jnp.exp(c) * G, mf.velocity(k, x), atol=1e-6))
            True
        """
        require_post(self, "scaled_velocity")
        if self.mask is not None:
            raise ValueError(
                f"scaled_velocity is the unmasked field; got mask={type(self.mask).__name__}"
            )
        block_size = check_int("block_size", block_size, minimum=1)
        n = x.shape[0]
        dtype = x.dtype
        beta = jnp.asarray(self.beta, dtype)
        # the rescaled kernel's time; the original kernel's field is e^beta times larger
        shift = jnp.zeros((), dtype) if self.rescaled else beta
        B = min(n, block_size)
        R = -(-n // B) * B
        lab = groups
        xp = jnp.concatenate([x, jnp.zeros((R - n,) + x.shape[1:], dtype)]) if R > n else x
        lp = jnp.concatenate([lab, jnp.full((R - n,), -1, lab.dtype)]) if R > n else lab

        def rows(blk: tuple[Array, Array]) -> tuple[Array, Array]:
            xb, lb = blk
            # differences, and 1 - <x_i, x_j> = |x_i - x_j|^2 / 2: on a plateau the pull
            # between clusters is far below the rounding of a summed field
            D = x[None, :, :] - xb[:, None, :]
            a = -0.5 * beta * jnp.sum(D * D, axis=-1)
            a = jnp.where(lb[:, None] == lab[None, :], -jnp.inf, a)
            ci = jnp.max(a, axis=1)
            cs = jnp.where(jnp.isfinite(ci), ci, 0.0)
            S = jnp.sum(jnp.exp(a - cs[:, None])[:, :, None] * D, axis=1) / n
            return ci, sphere.project(xb, S)

        ci, G = jax.lax.map(rows, (xp.reshape(R // B, B, -1), lp.reshape(R // B, B)))
        ci, G = ci.reshape(R)[:n], G.reshape(R, -1)[:n]
        c = jnp.max(ci)
        cs = jnp.where(jnp.isfinite(c), c, 0.0)
        G = G * jnp.exp(ci - cs)[:, None]
        # c = -inf when every pair is in one group: the field is zero and any step is exact
        return c + shift, G


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

    name = "distance-bias"
    summary = "exp(-lam |s - t|) exp(beta <x, y>) / beta: still collapses (Prop. 11)"

    lam: RealScalarLike = param(1.0, kind="float>=0", doc="distance-bias rate")
    dense_arrays, tile_arrays = 2.5, 3.5  # the (rows, cols) log-bias too

    own_init = True

    def __init__(
        self,
        beta: RealScalarLike,
        lam: RealScalarLike,
        *,
        rescaled: bool = False,
        mask: Mask | None = None,
        normalization: Any = "post",
        alpha: RealScalarLike | None = None,
        switch_time: RealScalarLike | None = None,
    ) -> None:
        self.beta, self.lam, self.rescaled, self.mask = beta, lam, rescaled, mask
        self.normalization = normalization
        _fold_scheme(self, alpha=alpha, switch_time=switch_time)

    def max_energy(self) -> None:
        """None: the theory gives no closed form with the bias."""
        return None

    def __call__(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, ""]:
        return (
            jnp.exp(-self.lam * jnp.abs(jnp.subtract(xi, zeta))) * self._exp(dot(x, y)) / self.beta
        )

    def grad_x(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, " d"]:
        return jnp.exp(-self.lam * jnp.abs(jnp.subtract(xi, zeta))) * self._exp(dot(x, y)) * y

    def _both(
        self, x: Float[Array, "n d"], aux: ArrayLike, block_size: int | None
    ) -> tuple[Float[Array, "n d"], Float[Array, ""]]:
        beta = jnp.asarray(self.beta, x.dtype)
        lam = jnp.asarray(self.lam, x.dtype)
        s = jnp.asarray(aux, x.dtype)
        bias = lambda ri, ci: -lam * jnp.abs(s[ri][:, None] - s[ci][None, :])  # noqa: E731
        return _tiled_exp(x, bias, beta, self._shift(x.dtype), block_size)

    def attention_field(
        self,
        x: Float[Array, "n d"],
        aux: ArrayLike | None,
        *,
        block_size: int | None = None,
    ) -> Float[Array, "n d"]:
        if self.mask is not None:
            return masked_pairwise_field(self, x, aux)
        return self._both(x, self.default_aux(x.shape[0]) if aux is None else aux, block_size)[0]

    def energy(
        self,
        x: Float[Array, "n d"],
        aux: ArrayLike | None,
        *,
        block_size: int | None = None,
    ) -> Float[Array, ""]:
        self.refuse_masked_energy()
        M = self._both(x, self.default_aux(x.shape[0]) if aux is None else aux, block_size)[1]
        return M / (2.0 * jnp.asarray(self.beta, x.dtype))
