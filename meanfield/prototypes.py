r"""Prototype readout: soft assignment, the exact loss decomposition, two-timescale training.

docs/math/prototypes.md (DDCL-Attention, "Collapse-Free Prototype Readout Layer for Transformer Encoders", Cirrincione and Kumar 2026; docs/papers.md). Tokens
$z_t \in \mathbb{R}^m$ ($t = 1, \dots, T$), prototypes $p_1, \dots, p_K$, temperature $\tau > 0$:

* soft assignment $q_{tk} = \operatorname{softmax}_k(-\|z_t - p_k\|^2 / \tau)$;
* soft reconstruction $\hat z_t = \sum_k q_{tk} p_k$;
* exact decomposition of the soft quantisation loss:

    $$L_q = \operatorname{mean}_t \sum_k q_{tk} \|z_t - p_k\|^2 = L_{\text{OLS}} + V,$$

    $$L_{\text{OLS}} = \operatorname{mean}_t \|z_t - \hat z_t\|^2 \ \text{(reconstruction)}, \qquad
    V = \operatorname{mean}_t \sum_k q_{tk} \|p_k - \hat z_t\|^2 \ge 0 \ \text{(prototype variance)}.$$

    ($\|z - p_k\|^2 = \|z - \hat z\|^2 + \|\hat z - p_k\|^2 + 2 \langle z - \hat z, \hat z - p_k\rangle$
    and the cross term vanishes after weighting by $q_{tk}$ because
    $\sum_k q_{tk} (\hat z_t - p_k) = 0$.)

The module also holds the models built on it (a readout layer, a hard
vector-quantisation baseline with the straight-through estimator, a
two-level hierarchical readout, a small VQ autoencoder), the clustering
metrics used to judge them, the two-timescale trainer (``optax.multi_transform``:
encoder/projection at $\eta_\theta$, prototypes at $\eta_P$,
$\varepsilon = \eta_\theta / \eta_P$) and two datasets that need no download.

Single-sequence functions act on one ``(T, m)`` array; batch with ``jax.vmap``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeAlias, TypeVar, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from ._checks import RealScalarLike, check_choice, check_int, check_positive, is_concrete
from ._precision import matmul

__all__ = [
    "assign",
    "loss_terms",
    "reconstruct",
    "squared_distances",
    "hard_assign",
    "straight_through",
    "vq_losses",
    "PrototypeReadout",
    "HardVQ",
    "HierarchicalReadout",
    "VQAutoencoder",
    "utilization",
    "separation",
    "assignment_entropy",
    "clustering_accuracy",
    "nmi",
    "ari",
    "decomposition_error",
    "param_labels",
    "two_timescale_optimizer",
    "train",
    "TwoTimescaleBounds",
    "stability_boundary",
    "stability_certificate",
    "two_timescale_radius",
    "load_digits",
    "digit_patches",
    "gaussian_mixture_tokens",
]

#: Integer labels: an array or a list of ints.
_Labels: TypeAlias = ArrayLike | Sequence[int]
#: Learning rates: scalars or arrays (or lists) that broadcast.
_Rates: TypeAlias = ArrayLike | Sequence[float]
#: A model: an equinox Module or any PyTree of them.
_Model = TypeVar("_Model")


# ---------------------------------------------------------------------------
# input validation (concrete values only; traced values pass through)


def _check_tokens(z: ArrayLike, prototypes: ArrayLike) -> None:
    zs, ps = jnp.shape(z), jnp.shape(prototypes)
    if len(zs) != 2:
        raise ValueError(f"z must be a (T, m) array of tokens, got shape {zs}")
    if len(ps) != 2:
        raise ValueError(f"prototypes must be a (K, m) array, got shape {ps}")
    if zs[1] != ps[1]:
        raise ValueError(
            f"z and prototypes must share the last dimension m, got z {zs} and prototypes {ps}"
        )
    if zs[0] < 1 or ps[0] < 1:
        raise ValueError(f"need at least one token and one prototype, got z {zs}, prototypes {ps}")
    for name, arr in (("z", z), ("prototypes", prototypes)):
        if not jnp.issubdtype(jnp.result_type(arr), jnp.floating):
            raise TypeError(f"{name} must be a floating array, got dtype {jnp.result_type(arr)}")


def _check_temperature(temperature: RealScalarLike) -> None:
    if jnp.ndim(temperature) != 0:
        raise ValueError(f"temperature must be a scalar, got shape {jnp.shape(temperature)}")
    check_positive("temperature", temperature)


def _check_q(q: ArrayLike) -> None:
    if jnp.ndim(q) != 2:
        raise ValueError(f"assignments q must be a (T, K) array, got shape {jnp.shape(q)}")
    if is_concrete(q):
        arr = np.asarray(q, dtype=np.float64)
        if not np.all(np.isfinite(arr)) or np.any(arr < -1e-6):
            raise ValueError("assignments q must be finite and >= 0")
        rows = arr.sum(axis=1)
        if np.any(np.abs(rows - 1.0) > 1e-3):
            raise ValueError(
                f"each row of q must sum to 1 (a distribution over prototypes), got row sums "
                f"in [{rows.min():.4g}, {rows.max():.4g}]"
            )


# ---------------------------------------------------------------------------
# assignment and the exact decomposition (docs/math/prototypes.md)


def squared_distances(
    z: Float[Array | np.ndarray, "T m"], prototypes: Float[Array | np.ndarray, "K m"]
) -> Float[Array, "T K"]:
    r"""$d_{tk} = \|z_t - p_k\|^2$, from the differences (no $|z|^2 + |p|^2 - 2 z \cdot p$
    cancellation, so each entry is accurate relative to itself).

    Args:
        z: ``(T, m)`` tokens; prototypes: ``(K, m)``.

    Returns:
        ``(T, K)`` squared distances.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> mf.prototypes.squared_distances(jnp.array([[0.0, 0.0]]), jnp.array([[3.0, 4.0], [1.0, 0.0]])).tolist()
        [[25.0, 1.0]]
    """
    diff = z[:, None, :] - prototypes[None, :, :]
    return jnp.sum(diff * diff, axis=-1)


def assign(z: ArrayLike, prototypes: ArrayLike, temperature: RealScalarLike) -> Float[Array, "T K"]:
    r"""Soft assignment $q_{tk} = \operatorname{softmax}_k(-\|z_t - p_k\|^2 / \tau)$, $\tau$ the ``temperature``.

    The softmax is taken of $-(d_{tk} - \min_j d_{tj}) / \tau$ (shifted by the
    row minimum distance before the division, so the largest logit is exactly 0
    and distant tokens neither underflow nor give NaN); each row is a probability
    vector over prototypes.

    Args:
        z: ``(T, m)`` tokens.
        prototypes: ``(K, m)`` prototypes.
        temperature: scalar ``> 0``.

    Returns:
        ``(T, K)`` array, rows sum to 1.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> q = mf.prototypes.assign(jnp.zeros((3, 2)), jnp.array([[0.0, 0.0], [9.0, 0.0]]), 1.0)
        >>> q.shape, round(float(q[0, 0]), 6)
        ((3, 2), 1.0)
    """
    _check_tokens(z, prototypes)
    _check_temperature(temperature)
    return _assign(z, prototypes, temperature)


@jax.jit
def _assign(
    z: Float[Array, "T m"], prototypes: Float[Array, "K m"], temperature: Array
) -> Float[Array, "T K"]:
    return _softmin(squared_distances(z, prototypes), temperature)


def _softmin(d: Float[Array, "T K"], temperature: Array) -> Float[Array, "T K"]:
    # shift by the row minimum *before* dividing: the largest logit is exactly 0.
    # (Dividing first and letting softmax shift gave NaN under XLA fusion on CPU for
    # d ~ 1e6, temperature ~ 1e-3.)
    shifted = (d - jax.lax.stop_gradient(jnp.min(d, axis=-1, keepdims=True))) / temperature
    e = jnp.exp(-shifted)
    return e / jnp.sum(e, axis=-1, keepdims=True)


def reconstruct(
    z: ArrayLike, prototypes: ArrayLike, temperature: RealScalarLike
) -> Float[Array, "T m"]:
    r"""Soft reconstruction $\hat z_t = \sum_k q_{tk} p_k$ (the soft centroid of $z_t$).

    Args:
        z: ``(T, m)`` tokens; prototypes: ``(K, m)``; temperature: scalar ``> 0``.

    Returns:
        ``(T, m)``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> p = jnp.array([[0.0, 0.0], [2.0, 0.0]])
        >>> zhat = mf.prototypes.reconstruct(jnp.array([[1.0, 0.0]]), p, 1.0)  # equidistant: midpoint
        >>> [round(float(v), 4) for v in zhat[0]]
        [1.0, 0.0]
    """
    _check_tokens(z, prototypes)
    _check_temperature(temperature)
    return matmul(_assign(z, prototypes, temperature), prototypes)


def loss_terms(
    z: ArrayLike, prototypes: ArrayLike, temperature: RealScalarLike
) -> tuple[Float[Array, ""], Float[Array, ""], Float[Array, ""]]:
    r"""The soft quantisation loss and its exact decomposition (docs/math/prototypes.md, Decomposition).

    $L_q = \operatorname{mean}_t \sum_k q_{tk} \|z_t - p_k\|^2$,
    $L_{\text{OLS}} = \operatorname{mean}_t \|z_t - \hat z_t\|^2$,
    $V = \operatorname{mean}_t \sum_k q_{tk} \|p_k - \hat z_t\|^2$, with $L_q = L_{\text{OLS}} + V$.

    The three terms are computed independently (none is defined as a
    difference of the others). $\hat z_t$ is formed with the row-renormalised
    $q$ so that $\sum_k q_{tk} (\hat z_t - p_k) = 0$ to rounding; the identity
    then holds to a few ulps relative to $L_q$.

    Args:
        z: ``(T, m)`` tokens.
        prototypes: ``(K, m)`` prototypes.
        temperature: scalar ``> 0``.

    Returns:
        ``(L_q, L_OLS, V)``, scalars; ``V >= 0``.

    Example:
        >>> import jax, meanfield as mf
        >>> z = jax.random.normal(jax.random.key(0), (5, 3))
        >>> p = jax.random.normal(jax.random.key(1), (4, 3))
        >>> Lq, Lols, V = mf.prototypes.loss_terms(z, p, 0.5)
        >>> bool(abs(Lq - Lols - V) <= 1e-5 * Lq)
        True
    """
    _check_tokens(z, prototypes)
    _check_temperature(temperature)
    return _loss_terms(z, prototypes, temperature)


@jax.jit
def _loss_terms(
    z: Float[Array, "T m"], prototypes: Float[Array, "K m"], temperature: Array
) -> tuple[Float[Array, ""], Float[Array, ""], Float[Array, ""]]:
    d = squared_distances(z, prototypes)
    q = _softmin(d, temperature)
    q = q / jnp.sum(q, axis=-1, keepdims=True)
    zhat = matmul(q, prototypes)
    L_q = jnp.mean(jnp.sum(q * d, axis=-1))
    r = z - zhat
    L_ols = jnp.mean(jnp.sum(r * r, axis=-1))
    V = jnp.mean(jnp.sum(q * squared_distances(zhat, prototypes), axis=-1))
    return L_q, L_ols, V


def decomposition_error(
    L_q: float | np.floating | Array,
    L_ols: float | np.floating | Array,
    V: float | np.floating | Array,
) -> Array:
    r"""Relative violation $|L_q - L_{\text{OLS}} - V| / L_q$ of the decomposition (0 when exact).

    Args:
        L_q, L_ols, V: scalars (e.g. from ``loss_terms``).

    Returns:
        scalar ``()``.

    Example:
        >>> import meanfield as mf
        >>> float(mf.prototypes.decomposition_error(2.0, 1.5, 0.25))
        0.125
    """
    return jnp.abs(L_q - L_ols - V) / jnp.maximum(
        jnp.abs(L_q), jnp.finfo(jnp.result_type(L_q)).tiny
    )


# ---------------------------------------------------------------------------
# hard vector quantisation (VQ-VAE baseline)


def hard_assign(z: Array | np.ndarray, codebook: Array | np.ndarray) -> Int[Array, " T"]:
    r"""Nearest code $k^*_t = \operatorname{argmin}_k \|z_t - e_k\|^2$.

    Args:
        z: ``(T, m)`` tokens; codebook: ``(K, m)`` codes ``e_k``.

    Returns:
        ``(T,)`` int indices.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> mf.prototypes.hard_assign(jnp.array([[0.1, 0.0], [1.9, 0.0]]), jnp.array([[0.0, 0.0], [2.0, 0.0]])).tolist()
        [0, 1]
    """
    _check_tokens(z, codebook)
    return jnp.argmin(squared_distances(z, codebook), axis=-1)


def straight_through(z: Float[Array, "T m"], zq: Float[Array, "T m"]) -> Float[Array, "T m"]:
    r"""Straight-through estimator $z + \operatorname{sg}(z_q - z)$: value $z_q$, gradient of $z$.

    Args:
        z: ``(T, m)`` tokens; zq: ``(T, m)`` quantised tokens.

    Returns:
        ``(T, m)`` equal to ``zq``, with ``d/dz = I``.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> zq = jnp.array([[1.0, 1.0]])
        >>> g = jax.grad(lambda z: mf.prototypes.straight_through(z, zq).sum())(jnp.zeros((1, 2)))
        >>> mf.prototypes.straight_through(jnp.zeros((1, 2)), zq).tolist(), g.tolist()
        ([[1.0, 1.0]], [[1.0, 1.0]])
    """
    return z + jax.lax.stop_gradient(zq - z)


def vq_losses(
    z: Array | np.ndarray, codebook: Array | np.ndarray
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    r"""VQ-VAE codebook and commitment losses for the nearest code $e_t = e_{k^*_t}$.

    $\text{codebook} = \operatorname{mean}_t \|\operatorname{sg}(z_t) - e_t\|^2$ (moves codes),
    $\text{commitment} = \operatorname{mean}_t \|z_t - \operatorname{sg}(e_t)\|^2$ (moves the encoder). Only the
    winning code of each token receives a gradient: codes that win no token
    never move (dead codes).

    Args:
        z: ``(T, m)`` tokens; codebook: ``(K, m)``.

    Returns:
        ``(codebook_loss, commitment_loss)``, scalars (equal in value).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> cb, cm = mf.prototypes.vq_losses(jnp.array([[1.0, 0.0]]), jnp.array([[0.0, 0.0], [5.0, 0.0]]))
        >>> float(cb), float(cm)
        (1.0, 1.0)
    """
    _check_tokens(z, codebook)
    e = codebook[jnp.argmin(squared_distances(z, codebook), axis=-1)]
    cb = jnp.mean(jnp.sum((jax.lax.stop_gradient(z) - e) ** 2, axis=-1))
    commit = jnp.mean(jnp.sum((z - jax.lax.stop_gradient(e)) ** 2, axis=-1))
    return cb, commit


# ---------------------------------------------------------------------------
# models


def _projection(
    d: int, m: int, width: int | None, depth: int, key: PRNGKeyArray
) -> eqx.nn.Linear | eqx.nn.MLP:
    if depth == 0:
        return eqx.nn.Linear(d, m, key=key)
    return eqx.nn.MLP(
        d, m, width_size=width or max(d, m), depth=depth, activation=jax.nn.gelu, key=key
    )


def _maybe_normalize(z: Float[Array, "... m"], normalize: bool) -> Float[Array, "... m"]:
    if not normalize:
        return z
    return z / jnp.sqrt(jnp.sum(z * z, axis=-1, keepdims=True) + 1e-12)


class PrototypeReadout(eqx.Module):
    r"""Soft prototype readout (DDCL-Attention final readout).

    A sequence $x$ of $T$ encoder outputs in $\mathbb{R}^d$ is projected to tokens
    $z_t = f(x_t) \in \mathbb{R}^m$ (a linear map, or an MLP when ``depth > 0``; on the
    unit sphere when ``normalize``), softly assigned to $K$ global prototypes
    and summarised by the $K$-dimensional soft histogram
    $s_k = \operatorname{mean}_t q_{tk}$ (linear cost $O(T K m)$).

    Fields: ``projection`` (encoder, rate ``eta_theta``), ``prototypes``
    ``(K, m)`` (rate ``eta_P``), ``temperature`` (a fixed scalar leaf, never
    trained), ``normalize`` (static).

    Args:
        d: input dimension of the encoder outputs ``x_t``.
        m: prototype (latent) dimension.
        K: number of prototypes.
        temperature: ``tau > 0`` of the soft assignment.
        key: PRNG key for the projection and the prototypes.
        width, depth: ``depth = 0`` gives a linear projection ``d -> m``;
            ``depth >= 1`` an MLP with ``depth`` hidden layers of ``width``.
        normalize: put the tokens on the unit sphere ``S^{m-1}``.
        prototype_scale: prototypes start as ``N(0, scale^2 I / m)`` (norm
            about ``scale``); with ``normalize`` they start on the sphere of
            radius ``scale``.

    Returns:
        (``__call__``) the ``(K,)`` summary ``s`` of one ``(T, d)`` sequence.

    Example:
        >>> import jax, meanfield as mf
        >>> r = mf.prototypes.PrototypeReadout(8, 4, 16, 1.0, key=jax.random.key(0))
        >>> r(jax.numpy.ones((5, 8))).shape
        (16,)
    """

    projection: eqx.nn.Linear | eqx.nn.MLP
    prototypes: Float[Array, "K m"]
    temperature: Float[Array, ""]
    normalize: bool = eqx.field(static=True)

    def __init__(
        self,
        d: int,
        m: int,
        K: int,
        temperature: RealScalarLike,
        *,
        key: PRNGKeyArray,
        width: int | None = None,
        depth: int = 0,
        normalize: bool = False,
        prototype_scale: RealScalarLike = 1.0,
    ) -> None:
        d = check_int("d", d, minimum=1)
        m = check_int("m", m, minimum=1)
        K = check_int("K", K, minimum=1)
        depth = check_int("depth", depth, minimum=0)
        check_positive("temperature", temperature)
        check_positive("prototype_scale", prototype_scale)
        kproj, kp = jax.random.split(key)
        self.projection = _projection(d, m, width, depth, kproj)
        p = jax.random.normal(kp, (K, m)) * prototype_scale / math.sqrt(m)
        self.prototypes = _maybe_normalize(p, normalize) * (prototype_scale if normalize else 1.0)
        self.temperature = jnp.asarray(temperature, dtype=p.dtype)
        self.normalize = bool(normalize)

    def _check_x(self, x: ArrayLike) -> None:
        d = self.in_features
        if jnp.ndim(x) != 2 or jnp.shape(x)[1] != d:
            raise ValueError(
                f"x must be a (T, {d}) sequence of encoder outputs, got shape {jnp.shape(x)}"
            )

    @property
    def in_features(self) -> int:
        proj = self.projection
        return cast(int, proj.in_features if isinstance(proj, eqx.nn.Linear) else proj.in_size)

    def tokens(self, x: ArrayLike) -> Float[Array, "T m"]:
        """``z_t = f(x_t)`` (unit-normalised when ``normalize``)."""
        self._check_x(x)
        return _maybe_normalize(jax.vmap(self.projection)(jnp.asarray(x)), self.normalize)

    def assign(self, x: ArrayLike) -> Float[Array, "T K"]:
        """``q_tk`` for the tokens of ``x``."""
        return _assign(self.tokens(x), self.prototypes, self.temperature)

    def reconstruct(self, x: ArrayLike) -> Float[Array, "T m"]:
        """``zhat_t = sum_k q_tk p_k``."""
        return matmul(self.assign(x), self.prototypes)

    def loss_terms(
        self, x: ArrayLike
    ) -> tuple[Float[Array, ""], Float[Array, ""], Float[Array, ""]]:
        """``(L_q, L_OLS, V)`` of the tokens of ``x`` (see ``loss_terms``)."""
        return _loss_terms(self.tokens(x), self.prototypes, self.temperature)

    def __call__(self, x: ArrayLike) -> Float[Array, " K"]:
        """Soft summary ``s_k = mean_t q_tk`` (a point of the ``K``-simplex)."""
        return jnp.mean(self.assign(x), axis=0)


class HardVQ(eqx.Module):
    r"""Hard vector quantisation (VQ-VAE) with the straight-through estimator.

    $z_t = f(x_t)$, $k^*_t = \operatorname{argmin}_k \|z_t - e_k\|^2$, quantised output
    $z_t + \operatorname{sg}(e_{k^*_t} - z_t)$. Same fields and initialisation as
    ``PrototypeReadout`` (``prototypes`` is the codebook), so the two are
    compared at equal ``K``, ``m`` and budget.

    Args:
        d, m, K, key, width, depth, normalize, prototype_scale: as in
            ``PrototypeReadout`` (no temperature).

    Returns:
        (``__call__``) the ``(K,)`` code histogram ``mean_t onehot(k*_t)`` of one sequence.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> vq = mf.prototypes.HardVQ(8, 4, 16, key=jax.random.key(0))
        >>> x = jax.random.normal(jax.random.key(1), (5, 8))
        >>> vq.codes(x).shape, round(float(vq(x).sum()), 4)
        ((5,), 1.0)
    """

    projection: eqx.nn.Linear | eqx.nn.MLP
    prototypes: Float[Array, "K m"]
    normalize: bool = eqx.field(static=True)

    def __init__(
        self,
        d: int,
        m: int,
        K: int,
        *,
        key: PRNGKeyArray,
        width: int | None = None,
        depth: int = 0,
        normalize: bool = False,
        prototype_scale: RealScalarLike = 1.0,
    ) -> None:
        soft = PrototypeReadout(
            d,
            m,
            K,
            1.0,
            key=key,
            width=width,
            depth=depth,
            normalize=normalize,
            prototype_scale=prototype_scale,
        )
        self.projection = soft.projection
        self.prototypes = soft.prototypes
        self.normalize = soft.normalize

    def tokens(self, x: Float[ArrayLike, "T d"]) -> Float[Array, "T m"]:
        return _maybe_normalize(jax.vmap(self.projection)(jnp.asarray(x)), self.normalize)

    def codes(self, x: Float[ArrayLike, "T d"]) -> Int[Array, " T"]:
        return jnp.argmin(squared_distances(self.tokens(x), self.prototypes), axis=-1)

    def assign(self, x: Float[ArrayLike, "T d"]) -> Float[Array, "T K"]:
        """One-hot assignments (the hard analogue of ``q``)."""
        return jax.nn.one_hot(self.codes(x), self.prototypes.shape[0], dtype=self.prototypes.dtype)

    def reconstruct(self, x: Float[ArrayLike, "T d"]) -> Float[Array, "T m"]:
        """Straight-through quantised tokens ``z + sg(e_{k*} - z)``."""
        z = self.tokens(x)
        return straight_through(z, self.prototypes[self.codes(x)])

    def __call__(self, x: Float[ArrayLike, "T d"]) -> Float[Array, " K"]:
        return jnp.mean(self.assign(x), axis=0)


class VQAutoencoder(eqx.Module):
    r"""Encoder -> quantiser -> decoder (DDCL paradigm 4 against VQ-VAE).

    Soft (``quantizer`` a ``PrototypeReadout``):
    $\text{loss} = \operatorname{mean}_t \|x_t - g(\hat z_t)\|^2 + \lambda L_q$.
    Hard (``quantizer`` a ``HardVQ``):
    $\text{loss} = \operatorname{mean}_t \|x_t - g(z_t + \operatorname{sg}(e_t - z_t))\|^2 + \text{codebook} + \beta\, \text{commitment}$.

    Args:
        quantizer: a ``PrototypeReadout`` or ``HardVQ`` (its projection is the encoder ``f``).
        key: PRNG key of the decoder ``g: R^m -> R^d``.
        width, depth: decoder MLP size (``depth = 0``: linear).

    Returns:
        (``loss(x)``) ``(scalar loss, dict of its parts)`` for one ``(T, d)`` sequence.

    Example:
        >>> import jax, meanfield as mf
        >>> q = mf.prototypes.PrototypeReadout(8, 4, 16, 1.0, key=jax.random.key(0))
        >>> ae = mf.prototypes.VQAutoencoder(q, key=jax.random.key(1))
        >>> loss, parts = ae.loss(jax.random.normal(jax.random.key(2), (5, 8)))
        >>> loss.shape, sorted(parts)
        ((), ['L_OLS', 'L_q', 'V', 'recon'])
    """

    quantizer: PrototypeReadout | HardVQ
    decoder: eqx.nn.Linear | eqx.nn.MLP

    def __init__(
        self,
        quantizer: PrototypeReadout | HardVQ,
        *,
        key: PRNGKeyArray,
        width: int | None = None,
        depth: int = 0,
    ) -> None:
        if not isinstance(quantizer, (PrototypeReadout, HardVQ)):
            raise TypeError(
                f"quantizer must be a PrototypeReadout or HardVQ, got {type(quantizer).__name__}"
            )
        self.quantizer = quantizer
        m = quantizer.prototypes.shape[1]
        proj = quantizer.projection
        d = cast(int, proj.in_features if isinstance(proj, eqx.nn.Linear) else proj.in_size)
        self.decoder = _projection(m, d, width, depth, key)

    def loss(
        self,
        x: ArrayLike,
        *,
        lam: RealScalarLike = 0.5,
        beta: RealScalarLike = 0.25,
        decode: str = "quantized",
    ) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
        """Training loss and a dict of its parts (see the class docstring).

        ``decode="tokens"`` (soft quantiser only) decodes ``z_t`` instead of
        ``zhat_t``: a clustering autoencoder, ``||x - g(z)||^2 + lam * L_q``,
        where the reconstruction keeps the encoder from collapsing the tokens.
        """
        check_choice("decode", decode, ("quantized", "tokens"))
        qz = self.quantizer
        z = qz.tokens(x)
        if isinstance(qz, PrototypeReadout):
            q = _assign(z, qz.prototypes, qz.temperature)
            zq = z if decode == "tokens" else matmul(q, qz.prototypes)
            L_q, L_ols, V = _loss_terms(z, qz.prototypes, qz.temperature)
            xr = jax.vmap(self.decoder)(zq)
            rec = jnp.mean(jnp.sum((x - xr) ** 2, axis=-1))
            return rec + lam * L_q, {"recon": rec, "L_q": L_q, "L_OLS": L_ols, "V": V}
        if decode == "tokens":
            raise ValueError("decode='tokens' needs a PrototypeReadout quantizer")
        e = qz.prototypes[jnp.argmin(squared_distances(z, qz.prototypes), axis=-1)]
        xr = jax.vmap(self.decoder)(straight_through(z, e))
        rec = jnp.mean(jnp.sum((x - xr) ** 2, axis=-1))
        cb, commit = vq_losses(z, qz.prototypes)
        return rec + cb + beta * commit, {"recon": rec, "codebook": cb, "commitment": commit}


class HierarchicalReadout(eqx.Module):
    r"""Two-level readout (DDCL paradigm 5): level-1 prototypes feed level 2.

    Level 1: tokens ``z_t = f(x_t)`` of each sequence against prototypes
    ``P1`` ``(K1, m)`` give ``q1`` and the sequence summary
    $s = \operatorname{mean}_t q^{(1)}_t \in \mathbb{R}^{K_1}$. Level 2: the summaries ``s_n`` of the
    sequences of a batch are the tokens of a second readout against ``P2``
    ``(K2, K1)``. The decomposition $L_q = L_{\text{OLS}} + V$ holds at each level.

    Args:
        d, m, K1: input, latent and level-1 prototype counts; K2: level-2 prototypes.
        temperature1, temperature2: the two soft-assignment temperatures.
        key: PRNG key; **kw: passed to the level-1 ``PrototypeReadout``.

    Returns:
        (``__call__``) the ``(K2,)`` level-2 assignment of one ``(T, d)`` sequence.

    Example:
        >>> import jax, meanfield as mf
        >>> h = mf.prototypes.HierarchicalReadout(8, 4, 6, 3, 1.0, 0.1, key=jax.random.key(0))
        >>> xs = jax.random.normal(jax.random.key(1), (2, 5, 8))
        >>> h(xs[0]).shape, h.summaries(xs).shape
        ((3,), (2, 6))
    """

    level1: PrototypeReadout
    prototypes2: Float[Array, "K2 K1"]
    temperature2: Float[Array, ""]

    def __init__(
        self,
        d: int,
        m: int,
        K1: int,
        K2: int,
        temperature1: RealScalarLike,
        temperature2: RealScalarLike,
        *,
        key: PRNGKeyArray,
        **kw: Any,
    ) -> None:
        K2 = check_int("K2", K2, minimum=1)
        check_positive("temperature2", temperature2)
        k1, k2 = jax.random.split(key)
        self.level1 = PrototypeReadout(d, m, K1, temperature1, key=k1, **kw)
        K1 = self.level1.prototypes.shape[0]
        # level-2 prototypes start near the uniform histogram 1/K1
        self.prototypes2 = 1.0 / K1 + 0.1 / K1 * jax.random.normal(k2, (K2, K1))
        self.temperature2 = jnp.asarray(temperature2, dtype=self.prototypes2.dtype)

    def summaries(self, xs: ArrayLike) -> Float[Array, "N K1"]:
        return jax.vmap(self.level1)(xs)

    def __call__(self, x: ArrayLike) -> Float[Array, " K2"]:
        """Level-2 assignment of one sequence."""
        s = self.level1(x)[None, :]
        return _assign(s, self.prototypes2, self.temperature2)[0]

    def level_terms(
        self, xs: Array | np.ndarray
    ) -> tuple[tuple[Array, Array, Array], tuple[Array, Array, Array]]:
        """``((L_q, L_OLS, V) at level 1 over all tokens, (L_q, L_OLS, V) at level 2)``."""
        if jnp.ndim(xs) != 3:
            raise ValueError(
                f"xs must be a (N, T, d) batch of sequences, got shape {jnp.shape(xs)}"
            )
        N, T, d = xs.shape
        z = self.level1.tokens(xs.reshape(N * T, d))
        t1 = _loss_terms(z, self.level1.prototypes, self.level1.temperature)
        s = jnp.mean(
            _assign(z, self.level1.prototypes, self.level1.temperature).reshape(N, T, -1), axis=1
        )
        t2 = _loss_terms(s, self.prototypes2, self.temperature2)
        return t1, t2


# ---------------------------------------------------------------------------
# metrics


def utilization(q: ArrayLike, threshold: RealScalarLike = 0.01) -> Float[Array, ""]:
    r"""Codebook utilisation: fraction of prototypes with mean assignment $\operatorname{mean}_t q_{tk} > \text{threshold}$.

    ``q`` may be soft (rows on the simplex) or one-hot (hard VQ).

    Args:
        q: ``(T, K)`` assignments; threshold: minimum mean assignment of a used prototype.

    Returns:
        scalar ``()`` in ``[0, 1]``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> float(mf.prototypes.utilization(jnp.array([[1.0, 0, 0], [0, 1.0, 0]])))
        0.6666666865348816
    """
    _check_q(q)
    return jnp.mean((jnp.mean(q, axis=0) > threshold).astype(jnp.result_type(q)))


def separation(prototypes: ArrayLike) -> tuple[Float[Array, ""], Float[Array, ""]]:
    r"""Prototype separation $S(P)$: ``(min, mean)`` of $\|p_j - p_k\|$ over pairs $j < k$.

    Args:
        prototypes: ``(K, m)``, ``K >= 2``.

    Returns:
        ``(min, mean)`` scalars.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> lo, mean = mf.prototypes.separation(jnp.array([[0.0, 0.0], [3.0, 0.0], [3.0, 4.0]]))
        >>> float(lo), round(float(mean), 4)  # distances 3, 5, 4
        (3.0, 4.0)
    """
    if jnp.ndim(prototypes) != 2 or jnp.shape(prototypes)[0] < 2:
        raise ValueError(
            f"prototypes must be (K, m) with K >= 2, got shape {jnp.shape(prototypes)}"
        )
    return _separation(prototypes)


@jax.jit
def _separation(prototypes: Float[Array, "K m"]) -> tuple[Float[Array, ""], Float[Array, ""]]:
    K = prototypes.shape[0]
    d2 = squared_distances(prototypes, prototypes)
    iu = jnp.triu_indices(K, 1)
    dist = jnp.sqrt(jnp.maximum(d2[iu], 0.0))
    return jnp.min(dist), jnp.mean(dist)


def assignment_entropy(q: ArrayLike) -> Float[Array, ""]:
    r"""Mean assignment entropy $H(Q) = -\operatorname{mean}_t \sum_k q_{tk} \log q_{tk}$ (nats, $0 \le H \le \log K$).

    Args:
        q: ``(T, K)`` assignments (rows on the simplex).

    Returns:
        scalar ``()``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> round(float(mf.prototypes.assignment_entropy(jnp.array([[0.5, 0.5], [1.0, 0.0]]))), 4)  # (log 2)/2
        0.3466
    """
    _check_q(q)
    return -jnp.mean(jnp.sum(jax.scipy.special.xlogy(q, q), axis=-1))


def _labels(name: str, y: _Labels) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of integer labels, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise TypeError(f"{name} must hold integer labels, got dtype {y.dtype}")
    return y


def _pair(labels_true: _Labels, labels_pred: _Labels) -> tuple[np.ndarray, np.ndarray]:
    a, b = _labels("labels_true", labels_true), _labels("labels_pred", labels_pred)
    if a.shape != b.shape:
        raise ValueError(
            f"labels_true and labels_pred must have the same length, got {a.shape} and {b.shape}"
        )
    if a.size == 0:
        raise ValueError("need at least one label")
    return a, b


def clustering_accuracy(labels_true: _Labels, labels_pred: _Labels) -> float:
    r"""Clustering accuracy $\max_\sigma \frac1N \sum_n \mathbf{1}[y_n = \sigma(c_n)]$ over one-to-one
    maps $\sigma$ from clusters to classes (Hungarian matching,
    ``scipy.optimize.linear_sum_assignment``; unmatched clusters count as errors).

    Args:
        labels_true: ``(N,)`` integer classes ``y``; labels_pred: ``(N,)`` integer clusters ``c``.

    Returns:
        float in ``[0, 1]``.

    Example:
        >>> import meanfield as mf
        >>> mf.prototypes.clustering_accuracy([0, 0, 1, 1], [1, 1, 0, 2])
        0.75
    """
    from scipy.optimize import linear_sum_assignment

    a, b = _pair(labels_true, labels_pred)
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    C = np.zeros((bi.max() + 1, ai.max() + 1), dtype=np.int64)
    np.add.at(C, (bi, ai), 1)
    rows, cols = linear_sum_assignment(C, maximize=True)
    return float(C[rows, cols].sum() / a.size)


def nmi(labels_true: _Labels, labels_pred: _Labels) -> float:
    r"""Normalised mutual information $\mathrm{NMI} = I(y; c) / ((H(y) + H(c)) / 2)$
    (``sklearn.metrics.normalized_mutual_info_score``, arithmetic normalisation).

    Args:
        labels_true, labels_pred: ``(N,)`` integer labels.

    Returns:
        float in ``[0, 1]`` (1: identical partitions up to relabelling).

    Example:
        >>> import meanfield as mf
        >>> round(mf.prototypes.nmi([0, 0, 1, 1], [1, 1, 0, 0]), 4)
        1.0
    """
    from sklearn.metrics import normalized_mutual_info_score

    a, b = _pair(labels_true, labels_pred)
    return float(normalized_mutual_info_score(a, b))


def ari(labels_true: _Labels, labels_pred: _Labels) -> float:
    r"""Adjusted Rand index $\mathrm{ARI} = (\mathrm{RI} - E[\mathrm{RI}]) / (\max \mathrm{RI} - E[\mathrm{RI}])$ (``sklearn.metrics.adjusted_rand_score``).

    Args:
        labels_true, labels_pred: ``(N,)`` integer labels.

    Returns:
        float ``<= 1`` (1: identical partitions, ``~0``: chance).

    Example:
        >>> import meanfield as mf
        >>> round(mf.prototypes.ari([0, 0, 1, 1], [1, 1, 0, 0]), 4)
        1.0
    """
    from sklearn.metrics import adjusted_rand_score

    a, b = _pair(labels_true, labels_pred)
    return float(adjusted_rand_score(a, b))


# ---------------------------------------------------------------------------
# two-timescale training


_PROTOTYPE_FIELDS = ("prototypes", "prototypes2")
_FROZEN_FIELDS = ("temperature", "temperature2")


def param_labels(model: Any) -> object:
    """Optimiser labels for ``optax.multi_transform``: ``"prototypes"`` for leaves
    under a field named ``prototypes``/``prototypes2``, ``"frozen"`` for the
    temperatures, ``"theta"`` for every other array (encoder, projection, decoder).

    Args:
        model: an equinox model (e.g. ``PrototypeReadout``).

    Returns:
        a PyTree of strings matching ``eqx.filter(model, eqx.is_inexact_array)``.

    Example:
        >>> import jax, meanfield as mf
        >>> r = mf.prototypes.PrototypeReadout(8, 4, 16, 1.0, key=jax.random.key(0))
        >>> lab = mf.prototypes.param_labels(r)
        >>> lab.prototypes, lab.temperature, lab.projection.weight
        ('prototypes', 'frozen', 'theta')
    """

    def label(path: tuple[Any, ...], _: Any) -> str:
        names = {getattr(k, "name", None) for k in path}
        if names & set(_FROZEN_FIELDS):
            return "frozen"
        if names & set(_PROTOTYPE_FIELDS):
            return "prototypes"
        return "theta"

    params = eqx.filter(model, eqx.is_inexact_array)
    return jax.tree_util.tree_map_with_path(label, params)


def two_timescale_optimizer(
    model: Any,
    eta_theta: RealScalarLike,
    eta_P: RealScalarLike,
    *,
    optimizer: str = "adam",
) -> optax.GradientTransformation:
    r"""``optax.multi_transform`` with rate ``eta_theta`` on the encoder/projection
    and ``eta_P`` on the prototypes (``eps = eta_theta / eta_P``); temperatures frozen.

    ``optimizer`` is ``"adam"`` or ``"sgd"``. The rates may be traced (a sweep
    over ``eps`` is one ``vmap``).

    SGD: $\theta \leftarrow \theta - \eta_\theta g_\theta$, $P \leftarrow P - \eta_P g_P$; Adam scales each
    gradient by Adam's moments first.

    Args:
        model: the model whose parameters are labelled (``param_labels``).
        eta_theta, eta_P: the two rates ``> 0``; optimizer: ``"adam"`` or ``"sgd"``.

    Returns:
        an ``optax.GradientTransformation``.

    Example:
        >>> import jax, equinox as eqx, meanfield as mf
        >>> r = mf.prototypes.PrototypeReadout(8, 4, 16, 1.0, key=jax.random.key(0))
        >>> opt = mf.prototypes.two_timescale_optimizer(r, 1e-3, 1e-1, optimizer="sgd")
        >>> p = eqx.filter(r, eqx.is_inexact_array)
        >>> g = jax.tree_util.tree_map(jax.numpy.ones_like, p)
        >>> upd, _ = opt.update(g, opt.init(p), p)
        >>> round(float(upd.prototypes[0, 0]), 4), float(upd.temperature)  # -eta_P * 1; frozen
        (-0.1, 0.0)
    """
    check_choice("optimizer", optimizer, ("adam", "sgd"))
    check_positive("eta_theta", eta_theta)
    check_positive("eta_P", eta_P)

    def rule(rate: RealScalarLike) -> optax.GradientTransformation:
        base = optax.scale_by_adam() if optimizer == "adam" else optax.identity()
        return optax.chain(base, optax.scale(-1.0 * rate))

    labels = param_labels(model)
    # a callable, since the labels PyTree is itself a (callable) Module
    return optax.multi_transform(
        {"theta": rule(eta_theta), "prototypes": rule(eta_P), "frozen": optax.set_to_zero()},
        lambda _: labels,
    )


def train(
    model: _Model,
    loss_fn: Callable[..., Any],
    data: Any,
    *,
    key: PRNGKeyArray,
    eta_theta: RealScalarLike,
    eta_P: RealScalarLike,
    epochs: int,
    batch_size: int,
    record: Callable[..., Any] | None = None,
    optimizer: str = "adam",
) -> tuple[_Model, dict[str, Array]]:
    """Two-timescale minibatch training.

    Each epoch shuffles the ``N`` examples of ``data`` (a PyTree of arrays with
    leading axis ``N``), takes ``floor(N / batch_size)`` steps of
    ``loss_fn(model, batch) -> scalar`` (or ``(scalar, aux)``) with
    ``two_timescale_optimizer``, then evaluates ``record(model)`` (a dict
    of arrays). One ``lax.scan`` over epochs; jit- and vmap-compatible
    (``key``, ``eta_theta``, ``eta_P`` may be batched). Calls with equal concrete rates on
    models of the same structure, passing the same ``loss_fn`` and ``record`` objects, reuse one
    compiled program (define those functions once, outside a loop over runs).

    Args:
        model: an equinox model; loss_fn: ``(model, batch) -> scalar`` or ``(scalar, aux)``.
        data: PyTree of arrays with leading axis ``N``; key: PRNG key (shuffles).
        eta_theta, eta_P, optimizer: as in ``two_timescale_optimizer``.
        epochs, batch_size: loop sizes (``batch_size <= N``).
        record: ``model -> dict`` of arrays evaluated before training and after each epoch.

    Returns:
        ``(model, history)`` where ``history[name]`` has leading axis
        ``epochs + 1`` (index 0 is before training).

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> r = mf.prototypes.PrototypeReadout(4, 2, 3, 1.0, key=jax.random.key(0))
        >>> x = jax.random.normal(jax.random.key(1), (8, 5, 4))
        >>> lq = lambda m, xb: jnp.mean(jax.vmap(lambda s: m.loss_terms(s)[0])(xb))
        >>> r, hist = mf.prototypes.train(r, lq, x, key=jax.random.key(2), eta_theta=1e-2, eta_P=1e-1,
        ...                               epochs=2, batch_size=4, record=lambda m: {"L_q": lq(m, x)})
        >>> hist["L_q"].shape
        (3,)
    """
    epochs = check_int("epochs", epochs, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    leaves = jax.tree_util.tree_leaves(data)
    if not leaves:
        raise ValueError("data must contain at least one array")
    N = jnp.shape(leaves[0])[0]
    if any(jnp.shape(leaf)[0] != N for leaf in leaves):
        raise ValueError("every array of data must have the same leading size N")
    if batch_size > N:
        raise ValueError(f"batch_size must be <= N = {N}, got {batch_size}")
    opt = _shared_optimizer(model, eta_theta, eta_P, optimizer)
    record = record if record is not None else _no_record
    return _train(model, opt, loss_fn, data, key, epochs, batch_size, record)


def _no_record(model: Any) -> dict:
    return {}


#: optimizers already built, keyed by the labels and the rates: ``_train``'s program is keyed on the
#: optimizer (a static argument), so calls with equal rates on equally labelled models (the same
#: ``loss_fn`` and ``record`` objects too) share one traced program instead of tracing a new one.
#: Bounded: past ``_MAX_OPTIMIZERS`` entries (a loop over many rates) it starts again empty.
_OPTIMIZERS: dict = {}
_MAX_OPTIMIZERS = 64


def _shared_optimizer(
    model: Any, eta_theta: RealScalarLike, eta_P: RealScalarLike, optimizer: str
) -> optax.GradientTransformation:
    labels = param_labels(model)
    leaves, treedef = jax.tree_util.tree_flatten(labels)
    try:
        key = (treedef, tuple(leaves), float(eta_theta), float(eta_P), optimizer)
        hash(key)
    except (TypeError, jax.errors.ConcretizationTypeError):  # traced rates: no sharing
        return two_timescale_optimizer(model, eta_theta, eta_P, optimizer=optimizer)
    if key not in _OPTIMIZERS:
        if len(_OPTIMIZERS) >= _MAX_OPTIMIZERS:
            _OPTIMIZERS.clear()
        _OPTIMIZERS[key] = two_timescale_optimizer(model, eta_theta, eta_P, optimizer=optimizer)
    return _OPTIMIZERS[key]


@eqx.filter_jit
def _train(
    model: _Model,
    opt: optax.GradientTransformation,
    loss_fn: Callable[..., Any],
    data: Any,
    key: PRNGKeyArray,
    epochs: int,
    batch_size: int,
    record: Callable[..., Any],
) -> tuple[_Model, dict[str, Array]]:
    N = jax.tree_util.tree_leaves(data)[0].shape[0]
    steps = N // batch_size
    params, static = eqx.partition(model, eqx.is_inexact_array)
    opt_state = opt.init(params)

    def scalar_loss(p: Any, batch: Any) -> Array:
        out = loss_fn(eqx.combine(p, static), batch)
        return out[0] if isinstance(out, tuple) else out

    grad = jax.grad(scalar_loss)

    def step(carry: tuple[Any, Any], idx: Int[Array, " b"]) -> tuple[tuple[Any, Any], None]:
        p, s = carry
        batch = jax.tree_util.tree_map(lambda a: a[idx], data)
        g = grad(p, batch)
        upd, s = opt.update(g, s, p)
        return (optax.apply_updates(p, upd), s), None

    def epoch(carry: tuple[Any, Any], k: PRNGKeyArray) -> tuple[tuple[Any, Any], Any]:
        perm = jax.random.permutation(k, N)[: steps * batch_size].reshape(steps, batch_size)
        carry, _ = jax.lax.scan(step, carry, perm)
        return carry, record(eqx.combine(carry[0], static))

    rec0 = record(model)
    (params, _), hist = jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, epochs))
    hist = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b], axis=0), rec0, hist)
    return eqx.combine(params, static), hist


# ---------------------------------------------------------------------------
# two-timescale stability: the learning-rate conditions of Theorem 1 (reconstruction)


class TwoTimescaleBounds(NamedTuple):
    r"""Constants of the two-timescale stability conditions (see ``stability_boundary``).

    ``eta_P_max`` $= 2/\lambda_{\max}(C)$ (condition (i)), ``eta_theta_max``
    $= 2/\mu_{\max}(S)$ (condition (ii)), ``eps_star`` $= \mu_{\min}\lambda_{\min} /
    (\beta\gamma + \mu_{\min}\delta)$ (condition (iv)); ``lambda_min``, ``lambda_max``: extreme
    eigenvalues of the prototype block $C$; ``mu_min``, ``mu_max``: of the Schur complement $S$;
    ``beta``, ``gamma``, ``delta``: the coupling norms.
    """

    eta_P_max: float
    eta_theta_max: float
    eps_star: float
    lambda_min: float
    lambda_max: float
    mu_min: float
    mu_max: float
    beta: float
    gamma: float
    delta: float


def _hessian_blocks(
    hessian: ArrayLike, n_theta: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    H = np.asarray(hessian, dtype=np.float64)
    if H.ndim != 2 or H.shape[0] != H.shape[1]:
        raise ValueError(f"hessian must be a square (n, n) matrix, got shape {H.shape}")
    if not np.all(np.isfinite(H)):
        raise ValueError("hessian must be finite")
    n = H.shape[0]
    if (
        isinstance(n_theta, bool)
        or not isinstance(n_theta, (int, np.integer))
        or not 1 <= n_theta < n
    ):
        raise ValueError(
            f"n_theta (the number of encoder parameters, listed first) must be an int in [1, {n - 1}], "
            f"got {n_theta!r}"
        )
    scale = max(float(np.abs(H).max()), np.finfo(np.float64).tiny)
    if float(np.abs(H - H.T).max()) > 1e-6 * scale:
        raise ValueError(
            f"hessian must be symmetric, got max |H - H^T| = {float(np.abs(H - H.T).max()):.3g} "
            f"(max |H| = {scale:.3g})"
        )
    H = 0.5 * (H + H.T)
    k = int(n_theta)
    return H, H[:k, :k], H[:k, k:], H[k:, k:]


def _rates(eta_theta: _Rates, eta_P: _Rates) -> tuple[np.ndarray, ...]:
    for name, v in (("eta_theta", eta_theta), ("eta_P", eta_P)):
        a = np.asarray(v, dtype=np.float64)
        if not np.all(np.isfinite(a)) or np.any(a <= 0):
            raise ValueError(f"{name} must be > 0 and finite, got {v!r}")
    return np.broadcast_arrays(np.asarray(eta_theta, np.float64), np.asarray(eta_P, np.float64))


def stability_boundary(hessian: ArrayLike, n_theta: int) -> TwoTimescaleBounds:
    r"""The explicit learning-rate conditions of two-timescale gradient descent (Thm. 1, reconstructed).

    Reconstruction (the theorem's statement was lost in the extraction; the surviving text
    names Tikhonov's singular perturbation theory, prototypes faster than the encoder,
    explicit rate conditions and condition (iv) $\varepsilon \le 0.1$). Training is
    $\theta \leftarrow \theta - \eta_\theta \nabla_\theta L$, $P \leftarrow P - \eta_P \nabla_P L$,
    $\varepsilon = \eta_\theta / \eta_P$. Near a minimum $w^* = (\theta^*, P^*)$ with Hessian

    $$H = \begin{pmatrix} A & B \\ B^\top & C \end{pmatrix}
    \quad (A = \nabla^2_{\theta\theta} L,\ B = \nabla^2_{\theta P} L,\ C = \nabla^2_{PP} L)$$

    the error obeys $e \leftarrow (I - D H) e$, $D = \operatorname{diag}(\eta_\theta I, \eta_P I)$.
    The fast (boundary-layer) system is the prototype update at frozen $\theta$; its
    equilibrium, the quasi-steady manifold, is $P^*(\theta) = P^* - C^{-1} B^\top (\theta - \theta^*)$
    (the soft centroids of the frozen encoder). The reduced (slow) system is
    $\theta \leftarrow \theta - \eta_\theta \nabla_\theta L(\theta, P^*(\theta))$, whose Hessian is
    the Schur complement $S = A - B C^{-1} B^\top$. In the coordinates
    $x = \theta - \theta^*$, $y = P - P^*(\theta)$ the linearised step is

    $$x \leftarrow (I - \eta_\theta S)\, x - \eta_\theta B y, \qquad
    y \leftarrow -\eta_\theta C^{-1} B^\top S\, x + (I - \eta_P C - \eta_\theta C^{-1} B^\top B)\, y .$$

    With $\beta = \|B\|$, $\gamma = \|C^{-1} B^\top S\|$, $\delta = \|C^{-1} B^\top B\|$
    (spectral norms), $a = \|I - \eta_\theta S\|$, $b = \|I - \eta_P C\|$, the block norms of
    this map are dominated entrywise by
    $N = \begin{pmatrix} a & \eta_\theta \beta \\ \eta_\theta \gamma & b + \eta_\theta \delta \end{pmatrix}$,
    so the spectral radius of the step is at most $\rho(N)$ (``stability_certificate``).
    The conditions are (i) $C \succ 0$ and $\eta_P < 2/\lambda_{\max}(C)$ (fast system stable);
    (ii) $S \succ 0$ and $\eta_\theta < 2/\mu_{\max}(S)$ (reduced system stable); (iii) the
    coupling constants $\beta, \gamma, \delta$ above are finite; (iv) $\rho(N) < 1$. In the
    small-rate regime $\eta_P \le 2/(\lambda_{\min} + \lambda_{\max})$,
    $\eta_\theta \le 2/(\mu_{\min} + \mu_{\max})$ one has $1 - a = \eta_\theta \mu_{\min}$,
    $1 - b = \eta_P \lambda_{\min}$, and (iv) is exactly the timescale condition

    $$\varepsilon = \frac{\eta_\theta}{\eta_P} < \varepsilon^* =
    \frac{\mu_{\min} \lambda_{\min}}{\beta \gamma + \mu_{\min} \delta},$$

    of the same form as the classical bound of the composite Lyapunov function for
    singularly perturbed systems (Khalil, *Nonlinear Systems*, Thm. 11.3). The conditions are
    sufficient, not necessary: for a gradient step the exact linear condition is
    $\lambda_{\max}(D^{1/2} H D^{1/2}) < 2$ (``two_timescale_radius``).

    Args:
        hessian: ``(n, n)`` symmetric Hessian at the minimum, encoder parameters first.
        n_theta: number of encoder parameters (the size of the $A$ block), ``1 <= n_theta < n``.

    Returns:
        ``TwoTimescaleBounds`` (floats; ``eps_star = inf`` when the blocks are uncoupled, $B = 0$).

    Raises:
        ValueError: if $C$ or $S$ is not positive definite (not a strict minimum).

    Example:
        >>> import numpy as np, meanfield as mf
        >>> H = np.array([[1.0, 0.5], [0.5, 2.0]])  # scalar theta and P: eps* = c^2 / (2 b^2)
        >>> bd = mf.prototypes.stability_boundary(H, 1)
        >>> bd.eta_P_max, round(bd.eta_theta_max, 6), round(bd.eps_star, 6)
        (1.0, 2.285714, 8.0)
    """
    _, A, B, C = _hessian_blocks(hessian, n_theta)
    lam = np.linalg.eigvalsh(C)
    if lam[0] <= 0:
        raise ValueError(
            f"the prototype block C of the hessian must be positive definite (condition (i)), "
            f"got smallest eigenvalue {lam[0]:.3g}"
        )
    CinvBt = np.linalg.solve(C, B.T)
    S = A - B @ CinvBt
    S = 0.5 * (S + S.T)
    mu = np.linalg.eigvalsh(S)
    if mu[0] <= 0:
        raise ValueError(
            f"the Schur complement S = A - B C^-1 B^T must be positive definite (condition (ii): "
            f"the reduced system is at a strict minimum), got smallest eigenvalue {mu[0]:.3g}"
        )
    beta = float(np.linalg.norm(B, 2))
    gamma = float(np.linalg.norm(CinvBt @ S, 2))
    delta = float(np.linalg.norm(CinvBt @ B, 2))
    denom = beta * gamma + mu[0] * delta
    eps_star = float(mu[0] * lam[0] / denom) if denom > 0 else math.inf
    return TwoTimescaleBounds(
        eta_P_max=float(2.0 / lam[-1]),
        eta_theta_max=float(2.0 / mu[-1]),
        eps_star=eps_star,
        lambda_min=float(lam[0]),
        lambda_max=float(lam[-1]),
        mu_min=float(mu[0]),
        mu_max=float(mu[-1]),
        beta=beta,
        gamma=gamma,
        delta=delta,
    )


def stability_certificate(
    hessian: ArrayLike, n_theta: int, eta_theta: _Rates, eta_P: _Rates
) -> np.ndarray:
    r"""Certified contraction factor $\rho(N)$ of two-timescale gradient descent (Thm. 1, reconstructed).

    $N = \begin{pmatrix} a & \eta_\theta \beta \\ \eta_\theta \gamma & c \end{pmatrix}$ with
    $a = \max_i |1 - \eta_\theta \mu_i(S)|$, $c = \max_j |1 - \eta_P \lambda_j(C)| + \eta_\theta \delta$
    (``stability_boundary`` gives the derivation and the constants), and

    $$\rho(N) = \frac{a + c}{2} + \sqrt{\Big(\frac{a - c}{2}\Big)^2 + \eta_\theta^2 \beta \gamma}
    \ \ge\ \rho(I - D H).$$

    The rates satisfy the theorem's conditions (i)-(iv) exactly when the value is ``< 1``;
    then the linearised training is a contraction and the minimum is locally exponentially
    stable. ``eta_theta`` and ``eta_P`` broadcast against each other.

    Args:
        hessian: ``(n, n)`` symmetric Hessian at the minimum, encoder parameters first.
        n_theta: number of encoder parameters.
        eta_theta, eta_P: rates ``> 0`` (scalars or arrays that broadcast).

    Returns:
        NumPy float64 array of the broadcast shape.

    Example:
        >>> import numpy as np, meanfield as mf
        >>> H = np.array([[1.0, 0.5], [0.5, 2.0]])
        >>> cert = mf.prototypes.stability_certificate(H, 1, [0.05, 3.0], 0.5)
        >>> (cert < 1).tolist()  # eta_theta = 3 > 2 / mu_max(S) = 2.29 breaks condition (ii)
        [True, False]
    """
    bd = stability_boundary(hessian, n_theta)
    et, ep = _rates(eta_theta, eta_P)
    a = np.maximum(np.abs(1.0 - et * bd.mu_min), np.abs(1.0 - et * bd.mu_max))
    b = np.maximum(np.abs(1.0 - ep * bd.lambda_min), np.abs(1.0 - ep * bd.lambda_max))
    c = b + et * bd.delta
    return np.asarray(0.5 * (a + c) + np.sqrt(0.25 * (a - c) ** 2 + et**2 * bd.beta * bd.gamma))


def two_timescale_radius(
    hessian: ArrayLike, n_theta: int, eta_theta: _Rates, eta_P: _Rates
) -> np.ndarray:
    r"""Exact spectral radius of the linearised two-timescale gradient step $e \leftarrow (I - D H) e$.

    $D = \operatorname{diag}(\eta_\theta I_{n_\theta}, \eta_P I_{n - n_\theta})$. Since
    $I - D H = D^{1/2} (I - D^{1/2} H D^{1/2}) D^{-1/2}$, its eigenvalues are
    $1 - \nu_i$ with $\nu_i$ the (real) eigenvalues of the symmetric $D^{1/2} H D^{1/2}$:

    $$\rho = \max_i |1 - \nu_i|, \qquad \rho < 1 \iff H \succ 0 \text{ and } \nu_{\max} < 2 .$$

    No timescale condition appears: for an exact gradient step on a strict minimum the
    conditions of ``stability_boundary`` are sufficient, not necessary. ``eta_theta`` and
    ``eta_P`` broadcast against each other; ``hessian`` need not be definite.

    Args:
        hessian: ``(n, n)`` symmetric Hessian, encoder parameters first.
        n_theta: number of encoder parameters.
        eta_theta, eta_P: rates ``> 0``.

    Returns:
        NumPy float64 array of the broadcast shape.

    Example:
        >>> import numpy as np, meanfield as mf
        >>> H = np.diag([1.0, 4.0])  # uncoupled: stable iff eta_theta < 2 and eta_P < 0.5
        >>> mf.prototypes.two_timescale_radius(H, 1, 1.0, [0.25, 0.75]).round(12).tolist()
        [0.0, 2.0]
    """
    H, *_ = _hessian_blocks(hessian, n_theta)
    et, ep = _rates(eta_theta, eta_P)
    n = H.shape[0]
    k = int(n_theta)
    s = np.sqrt(
        np.concatenate(
            [
                np.broadcast_to(et[..., None], (*et.shape, k)),
                np.broadcast_to(ep[..., None], (*ep.shape, n - k)),
            ],
            axis=-1,
        )
    )
    nu = np.linalg.eigvalsh(s[..., :, None] * H * s[..., None, :])
    return np.asarray(np.max(np.abs(1.0 - nu), axis=-1))


# ---------------------------------------------------------------------------
# datasets (no download)


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits: ``X`` ``(1797, 64)`` float32 in ``[0, 1]``, labels ``y`` in ``0..9``.

    ``X = pixels / 16`` (pixel intensities are ``0..16``); no arguments, no download.

    Returns:
        ``(X, y)``: ``(1797, 64)`` float32 and ``(1797,)`` int32 NumPy arrays.

    Example:
        >>> import meanfield as mf
        >>> X, y = mf.prototypes.load_digits()
        >>> X.shape, y.shape, float(X.max()), int(y.max())
        ((1797, 64), (1797,), 1.0, 9)
    """
    from sklearn.datasets import load_digits as _ld

    data = _ld()
    return (data.data / 16.0).astype(np.float32), data.target.astype(np.int32)


def digit_patches(patch: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping ``patch x patch`` patches of the 8x8 digits (``load_digits``), one token per patch.

    The image-patch tokens of a VQ-VAE at CPU scale: ``patch = 4`` cuts every
    image into a 2x2 grid of 4x4 patches (a downsampling by 4, as a VQ-VAE's
    encoder maps a 32x32 CIFAR-10 image to an 8x8 grid of latents). Patches
    are flattened row-major; image ``n``'s patches are rows
    ``n * (8 // patch)**2 ...`` of the result.

    Args:
        patch: patch side, a divisor of 8 (1, 2, 4 or 8).

    Returns:
        ``(tokens, image)``: ``(1797 (8/patch)^2, patch^2)`` float32 pixels in ``[0, 1]``
        and the ``(1797 (8/patch)^2,)`` int32 index of each patch's image.

    Example:
        >>> import meanfield as mf
        >>> X, img = mf.prototypes.digit_patches(4)
        >>> X.shape, int(img[5]), bool((X[:4].reshape(2, 2, 4, 4).transpose(0, 2, 1, 3).reshape(64)
        ...                            == mf.prototypes.load_digits()[0][0]).all())
        ((7188, 16), 1, True)
    """
    patch = check_int("patch", patch, minimum=1)
    check_choice("patch", patch, (1, 2, 4, 8))
    X, _ = load_digits()
    n, g = X.shape[0], 8 // patch
    tokens = (
        X.reshape(n, g, patch, g, patch).transpose(0, 1, 3, 2, 4).reshape(n * g * g, patch * patch)
    )
    return np.ascontiguousarray(tokens), np.repeat(np.arange(n, dtype=np.int32), g * g)


def gaussian_mixture_tokens(
    key: PRNGKeyArray,
    n_sequences: int,
    seq_len: int,
    d: int,
    *,
    n_classes: int = 4,
    components_per_class: int = 4,
    spread: RealScalarLike = 3.0,
    noise: RealScalarLike = 0.5,
    dtype: DTypeLike = jnp.float32,
) -> tuple[Float[Array, "N T d"], Int[Array, "N T"], Int[Array, " N"], Float[Array, "C d"]]:
    """Seeded Gaussian-mixture token set.

    ``C = n_classes * components_per_class`` means ``mu_c ~ N(0, spread^2 I_d / d)``
    (pairwise distances ``~ spread * sqrt(2)``). Sequence ``n`` has class
    ``y_n`` uniform in ``0..n_classes-1``; each of its ``seq_len`` tokens picks
    a component ``c`` uniformly among its class's ``components_per_class`` and
    is ``mu_c + noise * N(0, I_d)``.

    Args:
        key: PRNG key; n_sequences, seq_len, d: output sizes ``N, T, d``.
        n_classes, components_per_class, spread, noise: mixture parameters (above).
        dtype: float dtype.

    Returns:
        ``(x, components, classes, means)``: ``(N, T, d)`` tokens, ``(N, T)``
        component labels, ``(N,)`` sequence classes, ``(C, d)`` means.

    Example:
        >>> import jax, meanfield as mf
        >>> x, comps, classes, means = mf.prototypes.gaussian_mixture_tokens(jax.random.key(0), 3, 5, 2)
        >>> x.shape, comps.shape, classes.shape, means.shape
        ((3, 5, 2), (3, 5), (3,), (16, 2))
    """
    n_sequences = check_int("n_sequences", n_sequences, minimum=1)
    seq_len = check_int("seq_len", seq_len, minimum=1)
    d = check_int("d", d, minimum=1)
    n_classes = check_int("n_classes", n_classes, minimum=1)
    components_per_class = check_int("components_per_class", components_per_class, minimum=1)
    check_positive("spread", spread)
    check_positive("noise", noise)
    km, ky, kc, kn = jax.random.split(key, 4)
    C = n_classes * components_per_class
    means = jax.random.normal(km, (C, d), dtype=dtype) * spread / math.sqrt(d)
    classes = jax.random.randint(ky, (n_sequences,), 0, n_classes)
    within = jax.random.randint(kc, (n_sequences, seq_len), 0, components_per_class)
    comps = classes[:, None] * components_per_class + within
    x = means[comps] + jax.random.normal(kn, (n_sequences, seq_len, d), dtype=dtype) * noise
    return x, comps, classes, means
