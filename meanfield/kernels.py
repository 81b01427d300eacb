r"""Interaction kernels $h((x, \xi), (y, \zeta))$ of the USA-AV particle model (MATH.md Sec. 1).

Every kernel is a frozen ``equinox.Module`` whose ``__call__`` evaluates ONE pair::

    kernel(x, xi, y, zeta) -> scalar

with ``x, y`` unit vectors in $\mathbb R^d$ and ``xi, zeta`` their auxiliary labels
(positions $s \in (0, 1]$ or prompt ids). Swept parameters (``beta``, ``lam``,
``omega``) are traced leaves, so a ``vmap`` over them compiles once; shape or
branch settings (``plane``, ``rescaled``) are static.

Besides the single-pair definition (the reference), each kernel offers a
structured evaluation of the whole mean field $F_i = \frac1n \sum_j \nabla_x h(z_i, z_j)$
and of the energy: dense exponentials in row tiles for the exp kernels, the
gauge frame for every exp-gauge kernel (RoPE, phase field, gauge, prompt: USA
in the frame $y_i = \Psi(\xi_i) x_i$), rank 2 in the positions for Toeplitz.

On the CPU the exp-kernel fields and energies (USA and the exp-gauge kernels in their gauge
frame) run by default through a fused C kernel called from XLA (``meanfield._native``,
compiled when this module is first imported on a machine and cached: half the exponentials, no
$n \times n$ array). Their derivatives run there too: ``jax.grad`` of an energy needs only the
field ($\nabla_{y_i} S = 2 \beta n F_i$), and the tangent of the field along $dy$ is again a
symmetric pair sum evaluated by the same C kernel in one pass (``_exp_tangent``, a primitive
that is its own transpose), so ``jax.jvp`` of the velocity, ``jax.grad``/``jax.vjp`` through
``mf.simulate`` and Hessian-vector products (``mf.analysis``) use it. The XLA formulation is the
reference and what accelerators run, and what ``backend="xla"``, ``native(False)``,
``set_native(False)`` (all part of what JAX traces) or ``MEANFIELD_NATIVE=0`` select.
BENCHMARKS.md has the measured speed of both.

Models are named in one registry, ``MODELS`` (``make``, ``build``): the CLI flags, sweep spec
keys and reproductions derive from it.

Large ``beta``: $e^{\beta \langle x, y\rangle}$ overflows float32 past $\beta \approx 88$. With
``rescaled=True`` an exp kernel is multiplied by $e^{-\beta}$:
$h = e^{\beta (\langle x, y\rangle - 1)} / \beta$. This is an exact change of time scale:
the rescaled flow at time $s$ is the original flow at time $t = e^{-\beta} s$
(``mf.kernels.original_time``), energies are $e^{-\beta}$ times the original.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jaxtyping import Array, Float

from . import _native, sphere, theory
from ._checks import (
    RealScalarLike,
    _error_if,
    check_finite,
    check_flag,
    check_int,
    check_nonnegative,
    check_orthogonal,
    check_plane,
    check_positive,
    check_scalar,
    is_concrete,
    traced_finite,
    traced_labels,
)
from .models import Model, SelfAttention, positions

_native.prepare()  # the C compiler runs here, at this module's first import (inside a trace only if that import is)

__all__ = [
    "Kernel",
    "GaugeKernel",
    "USA",
    "DistanceBias",
    "Toeplitz",
    "ToeplitzSeries",
    "RoPE",
    "PhaseField",
    "Gauge",
    "Prompt",
    "FourierPhase",
    "WavyGauge",
    "positions",
    "pairwise_field",
    "pairwise_energy",
    "original_time",
    "rescaled_time",
    "DENSE_MAX",
    "DENSE_LIMIT",
    "DEFAULT_BLOCK",
    "BATCH_BYTES",
    "NATIVE_MAX_D",
    "ACCELERATOR_BATCH_BYTES",
    "BACKENDS",
    "set_native",
    "native",
    "backend_scope",
    "native_enabled",
    "random_gauges",
    "default_phase",
    "wavy_gauge",
    "PARAM_KINDS",
    "Param",
    "ModelEntry",
    "MODELS",
    "MODEL_NAMES",
    "model_entry",
    "build",
    "make",
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


def original_time(s, beta):
    r"""Original time $t = e^{-\beta} s$ of rescaled time ``s`` (``rescaled=True`` kernels).

    Args:
        s: rescaled time (scalar or array).
        beta: inverse temperature of the kernel.

    Returns:
        $t$, broadcast shape of ``s`` and ``beta``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.kernels.original_time(1.0, 2.0)), 4)   # e^{-2}
        0.1353
    """
    return jnp.exp(-jnp.asarray(beta)) * s


def rescaled_time(t, beta):
    r"""Rescaled time $s = e^\beta t$ of original time ``t`` (inverse of ``original_time``).

    Args:
        t: original time (scalar or array).
        beta: inverse temperature of the kernel.

    Returns:
        $s$, broadcast shape of ``t`` and ``beta``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.kernels.rescaled_time(1.0, 2.0)), 4)   # e^{2}
        7.3891
    """
    return jnp.exp(jnp.asarray(beta)) * t


class Kernel(Model):
    r"""Abstract base of the pair kernels: a symmetric interaction $h((x, \xi), (y, \zeta))$.

    Subclasses define ``__call__`` (one pair: ``x, y`` of shape ``(d,)``, scalar labels,
    scalar result; ``abc.abstractmethod``). ``grad_x`` defaults to autodiff of ``__call__``;
    ``field`` ($F_i = \frac1n \sum_j \nabla_x h(z_i, z_j)$, ``(n, d)``) and ``energy``
    ($E = \frac{1}{2 n^2} \sum_{i,j} h(z_i, z_j)$, scalar) default to the pairwise reference
    ($O(n^2)$ pairs through ``vmap``), overridden by structured evaluations. A kernel is a
    ``mf.models.Model`` with a pair energy (``has_energy``).

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> class Linear(mf.kernels.Kernel):     # h = <x, y>: a new kernel is one method
        ...     def __call__(self, x, xi, y, zeta):
        ...         return jnp.dot(x, y)
        >>> x = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> bool(jnp.allclose(mf.field(Linear(), x), jnp.mean(x, axis=0) * jnp.ones((8, 1)), atol=1e-6))
        True
    """

    has_energy: ClassVar[bool] = True

    @abc.abstractmethod
    def __call__(self, x, xi, y, zeta):
        r"""$h((x, \xi), (y, \zeta))$ of one pair (scalar)."""

    def grad_x(self, x, xi, y, zeta):
        r"""$\nabla_x h((x, \xi), (y, \zeta))$ (Euclidean gradient in $\mathbb R^d$, shape ``(d,)``).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> e = jnp.array([1.0, 0.0, 0.0])
            >>> mf.kernels.Toeplitz(1).grad_x(e, 0.0, e, 0.0).tolist()   # cos(0) y
            [1.0, 0.0, 0.0]
        """
        return jax.grad(self.__call__, argnums=0)(x, xi, y, zeta)

    # structured evaluations (overridden) --------------------------------
    def field(self, x, aux, *, block_size=None) -> Float[Array, "n d"]:
        r"""$F_i = \frac1n \sum_j \nabla_x h(z_i, z_j)$ for all $i$ (unprojected), ``(n, d)``.

        Args:
            x: ``(n, d)`` unit rows.
            aux: ``(n,)`` labels.
            block_size: row-tile size of the tiled evaluations (``None``: automatic).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> x = jnp.array([[1.0, 0.0], [1.0, 0.0]])
            >>> mf.kernels.Toeplitz(1).field(x, jnp.array([0.0, 1.0])).tolist()   # cos(2 pi) = 1
            [[1.0, 0.0], [1.0, 0.0]]
        """
        return pairwise_field(self, x, aux)

    def energy(self, x, aux, *, block_size=None) -> Float[Array, ""]:
        r"""$E = \frac{1}{2 n^2} \sum_{i,j} h(z_i, z_j)$ (scalar).

        Args:
            x: ``(n, d)`` unit rows.
            aux: ``(n,)`` labels.
            block_size: row-tile size of the tiled evaluations (``None``: automatic).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> x = jnp.array([[1.0, 0.0], [1.0, 0.0]])
            >>> float(mf.kernels.Toeplitz(1).energy(x, jnp.array([0.0, 1.0])))   # 1/2 * mean of 1
            0.5
        """
        return pairwise_energy(self, x, aux)

    def check_traced_energy(self, x, aux):
        """``x`` with the in-program checks of ``mf.energy`` (and ``mf.field``, ``mf.velocity``) attached
        (``equinox.error_if``) for traced parameters whose energy or field would not be finite; no-op by
        default (``_ExpKernel``: overflow).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> x = jnp.eye(3)
            >>> bool(jnp.all(mf.kernels.USA(1.0).check_traced_energy(x, mf.positions(3)) == x))
            True
        """
        return x


def pairwise_field(kernel: Kernel, x, aux):
    r"""Reference $F_i = \frac1n \sum_j \nabla_x h((x_i, \xi_i), (x_j, \xi_j))$ (``kernel.grad_x``) by two vmaps.

    Args:
        kernel: a ``Kernel``.
        x: ``(n, d)`` unit rows.
        aux: ``(n,)`` labels.

    Returns:
        ``(n, d)`` unprojected field.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> k, x, s = mf.kernels.Toeplitz(1), mf.sphere.uniform(jax.random.key(0), 8, 3), mf.positions(8)
        >>> bool(jnp.allclose(mf.kernels.pairwise_field(k, x, s), k.field(x, s), atol=1e-5))
        True
    """
    row = jax.vmap(kernel.grad_x, in_axes=(None, None, 0, 0))
    return jax.vmap(lambda xi, ai: jnp.mean(row(xi, ai, x, aux), axis=0))(x, aux)


def pairwise_energy(kernel: Kernel, x, aux):
    r"""Reference $E = \frac{1}{2 n^2} \sum_{i,j} h((x_i, \xi_i), (x_j, \xi_j))$ (``kernel``) by two vmaps.

    Args:
        kernel: a ``Kernel``.
        x: ``(n, d)`` unit rows.
        aux: ``(n,)`` labels.

    Returns:
        scalar energy.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> k, x, s = mf.kernels.USA(1.0), mf.sphere.uniform(jax.random.key(0), 8, 3), mf.positions(8)
        >>> bool(jnp.allclose(mf.kernels.pairwise_energy(k, x, s), k.energy(x, s), rtol=1e-5))
        True
    """
    row = jax.vmap(kernel, in_axes=(None, None, 0, 0))
    H = jax.vmap(lambda xi, ai: row(xi, ai, x, aux))(x, aux)
    return 0.5 * jnp.mean(H)


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


class Toeplitz(Kernel):
    r"""Toeplitz kernel $h = \cos(2 \pi m (t - s)) \langle x, y\rangle$.

    Maximiser: the uniform great circle traversed ``m`` times, $E_{\max} = 1/4$.
    Rank 2 in the positions ($\cos(a - b) = \cos a \cos b + \sin a \sin b$), so the
    field costs $O(n d)$: $F_i = \frac1n (c_i \sum_j c_j x_j + s_i \sum_j s_j x_j)$.

    Args:
        m: integer frequency, ``m >= 1``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> s = mf.positions(8)
        >>> x = jnp.stack([jnp.cos(2 * jnp.pi * s), jnp.sin(2 * jnp.pi * s), 0 * s], axis=1)
        >>> round(float(mf.energy(mf.kernels.Toeplitz(1), x, s)), 4)   # great circle: 1/4
        0.25
    """

    m: RealScalarLike = 1

    def __check_init__(self):
        check_scalar("m", self.m)
        check_positive("m", self.m)

    def __call__(self, x, xi, y, zeta):
        return jnp.cos(2 * jnp.pi * self.m * (zeta - xi)) * jnp.dot(x, y)

    def grad_x(self, x, xi, y, zeta):
        return jnp.cos(2 * jnp.pi * self.m * (zeta - xi)) * y

    def _cs(self, x, aux):
        theta = 2 * jnp.pi * jnp.asarray(self.m, x.dtype) * jnp.asarray(aux, x.dtype)
        return jnp.cos(theta), jnp.sin(theta)

    def field(self, x, aux, *, block_size=None):
        c, s = self._cs(x, aux)
        n = x.shape[0]
        return (c[:, None] * (c @ x) + s[:, None] * (s @ x)) / n

    def energy(self, x, aux, *, block_size=None):
        c, s = self._cs(x, aux)
        a, b = c @ x, s @ x
        return (jnp.sum(a * a) + jnp.sum(b * b)) / (2.0 * x.shape[0] ** 2)


class ToeplitzSeries(Kernel):
    r"""Toeplitz kernel with a finite Fourier series (USA-AV Prop. 10, App. G): $h = c(t - s) \langle x, y\rangle$,

    $$c(\Delta) = \sum_{|m| \le M} \hat c(m) e^{2 \pi i m \Delta} = \hat c(0) + 2 \sum_{m=1}^{M} \hat c(m) \cos(2 \pi m \Delta),$$

    an even real profile ($\hat c(-m) = \hat c(m)$), any signs. ``Toeplitz(m)`` is the series with
    $\hat c(m) = 1/2$ alone. Rank $2M + 1$ in the positions, so the field costs $O(n M d)$.

    Maximiser (Prop. 10; its statement was lost in extraction, reconstructed here from the
    separated-kernel reduction of Sec. 3.2). Expand a path $x(s) = \sum_k \hat x(k) e^{2 \pi i k s}$:

    $$\mathcal E[\Gamma[x]] = \frac12 \iint c(t - s) \langle x(s), x(t)\rangle\, ds\, dt = \frac12 \sum_{k \in \mathbb Z} \hat c(k) |\hat x(k)|^2, \qquad \sum_k |\hat x(k)|^2 = \int |x(s)|^2 ds = 1$$

    (Parseval), so $\mathcal E \le \frac12 \max_k \hat c(k)$, with equality iff $\hat x$ lives on the
    maximising frequencies. For a unique dominant mode $m^* = \arg\max_{m \ge 0} \hat c(m)$ (modes
    $m > M$ have $\hat c = 0$) the maximiser is $x(s) = \cos(2 \pi m^* s) a + \sin(2 \pi m^* s) b$
    ($a \perp b$ unit vectors): a great circle traversed $m^*$ times (winding number $m^*$), or a Dirac
    mass if $m^* = 0$. The same holds exactly for $n$ particles at $s_i = i/n$ with the aliased
    coefficients $\hat c_n(k) = \sum_{l \equiv k \ (\mathrm{mod}\ n)} \hat c(l)$, $k = 0, \dots, n - 1$
    (discrete Parseval): $E_{\max} = \frac12 \max_k \hat c_n(k)$ (``max_energy(n)``).

    Args:
        c_hat: Fourier coefficients $\hat c(0), \dots, \hat c(M)$, shape ``(M + 1,)`` (traced).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> k = mf.kernels.ToeplitzSeries([0.0, 0.1, 0.4])   # dominant mode m* = 2
        >>> k.dominant_mode(), round(float(k.max_energy()), 4)
        (2, 0.2)
        >>> x = k.maximiser(16)   # the great circle traversed twice
        >>> round(float(mf.energy(k, x, mf.positions(16))), 4)
        0.2
    """

    c_hat: Float[Array, " modes"]

    def __init__(self, c_hat):
        if is_concrete(c_hat):
            try:
                arr = np.asarray(c_hat)
            except (TypeError, ValueError):
                raise TypeError(f"c_hat must be a 1-d sequence of real Fourier coefficients, got {c_hat!r}") from None
            if arr.dtype.kind not in "iuf":
                raise TypeError(f"c_hat must be real Fourier coefficients c_hat(0..M), got {c_hat!r}")
            c_hat = jnp.asarray(arr if arr.dtype.kind == "f" else arr.astype(np.float64))  # JAX's float width
        self.c_hat = c_hat

    def __check_init__(self):
        shape = jnp.shape(self.c_hat)
        if len(shape) != 1 or shape[0] < 1:
            raise ValueError(
                f"c_hat must be a 1-d array of the Fourier coefficients c_hat(0), ..., c_hat(M) (at least one), "
                f"got shape {shape}"
            )
        check_finite("c_hat", self.c_hat)

    def check_traced(self, x, aux):
        """``x`` with finite traced coefficients ``c_hat`` checked in the program (``equinox.error_if``)."""
        return traced_finite(super().check_traced(x, aux), "c_hat", self.c_hat)

    def check_config(self, x, aux) -> None:
        """Refuse a field or energy whose ``(n, M + 1)`` mode tables do not fit in memory.

        The structured evaluation forms ``cos`` and ``sin`` of ``2 pi m s_i`` for every particle and
        mode (about four ``(n, M + 1)`` arrays at once); past ``_machine.machine_memory()`` that is a
        ``ResourceLimitError`` (a ``ValueError``) naming the estimate, not an out-of-memory crash.
        """
        from ._machine import ResourceLimitError, format_bytes, machine_memory

        n, modes = int(jnp.shape(x)[0]), int(jnp.shape(self.c_hat)[0])
        need = 4 * n * modes * np.dtype(jnp.asarray(x).dtype).itemsize
        avail = machine_memory()
        if need > avail:
            raise ResourceLimitError(
                f"ToeplitzSeries with M + 1 = {modes} coefficients at n = {n} needs ~{format_bytes(need)} of mode "
                f"tables (4 n (M + 1) floats), more than the {format_bytes(avail)} available; use fewer modes"
            )

    def profile(self, delta):
        r"""$c(\Delta) = \hat c(0) + 2 \sum_{m \ge 1} \hat c(m) \cos(2 \pi m \Delta)$ (any shape of ``delta``).

        Example:
            >>> import meanfield as mf
            >>> float(mf.kernels.ToeplitzSeries([0.0, 0.5]).profile(0.5))   # cos(pi)
            -1.0
        """
        delta = jnp.asarray(delta)
        c = jnp.asarray(self.c_hat)
        m = jnp.arange(c.shape[0], dtype=c.dtype)
        w = jnp.concatenate([c[:1], 2 * c[1:]])
        return jnp.sum(w * jnp.cos(2 * jnp.pi * m * delta[..., None]), axis=-1)

    def __call__(self, x, xi, y, zeta):
        return self.profile(zeta - xi) * jnp.dot(x, y)

    def grad_x(self, x, xi, y, zeta):
        return self.profile(zeta - xi) * y

    def _modes(self, x, aux):
        c = jnp.asarray(self.c_hat, x.dtype)
        m = jnp.arange(c.shape[0], dtype=x.dtype)
        theta = 2 * jnp.pi * jnp.asarray(aux, x.dtype)[:, None] * m[None, :]  # (n, M + 1)
        w = jnp.concatenate([c[:1], 2 * c[1:]])  # c(D) = sum_m w_m (cos a_m cos b_m + sin a_m sin b_m)
        C, S = jnp.cos(theta), jnp.sin(theta)
        return w, C, S, C.T @ x, S.T @ x

    def field(self, x, aux, *, block_size=None):
        w, C, S, A, B = self._modes(x, aux)
        return (C @ (w[:, None] * A) + S @ (w[:, None] * B)) / x.shape[0]

    def energy(self, x, aux, *, block_size=None):
        w, _, _, A, B = self._modes(x, aux)
        return jnp.sum(w * (jnp.sum(A * A, axis=1) + jnp.sum(B * B, axis=1))) / (2.0 * x.shape[0] ** 2)

    def _aliased(self, n: int | None):
        """$\\hat c_n(k)$, $k = 0..n-1$ (``n=None``: $\\hat c(0..M)$ and one zero mode $M + 1$)."""
        c = jnp.asarray(self.c_hat)
        if n is None:
            return jnp.concatenate([c, jnp.zeros((1,), c.dtype)])
        n = check_int("n", n, minimum=1)
        m = np.arange(c.shape[0])
        return jnp.zeros((n,), c.dtype).at[m % n].add(c).at[(-m[1:]) % n].add(c[1:])

    def max_energy(self, n: int | None = None) -> Float[Array, ""]:
        r"""Largest energy, $\frac12 \max_{k \in \mathbb Z} \hat c(k)$ (mean-field limit, ``n=None``; modes
        $|k| > M$ count with $\hat c = 0$), or $\frac12 \max_k \hat c_n(k)$ for $n$ particles at $s_i = i/n$
        (aliased coefficients; the class docstring has the derivation). Traceable.

        Example:
            >>> import meanfield as mf
            >>> k = mf.kernels.ToeplitzSeries([-1.0, -0.2])   # every mode repels: E_max = 0
            >>> round(float(k.max_energy()), 4), round(float(k.max_energy(2)), 4)   # n = 2: c_2 = (-1, -0.4)
            (0.0, -0.2)
        """
        return 0.5 * jnp.max(self._aliased(n))

    def dominant_mode(self, n: int | None = None) -> int:
        r"""The smallest frequency $m^* \ge 0$ with the largest $\hat c(m^*)$ (or $\hat c_n$, folded to
        $\min(k, n - k)$); $M + 1$ when every $\hat c(m) < 0$ (``n=None``). Needs concrete coefficients.

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.ToeplitzSeries([0.3, 0.1, 0.2]).dominant_mode()   # c_hat(0) wins: a Dirac
            0
        """
        if not is_concrete(self.c_hat):
            raise ValueError("dominant_mode needs concrete coefficients c_hat, got a traced array")
        k = int(np.argmax(np.asarray(self._aliased(n))))
        return k if n is None else min(k, n - k)

    def maximiser(self, n: int, d: int = 3, dtype=None) -> Float[Array, "n d"]:
        r"""A maximiser at the positions $s_i = i/n$: $x_i = \cos(2 \pi m^* s_i) e_1 + \sin(2 \pi m^* s_i) e_2$,
        $m^*$ = ``dominant_mode(n)`` (a Dirac at $e_1$ if $m^* = 0$); its energy is ``max_energy(n)``.

        Example:
            >>> import meanfield as mf
            >>> k = mf.kernels.ToeplitzSeries([0.0, 0.1, -0.3, 0.25])   # m* = 3
            >>> x = k.maximiser(32)
            >>> round(float(mf.energy(k, x, mf.positions(32))), 4), round(float(k.max_energy(32)), 4)
            (0.125, 0.125)
        """
        n = check_int("n", n, minimum=1)
        d = check_int("d", d, minimum=2)
        dtype = jnp.dtype(dtype) if dtype is not None else jnp.result_type(float)
        theta = 2 * np.pi * self.dominant_mode(n) * np.asarray(positions(n), np.float64)
        x = np.zeros((n, d))
        x[:, 0], x[:, 1] = np.cos(theta), np.sin(theta)
        return jnp.asarray(x, dtype)


# ----------------------------------------------------------------------------
# exp-gauge kernels: h = exp(beta <Psi(xi) x, Psi(zeta) y>) / beta
# ----------------------------------------------------------------------------


class GaugeKernel(_ExpKernel):
    r"""Abstract base of the exp-gauge kernels $h = e^{\beta \langle \Psi(\xi) x, \Psi(\zeta) y\rangle} / \beta$:
    USA in a label-dependent frame. Subclasses define ``gauge_matrix(label, d)``
    (``abc.abstractmethod``) and get the single-pair definition, the gauge-frame fast path
    (the fused C kernel on the CPU), the maximiser frame and the orthogonality check.

    Field and energy use the gauge frame (MATH.md, gauge equivalence):
    $y_i = \Psi_i x_i$, $F_i = \Psi_i^\top F^\text{USA}(y)_i$, $E = E^\text{USA}(y)$: $O(n^2 d)$.

    Args (of every subclass, besides its own fields):
        beta: inverse temperature, ``> 0`` (traced).
        rescaled: multiply by $e^{-\beta}$ (time change, keyword-only).

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> class Flip(mf.kernels.GaugeKernel):          # Psi(s) = diag(+-1, 1, 1)
        ...     def gauge_matrix(self, label, d):
        ...         return jnp.diag(jnp.ones(d).at[0].set(jnp.where(label > 0.5, -1.0, 1.0)))
        >>> k, x = Flip(1.0), mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> bool(jnp.allclose(mf.energy(k, x), mf.energy(k, x, method="pairwise"), rtol=1e-5))
        True
    """

    @abc.abstractmethod
    def gauge_matrix(self, label, d: int):
        r"""The gauge $\Psi(\text{label})$: a ``(d, d)`` orthogonal matrix (defined by each subclass).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> Q = mf.kernels.RoPE(1.0, 2 * jnp.pi).gauge_matrix(0.25, 3)   # R_{pi/2} in (e_1, e_2)
            >>> bool(jnp.allclose(Q @ jnp.array([1.0, 0.0, 0.0]), jnp.array([0.0, 1.0, 0.0]), atol=1e-6))
            True
        """

    def gauge_matrices(self, aux, d: int) -> Float[Array, "n d d"]:
        r"""$\Psi(\xi_i)$ for every label: ``(n, d, d)``.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> mf.kernels.RoPE(1.0, 2 * jnp.pi).gauge_matrices(mf.positions(4), 3).shape
            (4, 3, 3)
        """
        return jax.vmap(lambda a: self.gauge_matrix(a, d))(aux)

    def to_gauge_frame(self, x, aux):
        r"""$y_i = \Psi(\xi_i) x_i$: the configuration in which the dynamics is USA, ``(n, d)``.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> k = mf.kernels.RoPE(1.0, 2 * jnp.pi)
            >>> y = k.to_gauge_frame(jnp.array([[1.0, 0.0, 0.0]]), jnp.array([0.25]))   # R_{pi/2} e_1
            >>> bool(jnp.allclose(y, jnp.array([[0.0, 1.0, 0.0]]), atol=1e-6))
            True
        """
        return _apply_gauge(self.gauge_matrices(aux, x.shape[-1]).astype(x.dtype), x)

    def from_gauge_frame(self, y, aux):
        r"""$x_i = \Psi(\xi_i)^\top y_i$ (inverse of ``to_gauge_frame``), ``(n, d)``.

        Example:
            >>> import jax, jax.numpy as jnp, meanfield as mf
            >>> k, s = mf.kernels.RoPE(1.0, 2 * jnp.pi), mf.positions(4)
            >>> x = mf.sphere.uniform(jax.random.key(0), 4, 3)
            >>> bool(jnp.allclose(k.from_gauge_frame(k.to_gauge_frame(x, s), s), x, atol=1e-6))
            True
        """
        return _apply_gauge_transpose(self.gauge_matrices(aux, y.shape[-1]).astype(y.dtype), y)

    def usa(self) -> USA:
        r"""The USA kernel $e^{\beta \langle y, y'\rangle} / \beta$ this kernel is in its gauge frame.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> type(mf.kernels.RoPE(1.0, 2 * jnp.pi).usa()).__name__
            'USA'
        """
        return USA(self.beta, rescaled=self.rescaled)

    def __call__(self, x, xi, y, zeta):
        d = x.shape[-1]
        a = self.gauge_matrix(xi, d).astype(x.dtype) @ x
        b = self.gauge_matrix(zeta, d).astype(y.dtype) @ y
        return self._exp(jnp.dot(a, b)) / self.beta

    def grad_x(self, x, xi, y, zeta):
        d = x.shape[-1]
        A = self.gauge_matrix(xi, d).astype(x.dtype)
        B = self.gauge_matrix(zeta, d).astype(y.dtype)
        by = B @ y
        return self._exp(jnp.dot(A @ x, by)) * (A.T @ by)

    def field(self, x, aux, *, block_size=None):
        # Psi_i^T usa_field(Psi x)_i, the gauge transforms inside the native kernel or the chunked evaluation
        P = self.gauge_matrices(aux, x.shape[-1]).astype(x.dtype)
        beta = jnp.asarray(self.beta, x.dtype)
        return _tiled_exp(x, None, beta, self._shift(x.dtype), block_size, gauge=P, parts="F")[0]

    def energy(self, x, aux, *, block_size=None):
        # the USA energy of y = Psi x, through the same chunked evaluation as the field
        P = self.gauge_matrices(aux, x.shape[-1]).astype(x.dtype)
        beta = jnp.asarray(self.beta, x.dtype)
        return _tiled_exp(x, None, beta, self._shift(x.dtype), block_size, gauge=P, parts="S")[1] / (2.0 * beta)

    def check_config(self, x, aux) -> None:
        super().check_config(x, aux)
        if is_concrete(aux) and is_concrete(self):
            check_orthogonal(
                f"{type(self).__name__} gauge", self.gauge_matrices(jnp.asarray(aux), np.shape(x)[-1])
            )


class RoPE(GaugeKernel):
    r"""Rotary positional kernel $h = e^{\beta \langle x, R_{\omega (t - s)} y\rangle} / \beta$.

    The gauge $\Psi(s) = R_{\omega s}$ in ``plane``. Maximiser $x(s) = R_{-\omega s} u$:
    for $\omega = 2 \pi m$ a latitude circle (height $\|P_{E^\perp} u\|$).

    Args:
        beta: inverse temperature, ``> 0`` (traced).
        omega: rotation frequency (traced, finite).
        plane: the rotation plane ``(a, b)`` (static).
        rescaled: multiply by $e^{-\beta}$ (time change).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> k = mf.kernels.RoPE(1.0, 2 * jnp.pi)
        >>> x = jnp.array([1.0, 0.0, 0.0])
        >>> round(float(k(x, 0.0, x, 0.0)), 4), round(float(k(x, 0.0, x, 0.25)), 4)   # e, then e^0
        (2.7183, 1.0)
    """

    omega: RealScalarLike = 2 * np.pi
    plane: tuple[int, int] = eqx.field(static=True, default=(0, 1))

    def __init__(self, beta, omega, plane=(0, 1), *, rescaled: bool = False):
        self.beta, self.omega, self.plane, self.rescaled = beta, omega, tuple(plane), rescaled

    def __check_init__(self):
        check_scalar("beta", self.beta)
        check_positive("beta", self.beta)
        check_scalar("omega", self.omega)
        check_finite("omega", self.omega)
        check_plane(self.plane, None)

    def gauge_matrix(self, label, d):
        check_plane(self.plane, d)
        return sphere.rotation(self.omega * label, d, self.plane)


class _Callable(eqx.Module):
    """A plain callable held as a static field: a new callable object is a new compilation
    (prefer the Module families ``FourierPhase`` and ``WavyGauge``, whose parameters are traced)."""

    fn: Callable = eqx.field(static=True)

    def __call__(self, *args):
        return self.fn(*args)


def _as_module(fn, what: str):
    if isinstance(fn, eqx.Module):
        return fn
    if not callable(fn):
        raise TypeError(f"{what}, got {fn!r}")
    return _Callable(fn)


class FourierPhase(eqx.Module):
    r"""Phase $\varphi(s) = \omega s + \text{amplitude} \cdot \sin(2 \pi \cdot \text{frequency} \cdot s)$ with traced ``omega`` and
    ``amplitude`` (a PyTree: a jitted function of them compiles once for any values).

    ``FourierPhase()`` is ``default_phase``: $2 \pi s + \sin(2 \pi s)$; ``amplitude = 0`` gives
    RoPE's linear phase.

    Args:
        omega: the linear rate (traced, finite; default $2 \pi$).
        amplitude: the sine amplitude (traced, finite; default 1).
        frequency: the sine frequency, an int ``>= 1`` (static; default 1).

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.kernels.FourierPhase()(0.25)), 4)   # pi / 2 + 1
        2.5708
    """

    omega: RealScalarLike = 2 * math.pi
    amplitude: RealScalarLike = 1.0
    frequency: int = eqx.field(static=True, default=1)

    def __check_init__(self):
        check_scalar("omega", self.omega)
        check_finite("omega", self.omega)
        check_scalar("amplitude", self.amplitude)
        check_finite("amplitude", self.amplitude)
        check_int("frequency", self.frequency, minimum=1)

    def __call__(self, s):
        return self.omega * s + self.amplitude * jnp.sin(2 * jnp.pi * self.frequency * s)


class WavyGauge(eqx.Module):
    r"""Generalised RoPE gauge $\Psi(s) = R_{12}(2 \pi s)\, R_{23}(a \sin(2 \pi k s))$ on $\mathbb R^3$
    (MATH.md, Fig. 3 v), with traced amplitude ``a`` (a PyTree: one compilation for any ``a``).

    Its maximiser $x(s) = \Psi(s)^\top u$ is a wavy closed curve, which a single fixed-plane
    phase field cannot produce (those stay on a latitude circle).

    Args:
        amplitude: the wave amplitude ``a`` in radians (traced, finite; default 0.6).
        k: number of waves per turn, an int ``>= 1`` (static; default 3).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> Q = mf.kernels.WavyGauge(0.6, 3)(0.3)
        >>> Q.shape, bool(jnp.allclose(Q @ Q.T, jnp.eye(3), atol=1e-6))
        ((3, 3), True)
    """

    amplitude: RealScalarLike = 0.6
    k: int = eqx.field(static=True, default=3)

    def __check_init__(self):
        check_scalar("amplitude", self.amplitude)
        check_finite("amplitude", self.amplitude)
        check_int("k", self.k, minimum=1)

    def __call__(self, s):
        R12 = sphere.rotation(2 * jnp.pi * s, 3, (0, 1))
        R23 = sphere.rotation(self.amplitude * jnp.sin(2 * jnp.pi * self.k * s), 3, (1, 2))
        return R12 @ R23


class PhaseField(GaugeKernel):
    r"""Phase-field kernel $h = e^{\beta \langle x, R_{\varphi(t) - \varphi(s)} y\rangle} / \beta$.

    ``phase`` maps $s \mapsto$ angle $\varphi(s)$ (jax-traceable). Gauge $\Psi(s) = R_{\varphi(s)}$;
    maximiser $x(s) = R_{-\varphi(s)} u$. In a single fixed plane the maximiser stays
    on a latitude circle (only its parametrisation changes).

    A parametrised phase that is an ``equinox.Module`` (``FourierPhase``, or your own) is part
    of the PyTree: its parameters are traced, so a jitted function building
    ``PhaseField(beta, FourierPhase(omega, amplitude))`` compiles once for any values. A plain
    callable is held as a static field: each new callable object is a new compilation.

    Args:
        beta: inverse temperature, ``> 0`` (traced).
        phase: $s \mapsto \varphi(s)$: an ``equinox.Module`` (traced leaves) or a plain callable.
        plane: the rotation plane ``(a, b)`` (static).
        rescaled: multiply by $e^{-\beta}$ (time change).

    Example:
        >>> import jax, meanfield as mf
        >>> k = mf.kernels.PhaseField(1.0, mf.kernels.FourierPhase(2.0, 0.5))
        >>> x = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> mf.field(k, x).shape
        (8, 3)
    """

    phase: eqx.Module = None  # type: ignore[assignment]  # set by __init__
    plane: tuple[int, int] = eqx.field(static=True, default=(0, 1))

    def __init__(self, beta, phase, plane=(0, 1), *, rescaled: bool = False):
        self.beta, self.plane, self.rescaled = beta, tuple(plane), rescaled
        self.phase = _as_module(phase, "phase must be a callable s -> angle")

    def __check_init__(self):
        check_scalar("beta", self.beta)
        check_positive("beta", self.beta)
        check_plane(self.plane, None)

    def gauge_matrix(self, label, d):
        check_plane(self.plane, d)
        return sphere.rotation(self.phase(label), d, self.plane)


class Gauge(GaugeKernel):
    r"""General gauge kernel $h = e^{\beta \langle \Psi(\xi) x, \Psi(\zeta) y\rangle} / \beta$.

    ``gauge`` maps ``label -> (d, d)`` orthogonal matrix (jax-traceable); its orthogonality
    is checked on the labels of a concrete run. Maximiser $x(\xi) = \Psi(\xi)^\top u$. As for
    ``PhaseField``, an ``equinox.Module`` gauge (``WavyGauge``) has traced parameters; a plain
    callable is static (a new callable object is a new compilation).

    Args:
        beta: inverse temperature, ``> 0`` (traced).
        gauge: ``label -> (d, d)`` orthogonal matrix: an ``equinox.Module`` or a plain callable.
        rescaled: multiply by $e^{-\beta}$ (time change).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> k = mf.kernels.Gauge(1.0, mf.kernels.WavyGauge())
        >>> s = mf.positions(8)
        >>> x = k.from_gauge_frame(jnp.tile(jnp.array([0.0, 0.0, 1.0]), (8, 1)), s)   # the maximiser
        >>> round(float(mf.energy(k, x, s)), 4)   # e / 2
        1.3591
    """

    gauge: eqx.Module = None  # type: ignore[assignment]  # set by __init__

    def __init__(self, beta, gauge, *, rescaled: bool = False):
        self.beta, self.rescaled = beta, rescaled
        self.gauge = _as_module(gauge, "gauge must be a callable label -> (d, d) orthogonal matrix")

    def gauge_matrix(self, label, d):
        Q = jnp.asarray(self.gauge(label))
        if Q.shape != (d, d):
            raise ValueError(f"gauge(label) must return a ({d}, {d}) matrix, got shape {Q.shape}")
        return Q


class Prompt(GaugeKernel):
    r"""Prompt kernel: the gauge kernel over integer prompt ids $\xi \in \{0, \dots, K-1\}$.

    $h = e^{\beta \langle \Psi_\xi x, \Psi_\zeta y\rangle} / \beta$ with ``gauges`` a ``(K, d, d)``
    array of orthogonal matrices (reconstruction of the paper's lost kernel (10),
    MATH.md). Maximiser: $K$ Dirac masses at $\Psi_k^\top u$. Default labels when
    ``aux=None``: contiguous prefix blocks, $\xi_i = \lfloor K i / n \rfloor$.

    Args:
        beta: inverse temperature, ``> 0`` (traced).
        gauges: ``(K, d, d)`` orthogonal matrices.
        rescaled: multiply by $e^{-\beta}$ (time change).

    Example:
        >>> import jax, meanfield as mf
        >>> k = mf.kernels.Prompt(1.0, mf.kernels.random_gauges(jax.random.key(0), 2, 3))
        >>> k.default_aux(4).tolist()
        [0, 0, 1, 1]
        >>> mf.field(k, mf.sphere.uniform(jax.random.key(1), 4, 3)).shape
        (4, 3)
    """

    gauges: Array = None  # type: ignore[assignment]  # set by __init__
    integer_labels: ClassVar[bool] = True

    def __init__(self, beta, gauges, *, rescaled: bool = False):
        dtype = gauges.dtype if hasattr(gauges, "dtype") else np.asarray(gauges).dtype
        if isinstance(gauges, (str, bytes)) or np.dtype(dtype).kind not in "iuf":
            raise TypeError(f"gauges must be a real (K, d, d) array of orthogonal matrices, got {gauges!r}")
        G = jnp.asarray(gauges)
        if G.ndim != 3 or G.shape[1] != G.shape[2] or G.shape[0] < 1:
            raise ValueError(f"gauges must have shape (K, d, d) with K >= 1, got {G.shape}")
        check_orthogonal("Prompt gauges", G)
        self.beta, self.gauges, self.rescaled = beta, G, rescaled

    @property
    def num_prompts(self) -> int:
        """Number of prompts $K$ = ``gauges.shape[0]``.

        Example:
            >>> import jax, meanfield as mf
            >>> mf.kernels.Prompt(1.0, mf.kernels.random_gauges(jax.random.key(0), 3, 2)).num_prompts
            3
        """
        return self.gauges.shape[0]

    def default_aux(self, n: int):
        return (jnp.arange(n) * self.num_prompts) // n

    def gauge_matrix(self, label, d):
        if self.gauges.shape[-1] != d:
            raise ValueError(f"Prompt gauges are {self.gauges.shape[-1]}x{self.gauges.shape[-1]}, states have d = {d}")
        return self.gauges[label]

    def check_traced(self, x, aux):
        return traced_labels(super().check_traced(x, aux), aux, self.num_prompts)

    def check_config(self, x, aux) -> None:
        _ExpKernel.check_config(self, x, aux)
        d = np.shape(x)[-1]
        if self.gauges.shape[-1] != d:
            raise ValueError(
                f"Prompt gauges are {self.gauges.shape[-1]}x{self.gauges.shape[-1]} matrices but the "
                f"states have d = {d}; pass gauges of shape (K, {d}, {d})"
            )
        if is_concrete(aux):
            a = np.asarray(aux)
            if not np.issubdtype(a.dtype, np.integer):
                raise TypeError(f"Prompt labels must be integer prompt ids, got dtype {a.dtype}")
            if a.size and (a.min() < 0 or a.max() >= self.num_prompts):
                raise ValueError(
                    f"Prompt labels must lie in [0, {self.num_prompts - 1}], got range [{a.min()}, {a.max()}]"
                )


# ----------------------------------------------------------------------------
# construction by name (CLI, sweeps, reproductions)
# ----------------------------------------------------------------------------


def random_gauges(key, K: int, d: int, dtype=jnp.float32) -> Float[Array, "K d d"]:
    r"""``K`` Haar-random orthogonal ``(d, d)`` matrices: $Q R = G$, $G$ Gaussian, $Q \operatorname{diag}(\operatorname{sign}(\operatorname{diag} R))$.

    Args:
        key: a ``jax.random`` key.
        K: number of matrices.
        d: dimension.
        dtype: floating dtype.

    Returns:
        ``(K, d, d)`` orthogonal matrices.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> G = mf.kernels.random_gauges(jax.random.key(0), 2, 3)
        >>> G.shape, bool(jnp.allclose(G[0] @ G[0].T, jnp.eye(3), atol=1e-5))
        ((2, 3, 3), True)
    """
    K = check_int("K", K, minimum=1)
    d = check_int("d", d, minimum=1)
    g = jax.random.normal(key, (K, d, d), dtype=dtype)
    q, r = jnp.linalg.qr(g)
    return q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[:, None, :]


def default_phase(s):
    r"""Default phase field $\varphi(s) = 2 \pi s + \sin(2 \pi s)$ (a non-uniform traversal):
    ``FourierPhase()`` as a plain function.

    Args:
        s: position(s), scalar or array.

    Returns:
        $\varphi(s)$, same shape as ``s``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.kernels.default_phase(0.25)), 4)   # pi / 2 + 1
        2.5708
    """
    return FourierPhase()(s)


def wavy_gauge(amplitude: RealScalarLike = 0.6, k: int = 3) -> WavyGauge:
    """The generalised RoPE gauge ``WavyGauge(amplitude, k)`` (for ``Gauge``).

    Args:
        amplitude: the wave amplitude ``a`` (radians).
        k: number of waves per turn.

    Returns:
        a ``WavyGauge``: ``s -> (3, 3)`` orthogonal matrix.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> Q = mf.kernels.wavy_gauge()(0.3)
        >>> Q.shape, bool(jnp.allclose(Q @ Q.T, jnp.eye(3), atol=1e-6))
        ((3, 3), True)
    """
    return WavyGauge(amplitude, k)


# ----------------------------------------------------------------------------
# the registry: one table of model names (CLI, sweeps, reproductions, Python)
# ----------------------------------------------------------------------------

#: Kinds of parameter values: the accepted range of each.
PARAM_KINDS = ("float>0", "float>=0", "float", "int>=1", "int>=0", "bool", "plane", "choice")


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a registered model.

    ``traced`` parameters are leaves of the model's PyTree (a sweep makes them grid axes of
    one compilation); static ones change the program. ``kind`` is the accepted range
    (``PARAM_KINDS``), ``choices`` the accepted values of a ``"choice"``.

    Example:
        >>> import meanfield as mf
        >>> p = mf.kernels.MODELS["rope"].param("omega")
        >>> p.traced, p.kind, round(p.default, 4)
        (True, 'float', 6.2832)
    """

    name: str
    default: Any
    traced: bool
    kind: str
    doc: str
    choices: tuple = ()

    def validate(self, value, where: str = ""):
        """The value, checked against ``kind`` (``ValueError``/``TypeError`` naming it);
        traced values (tracers, arrays) of traced parameters pass to the model's own checks.

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.MODELS["usa"].param("beta").validate(2)
            2.0
        """
        name = where or self.name
        if self.traced and isinstance(value, (jax.Array, np.ndarray)):
            return value  # an array or a tracer: the model's constructor and in-program checks
        if self.kind.startswith("float"):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise TypeError(f"{name} must be a number, got {value!r}")
            v = float(value)
            if not math.isfinite(v):
                raise ValueError(f"{name} must be finite, got {value!r}")
            if self.kind == "float>0" and not v > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
            if self.kind == "float>=0" and not v >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
            return v
        if self.kind.startswith("int"):
            return check_int(name, value, minimum=int(self.kind[-1]))
        if self.kind == "bool":
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be true or false, got {value!r}")
            return bool(value)
        if self.kind == "plane":
            ok = isinstance(value, (list, tuple)) and len(value) == 2
            if not ok or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
                raise TypeError(f"{name} must be a pair of coordinate indices like (0, 1), got {value!r}")
            if value[0] == value[1] or min(value) < 0:
                raise ValueError(f"{name} must be two distinct indices >= 0, got {value!r}")
            return tuple(int(i) for i in value)
        if value not in self.choices:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, self.choices))}, got {value!r}")
        return value


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A registered model: its name, one-line doc, parameters and constructor.

    ``build(params, d, dtype)`` makes the model from a full parameter dict (``None`` for
    ``attention``, which has no dynamics and is swept only); ``d`` is the required dimension
    where there is one (``gauge``: 3); ``max_energy(params)`` the theory's largest energy, or
    ``None``.

    Example:
        >>> import meanfield as mf
        >>> [p.name for p in mf.kernels.MODELS["distance-bias"].params]
        ['beta', 'lam', 'rescaled']
    """

    name: str
    doc: str
    params: tuple[Param, ...]
    build: Callable | None
    d: int | None = None
    max_energy: Callable | None = None

    @property
    def simulated(self) -> bool:
        """Whether the model has dynamics (everything but ``attention``)."""
        return self.build is not None

    @property
    def has_energy(self) -> bool:
        """Whether the model is a pair kernel (``mf.energy`` defined)."""
        return self.simulated and self.name != "sa"

    def param(self, name: str) -> Param:
        """The parameter ``name`` (``ValueError`` listing the accepted ones)."""
        for p in self.params:
            if p.name == name:
                return p
        raise ValueError(
            f"{name!r} is not a parameter of model {self.name!r}; its parameters: "
            f"{', '.join(p.name for p in self.params) or 'none'}"
        )

    def defaults(self) -> dict:
        """``{name: default}`` of every parameter."""
        return {p.name: p.default for p in self.params}

    def resolve(self, params: Mapping[str, Any], *, where: str = "") -> dict:
        """Defaults filled in and every given value validated (unknown names: ``ValueError``)."""
        out = self.defaults()
        for name, value in params.items():
            out[name] = self.param(name).validate(value, f"{where}{name}")
        return out


_BETA = Param("beta", 1.0, True, "float>0", "inverse temperature")
_RESCALED = Param("rescaled", False, False, "bool", "multiply by e^(-beta): time t = e^(-beta) s (beta > 88 in float32)")
_PLANE = Param("plane", (0, 1), False, "plane", "rotation plane (a, b)")
_OMEGA = Param("omega", 2 * math.pi, True, "float", "rotation frequency of the positions (phase: linear rate)")


def _exp_max_energy(P: dict):
    return float(theory.max_energy(P["beta"], rescaled=P["rescaled"]))


def _toeplitz_max_energy(P: dict):
    """``1/4`` (the great circle traversed ``m`` times) for an integer ``m``; none otherwise."""
    m = P["m"]
    return float(theory.great_circle_energy(int(m))) if float(m).is_integer() else None


def _build_prompt(P: dict, d: int, dtype):
    K = P["prompts"]
    if P["gauges"] == "rotation":  # Psi_k = rotation by 2 pi k / K in `plane`
        G = jnp.stack([sphere.rotation(2 * np.pi * k / K, d, P["plane"]) for k in range(K)]).astype(dtype)
    else:  # Haar-random from key(gauge_seed), drawn in float32 whatever the dtype (same gauges)
        G = random_gauges(jax.random.key(P["gauge_seed"]), K, d, jnp.float32).astype(dtype)
        if jnp.dtype(dtype).itemsize > 4:  # orthogonal to the dtype's rounding: one QR, signs kept
            q, r = jnp.linalg.qr(G)
            G = q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[:, None, :]
    return Prompt(P["beta"], G, rescaled=P["rescaled"])


def _entry(name, doc, params, build, **kw) -> ModelEntry:
    return ModelEntry(name, doc, tuple(params), build, **kw)


#: The model registry: every name ``meanfield simulate --kernel``, a sweep's ``model.kind``,
#: the reproductions and ``make`` accept, with its parameters.
MODELS: dict[str, ModelEntry] = {
    e.name: e
    for e in (
        _entry("usa", "unbiased self-attention exp(beta <x, y>) / beta: collapses to a point",
               [_BETA, _RESCALED], lambda P, d, dt: USA(P["beta"], rescaled=P["rescaled"]),
               max_energy=_exp_max_energy),
        _entry("distance-bias", "exp(-lam |s - t|) exp(beta <x, y>) / beta: still collapses (Prop. 11)",
               [_BETA, Param("lam", 1.0, True, "float>=0", "distance-bias rate"), _RESCALED],
               lambda P, d, dt: DistanceBias(P["beta"], P["lam"], rescaled=P["rescaled"])),
        _entry("toeplitz", "cos(2 pi m (t - s)) <x, y>: the great circle traversed m times",
               [Param("m", 1.0, True, "float>0", "Toeplitz frequency (an integer for a closed circle)")],
               lambda P, d, dt: Toeplitz(P["m"]),
               max_energy=_toeplitz_max_energy),
        _entry("rope", "rotary positions exp(beta <x, R_omega(t - s) y>) / beta: a latitude circle",
               [_BETA, _OMEGA, _PLANE, _RESCALED],
               lambda P, d, dt: RoPE(P["beta"], P["omega"], P["plane"], rescaled=P["rescaled"]),
               max_energy=_exp_max_energy),
        _entry("phase-field", "phase field phi(s) = omega s + amplitude sin(2 pi frequency s) (FourierPhase)",
               [_BETA, _OMEGA, Param("amplitude", 1.0, True, "float", "sine amplitude of the phase"),
                Param("frequency", 1, False, "int>=1", "sine frequency of the phase"), _PLANE, _RESCALED],
               lambda P, d, dt: PhaseField(P["beta"], FourierPhase(P["omega"], P["amplitude"], P["frequency"]),
                                           P["plane"], rescaled=P["rescaled"]),
               max_energy=_exp_max_energy),
        _entry("gauge", "wavy generalised RoPE R12(2 pi s) R23(amplitude sin(2 pi k s)) (WavyGauge, d = 3)",
               [_BETA, Param("amplitude", 0.6, True, "float", "wave amplitude of the gauge (radians)"),
                Param("k", 3, False, "int>=1", "waves per turn of the gauge"), _RESCALED],
               lambda P, d, dt: Gauge(P["beta"], WavyGauge(P["amplitude"], P["k"]), rescaled=P["rescaled"]),
               d=3, max_energy=_exp_max_energy),
        _entry("prompt", "prompt gauges Psi_k on K contiguous blocks: K Dirac masses",
               [_BETA, Param("prompts", 3, False, "int>=1", "number of prompts K"),
                Param("gauges", "random", False, "choice", "prompt gauges: Haar-random (from gauge_seed) "
                      "or rotations by 2 pi k / K in plane", ("random", "rotation")),
                Param("gauge_seed", 0, False, "int>=0", "PRNG seed of the random prompt gauges"),
                _PLANE, _RESCALED],
               _build_prompt, max_energy=_exp_max_energy),
        _entry("sa", "self-attention, softmax-normalised (no pair energy)",
               [_BETA, Param("normalized", True, False, "bool", "softmax rows (SA) or the 1/n average"), _RESCALED],
               lambda P, d, dt: SelfAttention(P["beta"], normalized=P["normalized"], rescaled=P["rescaled"])),
        _entry("attention", "one fixed query against n uniform keys (sweeps only: no dynamics)",
               [_BETA], None),
    )
}

#: Names of the models with dynamics (``meanfield simulate --kernel``, ``make``).
MODEL_NAMES = tuple(name for name, e in MODELS.items() if e.simulated)


def model_entry(name) -> ModelEntry:
    """The registry entry of ``name`` (``ValueError`` listing the accepted names).

    Example:
        >>> import meanfield as mf
        >>> mf.kernels.model_entry("gauge").d
        3
    """
    if not isinstance(name, str) or name not in MODELS:
        raise ValueError(f"unknown model {name!r}; accepted: {', '.join(MODELS)}")
    return MODELS[name]


def build(name, params, *, d, dtype=None) -> Model:
    """The model ``name`` from a dict of its parameters (defaults for the missing ones).

    What ``make`` does with keywords; the sweep engine calls it with traced values.

    Example:
        >>> import meanfield as mf
        >>> type(mf.kernels.build("phase-field", {"amplitude": 0.5}, d=3).phase).__name__
        'FourierPhase'
    """
    entry = model_entry(name)
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict of parameter values, got {params!r}")
    if entry.build is None:
        raise ValueError(f"model {name!r} has no dynamics (it is swept only); accepted: {', '.join(MODEL_NAMES)}")
    d = check_int("d", d, minimum=2)
    if entry.d is not None and d != entry.d:
        raise ValueError(f"model {name!r} needs d = {entry.d}, got d = {d}")
    P = entry.resolve(params)
    if "plane" in P and max(P["plane"]) >= d:
        raise ValueError(f"plane {P['plane']} needs indices < d = {d}")
    return entry.build(P, d, jnp.dtype(dtype) if dtype is not None else jnp.result_type(float))


def make(name, *, d=3, dtype=None, **params) -> Model:
    """Build a registered model by name with its parameters as keywords (``MODELS``).

    ``usa``, ``distance-bias`` (``lam``), ``toeplitz`` (``m``), ``rope`` (``omega``, ``plane``),
    ``phase-field`` (``omega``, ``amplitude``, ``frequency``: ``FourierPhase``), ``gauge``
    (``amplitude``, ``k``: ``WavyGauge``, d = 3), ``prompt`` (``prompts``, ``gauges``,
    ``gauge_seed``, ``plane``), ``sa`` (``normalized``); all but ``toeplitz`` take ``beta``,
    the exp kernels ``rescaled``. The same name and parameters give the same model as
    ``meanfield simulate --kernel NAME`` and a sweep of ``kind = NAME``.

    Args:
        name: one of ``MODEL_NAMES``.
        d: dimension (``gauge`` needs 3; ``prompt`` gauges are ``(d, d)``).
        dtype: floating dtype of array parameters (prompt gauges); default JAX's.
        **params: the model's parameters (``MODELS[name].params``); unknown ones raise.

    Returns:
        a ``Kernel`` (``mf.models.SelfAttention`` for ``sa``).

    Example:
        >>> import meanfield as mf
        >>> type(mf.kernels.make("rope", beta=2.0)).__name__
        'RoPE'
    """
    return build(name, params, d=d, dtype=dtype)
