r"""Attention weights of ``mf.models.SelfAttention``: random weight ensembles, and the three
normalisations of the logits (softmax, Sinkhorn, hardmax). Public through ``mf.models``.

The ensembles (``random_weights``) are those of the public simulators of the field:
``borjanG/2023-transformers-rotf`` ``phase-diagrams.py`` ``generate_KQV`` (``--randomKQ 1``:
$Q^\top K = G_1 G_2 / \sqrt d$; ``--randomKQ 3``: GOE $(G + G^\top)/\sqrt 2$; ``--randomV 2/3``:
$V = \pm Q^\top K / \text{norm}$ with norm $\sqrt d$, resp. $\sqrt{d + 1}$ for GOE and 1 for the
identity) and GPT-2's initialisation (entries $N(0, 0.02^2)$).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from ._checks import check_choice, check_int
from ._declare import Variant, param
from ._precision import einsum

__all__ = [
    "AttentionKind",
    "Softmax",
    "Sinkhorn",
    "Hardmax",
    "ENSEMBLES",
    "VALUES",
    "ATTENTIONS",
    "random_weights",
    "sinkhorn",
    "hardmax",
    "masked_softmax",
]

#: ``random_weights(ensemble=)``: the law of $(Q, K)$.
ENSEMBLES = ("identity", "gaussian", "symmetric", "gpt2")
#: ``random_weights(value=)``: the law of $V$.
VALUES = ("identity", "gaussian", "+qk", "-qk")

_GPT2_STD = 0.02


def _qk_norm(ensemble: str, d: int) -> float:
    """The norm rotf's ``generate_KQV`` divides $Q^\\top K$ by for ``value = "+qk"``/``"-qk"``."""
    if ensemble == "identity":
        return 1.0
    if ensemble == "symmetric":
        return float(np.sqrt(d + 1.0))
    if ensemble == "gpt2":  # simuformer's normV for its gpt2 modes
        return 1.0
    return float(np.sqrt(d))


def random_weights(
    key: PRNGKeyArray,
    d: int,
    *,
    heads: int = 1,
    ensemble: str = "gaussian",
    value: str = "identity",
    dtype: Any = None,
) -> tuple[Float[Array, "heads d d"], Float[Array, "heads d d"], Float[Array, "heads d d"]]:
    r"""Query, key and value weights ``(Q, K, V)``, each ``(heads, d, d)``, from the ensembles of the field.

    ``ensemble`` (the law of $Q, K$; only $Q^\top K$ enters the logits $\langle Q x, K y\rangle$):

    * ``"identity"``: $Q = K = I$;
    * ``"gaussian"``: $Q = G_1^\top / d^{1/4}$, $K = G_2 / d^{1/4}$, so $Q^\top K = G_1 G_2 / \sqrt d$
      (rotf ``--randomKQ 1``), $G$ with i.i.d. $N(0, 1)$ entries;
    * ``"symmetric"``: $Q = I$, $K = (G + G^\top)/\sqrt 2$, a GOE matrix (rotf ``--randomKQ 3``);
    * ``"gpt2"``: $Q = I$ and $K$ with i.i.d. $N(0, 0.02^2)$ entries, so $Q^\top K$ has GPT-2's
      initialisation (simuformer ``--randomKQ 4``, which draws $Q^\top K$ itself).

    ``value`` (the law of $V$): ``"identity"``; ``"gaussian"``, entries $N(0, 1/d)$; ``"+qk"`` /
    ``"-qk"``: $V = \pm Q^\top K / \text{norm}$ (rotf ``--randomV 2/3``: gradient ascent / descent),
    norm $= \sqrt d$ (``gaussian``), $\sqrt{d + 1}$ (``symmetric``), 1 (``identity``, ``gpt2``).
    The public simulators apply $V$ on the right of row vectors ($x_j^\top V$): their $V$ is the
    transpose of the $V$ here (the same for ``symmetric``).

    Every head draws its own matrices (independent keys). Traceable: ``key`` may be traced (a
    sweep over ``weight_seed`` compiles once).

    Args:
        key: a JAX PRNG key.
        d: the dimension.
        heads: the number of heads ``H >= 1``.
        ensemble: one of ``ENSEMBLES``.
        value: one of ``VALUES``.
        dtype: floating dtype (default JAX's default float).

    Returns:
        ``(Q, K, V)``, each ``(heads, d, d)``.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> Q, K, V = mf.models.random_weights(jax.random.key(0), 4, heads=2, ensemble="symmetric", value="-qk")
        >>> Q.shape, bool(jnp.allclose(K, jnp.swapaxes(K, 1, 2))), bool(jnp.allclose(V, -K / 5 ** 0.5))
        ((2, 4, 4), True, True)
    """
    check_int("d", d, minimum=1)
    check_int("heads", heads, minimum=1)
    check_choice("ensemble", ensemble, ENSEMBLES)
    check_choice("value", value, VALUES)
    dtype = dtype or jnp.result_type(float)
    kq, kk, kv = jax.random.split(key, 3)
    eye = jnp.broadcast_to(jnp.eye(d, dtype=dtype), (heads, d, d))
    shape = (heads, d, d)
    if ensemble == "identity":
        Q, K = eye, eye
    elif ensemble == "gaussian":
        scale = d**-0.25
        Q = jnp.swapaxes(jax.random.normal(kq, shape, dtype), 1, 2) * scale
        K = jax.random.normal(kk, shape, dtype) * scale
    elif ensemble == "symmetric":
        G = jax.random.normal(kk, shape, dtype)
        Q, K = eye, (G + jnp.swapaxes(G, 1, 2)) / np.sqrt(2.0)
    else:  # gpt2: simuformer draws Q^T K itself with N(0, 0.02^2) entries
        Q, K = eye, _GPT2_STD * jax.random.normal(kk, shape, dtype)
    if value == "identity":
        V = eye
    elif value == "gaussian":
        V = jax.random.normal(kv, shape, dtype) / np.sqrt(d)
    else:
        sign = 1.0 if value == "+qk" else -1.0
        V = sign * einsum("hki,hkj->hij", Q, K) / _qk_norm(ensemble, d)
    return Q, K, V


def masked_softmax(
    logits: Float[Array, "... n n"], log_mask: Float[Array, "n n"] | None
) -> Float[Array, "... n n"]:
    r"""Row softmax of ``logits + log_mask``; a row with no admitted token (all $-\infty$) is 0.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> from meanfield._attention_weights import masked_softmax
        >>> masked_softmax(jnp.zeros((2, 2)), mf.masks.Causal(include_self=False).log_weights(2)).tolist()
        [[0.0, 0.0], [1.0, 0.0]]
    """
    if log_mask is None:
        return jax.nn.softmax(logits, axis=-1)
    z = logits + log_mask
    admitted = jnp.any(jnp.isfinite(log_mask), axis=-1, keepdims=True)
    z = jnp.where(admitted, z, 0.0)  # an empty row: any finite logits, zeroed below
    return jnp.where(admitted, jax.nn.softmax(z, axis=-1), 0.0)


def sinkhorn(
    logits: Float[Array, "... n n"], iters: int, log_mask: Float[Array, "n n"] | None = None
) -> Float[Array, "... n n"]:
    r"""Sinkhorn's normalisation of $e^{L}$, $L$ = ``logits`` (+ ``log_mask``), towards a doubly stochastic
    matrix, by ``iters`` half-steps of alternating row and column normalisation in the log domain, rows first, as
    Sinkformers (Sander et al. 2022, ``SinkhornDistance`` with ``eps = 1``) counts them: a row step
    $L \leftarrow L - \operatorname{logsumexp}_j L$, then a column step
    $L \leftarrow L - \operatorname{logsumexp}_i L$, ... ``iters = 1`` is the softmax; an odd ``iters``
    ends on a row step (rows sum to one to rounding) and the columns converge to one as ``iters``
    grows (Sinkhorn's theorem, for a mask with a positive diagonal), more slowly the sharper the
    logits: a fixed count is not doubly stochastic. ``SelfAttention``'s default 21 leaves column sums
    off by up to a few ``1e-2`` (``1.2e-2`` for ``beta = 9`` and 32 uniform tokens on the sphere);
    no tolerance is iterated to (a fixed count is one program, and the numbers of a count stay the
    same). Differentiable, traceable (a ``lax.fori_loop`` of fixed length).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from meanfield._attention_weights import sinkhorn
        >>> A = sinkhorn(jax.random.normal(jax.random.key(0), (5, 5)), 51)
        >>> bool(jnp.allclose(A.sum(0), 1, atol=1e-5)), bool(jnp.allclose(A.sum(1), 1, atol=1e-6))
        (True, True)
    """
    check_int("sinkhorn_iters", iters, minimum=1)
    z = logits if log_mask is None else logits + log_mask

    def scale(z: Array, axis: int) -> Array:
        # a row (column) the mask empties stays empty: no -inf - (-inf)
        lse = jax.scipy.special.logsumexp(z, axis=axis, keepdims=True)
        return z - jnp.where(jnp.isfinite(lse), lse, 0.0)

    def rows(z: Array) -> Array:
        return scale(z, -1)

    def body(_: Any, z: Array) -> Array:
        return scale(rows(z), -2)

    z = jax.lax.fori_loop(0, iters // 2, body, z)
    return jnp.exp(rows(z) if iters % 2 else z)


def hardmax(
    scores: Float[Array, "... n n"],
    admitted: Bool[np.ndarray, "n n"] | None = None,
    tol: float = 1e-6,
) -> Float[Array, "... n n"]:
    r"""The $\beta \to \infty$ limit of softmax attention: row $i$ spreads weight $1/|C_i|$ over the
    maximisers $C_i = \{j : s_{ij} \ge \max_k s_{ik} - \text{tol}\}$ of the scores (ties within
    ``tol`` averaged), over the admitted tokens only; a row with no admitted token is 0. Piecewise
    constant in the scores (zero derivative in them). ``tol`` is absolute, in the units of the scores
    (``SelfAttention``'s $\langle Q x_i, K x_j\rangle$, before any $\beta$): scores ``5e-7`` apart are
    one tie at the default ``1e-6``, and ``tol = 0`` ties exactly equal scores only.

    Example:
        >>> import jax.numpy as jnp
        >>> from meanfield._attention_weights import hardmax
        >>> hardmax(jnp.array([[1.0, 1.0, 0.0], [0.0, 2.0, 1.0], [0.0, 0.0, 0.0]])).tolist()[:2]
        [[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]]
    """
    s = jax.lax.stop_gradient(scores)
    if admitted is not None:
        s = jnp.where(jnp.asarray(admitted), s, -jnp.inf)
    top = jnp.max(s, axis=-1, keepdims=True)
    chosen = (s >= top - tol) & jnp.isfinite(s)
    count = jnp.sum(chosen, axis=-1, keepdims=True)
    return jnp.where(chosen, 1.0 / jnp.maximum(count, 1), 0.0).astype(scores.dtype)


class AttentionKind(Variant):
    r"""The normalisation of the logits of ``mf.models.SelfAttention`` (its ``attention`` field): the
    base of the attention kinds ``Softmax()``, ``Sinkhorn(sinkhorn_iters)``, ``Hardmax(tie_tol)``.

    A kind holds its parameters and answers for its facts: ``weights`` (the attention matrix of
    the scores $s_{ij} = \langle Q x_i, K x_j\rangle$, at inverse temperature $\beta$, over a
    mask), ``softmax`` (it is the row softmax: the fast paths, and ``normalized=False``'s
    unnormalised kernel, take it only), ``beta_free`` ($\beta$ plays no role: the interaction rate
    is 1), ``extra_arrays`` (``(n, n)`` arrays it holds beyond the weights: the cost model). A kind
    of your own subclasses ``AttentionKind``, sets ``name``, defines ``weights`` and registers
    (``AttentionKind.register``); ``SelfAttention(attention=NAME)``, ``--attention NAME`` and a
    sweep's ``model.attention`` then take it.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> @mf.models.AttentionKind.register
        ... class Uniform(mf.models.AttentionKind):        # every admitted token alike
        ...     name = "uniform-doc"
        ...     beta_free = True
        ...     def weights(self, scores, beta, mask):
        ...         n = scores.shape[-1]
        ...         return jnp.full(scores.shape, 1.0 / n, scores.dtype)
        >>> m = mf.models.SelfAttention(1.0, attention="uniform-doc")
        >>> m.attention, float(m.interaction_rate())
        (Uniform(), 1.0)
        >>> mf.models.AttentionKind.unregister("uniform-doc")
    """

    flat_name: ClassVar[str | None] = "attention"
    what: ClassVar[str] = "attention kind"
    #: Facts a subclass does not inherit (a subclass of ``Softmax`` with weights of its own is not
    #: the softmax the fast paths run).
    own_facts: ClassVar[tuple[str, ...]] = ("softmax",)
    #: The row softmax of the logits (``Softmax``).
    softmax: ClassVar[bool] = False
    #: $\beta$ plays no role (``Hardmax``): the interaction rate is 1.
    beta_free: ClassVar[bool] = False
    #: ``(n, n)`` arrays held beyond the weights while they are evaluated (Sinkhorn's iterate).
    extra_arrays: ClassVar[float] = 0.0

    def weights(
        self, scores: Float[Array, "... n n"], beta: Any, mask: Any
    ) -> Float[Array, "... n n"]:
        """The attention weights of ``scores`` at inverse temperature ``beta`` (an array of the
        scores' dtype) over ``mask`` (a ``mf.masks.Mask`` or None)."""
        raise NotImplementedError(f"{type(self).__name__} defines no weights")


@AttentionKind.builtin
class Softmax(AttentionKind):
    r"""Row softmax of $\beta s_{ij} + \log w_{ij}$ (``masked_softmax``): the default."""

    name: ClassVar[str | None] = "softmax"
    softmax: ClassVar[bool] = True

    def weights(
        self, scores: Float[Array, "... n n"], beta: Any, mask: Any
    ) -> Float[Array, "... n n"]:
        n = scores.shape[-1]
        log_w = None if mask is None else mask.log_weights(n, scores.dtype)
        return masked_softmax(beta * scores, log_w)


@AttentionKind.builtin
class Sinkhorn(AttentionKind):
    r"""``sinkhorn_iters`` half-steps of row and column scaling of $e^{\beta s + \log w}$ (``sinkhorn``)."""

    name: ClassVar[str | None] = "sinkhorn"
    extra_arrays: ClassVar[float] = 1.0
    sinkhorn_iters: int = param(
        21,
        kind="int>=1",
        static=True,
        optional=True,
        doc="Sinkhorn half-steps, rows first (1: softmax; Sinkformers' n_it)",
    )

    def weights(
        self, scores: Float[Array, "... n n"], beta: Any, mask: Any
    ) -> Float[Array, "... n n"]:
        n = scores.shape[-1]
        log_w = None if mask is None else mask.log_weights(n, scores.dtype)
        return sinkhorn(beta * scores, self.sinkhorn_iters, log_w)


@AttentionKind.builtin
class Hardmax(AttentionKind):
    r"""The $\beta \to \infty$ limit: $1/|C_i|$ on the maximisers of the scores, ties within ``tie_tol``
    (``hardmax``)."""

    name: ClassVar[str | None] = "hardmax"
    beta_free: ClassVar[bool] = True
    tie_tol: float = param(
        1e-6,
        kind="float>=0",
        static=True,
        optional=True,
        doc="hardmax: scores <Q x_i, K x_j> within this (absolute) of the row maximum are tied (averaged)",
    )

    def weights(
        self, scores: Float[Array, "... n n"], beta: Any, mask: Any
    ) -> Float[Array, "... n n"]:
        n = scores.shape[-1]
        return hardmax(scores, None if mask is None else mask.admitted(n), self.tie_tol)


#: ``SelfAttention(attention=)``: the built-in normalisations of the logits (``AttentionKind.names()``
#: adds the registered ones).
ATTENTIONS = AttentionKind.names()
