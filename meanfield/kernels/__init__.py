r"""Interaction kernels $h((x, \xi), (y, \zeta))$ of the USA-AV particle model (docs/math/kernels.md).

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
reference and what accelerators run. The ``backend`` option (``BACKENDS``: ``"auto"``, the
default, takes the fused kernel where it was measured faster on this machine, ``"native"`` or
``"xla"``) is an argument of ``mf.field``, ``mf.velocity``, ``mf.energy`` and ``mf.simulate``,
part of what JAX traces; ``use_backend`` sets it for kernel methods called directly;
``MEANFIELD_NATIVE=0`` makes the fused kernel unavailable (then ``"native"`` is one
``BackendUnavailable``, a ``ValueError``, at the call). The two paths round differently (about
1e-7 in float32), and ``"auto"`` follows a timing recorded in the kernel cache (``resolve_backend``):
pass ``"native"`` or ``"xla"`` where the last bits must not depend on it. A sweep decides
``"auto"`` once per store, without the timing, and records the decision (``meanfield.sweep``).
BENCHMARKS.md has the measured speed of both.

Models are named in one registry, ``MODELS`` (``make``, ``build``): the CLI flags, sweep spec
keys and reproductions derive from it.

The implementation is split along its concepts, in private modules whose public names are all
here: ``_base`` (the abstract ``Kernel`` and the pairwise reference), ``_exp`` (exp-kernel
evaluation, the fused C kernel as an XLA primitive, the ``backend`` option, ``USA``,
``DistanceBias``), ``_toeplitz``, ``_kuramoto`` (the linear kernel), ``_gauge`` (the exp-gauge kernels and their gauge and phase
families) and ``_registry``.

Large ``beta``: $e^{\beta \langle x, y\rangle}$ overflows float32 past $\beta \approx 88$. With
``rescaled=True`` an exp kernel is multiplied by $e^{-\beta}$:
$h = e^{\beta (\langle x, y\rangle - 1)} / \beta$. This is an exact change of time scale:
the rescaled flow at time $s$ is the original flow at time $t = e^{-\beta} s$
(``mf.kernels.original_time``), energies are $e^{-\beta}$ times the original.
"""

from __future__ import annotations

from ..models import ExpProfile, Profile, declared_params, param, positions
from ._base import (
    Kernel,
    masked_pairwise_field,
    original_time,
    pairwise_energy,
    pairwise_field,
    rescaled_time,
)
from ._exp import (
    ACCELERATOR_BATCH_BYTES,
    BACKENDS,
    BATCH_BYTES,
    DEFAULT_BLOCK,
    DENSE_LIMIT,
    DENSE_MAX,
    USA,
    BackendUnavailable,
    DistanceBias,
    check_backend,
    resolve_backend,
    tile_shape,
    use_backend,
)
from ._gauge import (
    FourierPhase,
    Gauge,
    GaugeKernel,
    PhaseField,
    Prompt,
    RoPE,
    WavyGauge,
    default_phase,
    random_gauges,
    wavy_gauge,
)
from ._kuramoto import Kuramoto, LinearProfile
from ._registry import (
    ENTRY_POINT_GROUP,
    MODEL_NAMES,
    MODELS,
    PARAM_KINDS,
    PLUGIN_FAILURES,
    RESERVED_MODEL_NAMES,
    ModelEntry,
    Param,
    PluginWarning,
    build,
    load_entry_points,
    make,
    model_entry,
    register,
    unregister,
)
from ._toeplitz import Toeplitz, ToeplitzSeries

__all__ = [
    "Kernel",
    "GaugeKernel",
    "USA",
    "DistanceBias",
    "Toeplitz",
    "ToeplitzSeries",
    "Kuramoto",
    "LinearProfile",
    "RoPE",
    "PhaseField",
    "Gauge",
    "Prompt",
    "FourierPhase",
    "WavyGauge",
    "positions",
    "Profile",
    "ExpProfile",
    "pairwise_field",
    "masked_pairwise_field",
    "pairwise_energy",
    "original_time",
    "rescaled_time",
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
    "param",
    "declared_params",
    "register",
    "unregister",
    "tile_shape",
    "load_entry_points",
    "PluginWarning",
    "PLUGIN_FAILURES",
    "RESERVED_MODEL_NAMES",
    "ENTRY_POINT_GROUP",
]

load_entry_points()  # models of installed packages (entry-point group meanfield.models)
