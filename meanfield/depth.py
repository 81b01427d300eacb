r"""Rank collapse through depth: Post-Norm versus Pre-Norm decoder stacks.

Implements docs/math/depth.md ("Why Post-Norm Transformers Collapse" (docs/papers.md)). A Llama-style
decoder block (causal multi-head attention with logits scaled by
$1/\sqrt{d/\text{heads}}$, SwiGLU FFN, RMSNorm) is an ``equinox.Module`` acting on ONE
sequence ``X: (n, d)`` (``Block``: ``CausalSelfAttention``, ``SwiGLU``, two ``RMSNorm``s and
the norm placement ``PostNorm()`` or ``PreNorm()``); batches are ``jax.vmap``-ed, depth is a
``lax.scan`` over one ``Block`` whose leaves are stacked on a leading ``(depth, ...)`` axis
(``Stack``), and ``DecoderLM`` adds the embedding and unembedding. The parameter-dict
functions (``init_block_params``, ``init_stack``, ``block``, ``forward``, ``init_lm``,
``lm_logits``, ...) build these Modules from the same arrays (``from_params``), so a PRNG key
gives the same weights and numbers either way, and training runs on the dicts.

* Post-Norm: $X_2 = \operatorname{RMSNorm}(X_1 + \operatorname{Attn}(X_1))$, $X_1' = \operatorname{RMSNorm}(X_2 + \operatorname{FFN}(X_2))$.
* Pre-Norm: $X_2 = X_1 + \operatorname{Attn}(\operatorname{RMSNorm}(X_1))$, $X_1' = X_2 + \operatorname{FFN}(\operatorname{RMSNorm}(X_2))$.
* Token similarity $t_{\text{sim}}(X) = \|\Pi X\|_F^2 / \|X\|_F^2$
  (``meanfield.metrics.token_similarity``).
* Prefix-averaging ablation: every causal attention matrix $P$ is replaced by
  $P - \alpha C_n$ with $(C_n)_{ij} = 1/i$ for $j \le i$ (1-based).
* RMSNorm factor $\sqrt d / \|y\|_2$ per row and the gradient contribution
  factor $\alpha_k = \|\partial L/\partial X_k\|_F / \|\partial L/\partial Y_k\|_F$ of sublayer $k$ (the
  factor by which the residual branch $Y_k = X_k + F_k(X_k)$ changes the
  backward gradient norm); their product is the contraction
  $c = \alpha \sqrt d / \|y\|$ of Theorem 3.6. (The extracted paper lost the
  displayed definition of $\alpha$; this is the reconstruction used here,
  measured on whole matrices, the RMSNorm factor averaged over rows.)
* Frequency loss: a collapsed network outputs one distribution at every
  position; the best one is the label frequency $p_{\text{freq}}$ and the loss is the
  entropy $H(p_{\text{freq}})$ (Theorem 3.8).

Training utilities: a small decoder LM (embedding + blocks + unembedding), a
seeded synthetic Zipf-Markov token source (no downloads) and an optax AdamW
loop (b1=0.9, b2=0.95, weight decay 0.1, linear warmup then cosine decay,
global-norm clipping 1.0) that records per-layer diagnostics at every step.
No positional encoding is used (causal masking alone carries position, "NoPE").
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from . import metrics
from ._checks import (
    RealScalarLike,
    check_choice,
    check_int,
    check_nonnegative,
    check_positive,
    is_concrete,
)
from ._precision import einsum, matmul

__all__ = [
    "NORMS",
    "RMS_EPS",
    "RMSNorm",
    "CausalSelfAttention",
    "SwiGLU",
    "AbstractNormPlacement",
    "PostNorm",
    "PreNorm",
    "Block",
    "Stack",
    "DecoderLM",
    "init_block_params",
    "init_stack",
    "rms_norm",
    "rms_factor",
    "prefix_average_matrix",
    "causal_attention_matrix",
    "attention",
    "swiglu",
    "block",
    "forward",
    "init_trace",
    "similarity_profile",
    "sublayer_increments",
    "equal_correlation_matrix",
    "value_output_variance",
    "amount_of_attention",
    "amount_of_attention_profile",
    "one_step_attention",
    "swiglu_correlation",
    "one_step_ffn",
    "gaussian_tokens",
    "frequency_distribution",
    "frequency_loss",
    "collapsed_cross_entropy",
    "zipf_markov_source",
    "sample_tokens",
    "init_lm",
    "lm_logits",
    "lm_loss",
    "lm_diagnostics",
    "make_optimizer",
    "train_lm",
]

#: Arrays, numbers or (nested) lists of numbers.
_ArrayLike: TypeAlias = ArrayLike | Sequence[Any]

NORMS = ("post", "pre")  # the ``name``s of PostNorm and PreNorm, the accepted ``norm=`` strings
RMS_EPS = 1e-6  # RMSNorm stabiliser inside the mean square (as in Llama)


# ----------------------------------------------------------------------------- validation


def _check_sizes(*, d: Any, d_ff: Any, heads: Any, depth: Any = None, n: Any = None) -> None:
    d = check_int("d", d, minimum=1)
    d_ff = check_int("d_ff", d_ff, minimum=1)
    heads = check_int("heads", heads, minimum=1)
    if d % heads != 0:
        raise ValueError(f"heads must divide d, got d = {d}, heads = {heads}")
    if depth is not None:
        check_int("depth", depth, minimum=1)
    if n is not None:
        check_int("n", n, minimum=2)


def _check_norm(norm: Any) -> None:
    check_choice("norm", norm, NORMS)


def _check_alpha(alpha_prefix: Any) -> None:
    if is_concrete(alpha_prefix):
        a = np.asarray(alpha_prefix, dtype=np.float64)
        if a.shape != () or not np.isfinite(a):
            raise ValueError(f"alpha_prefix must be a finite scalar, got {alpha_prefix!r}")


def _sigma(sigma_w: RealScalarLike | None, d: int) -> RealScalarLike:
    if sigma_w is None:
        return 1.0 / math.sqrt(d)
    check_positive("sigma_w", sigma_w)
    return sigma_w


# ----------------------------------------------------------------------------- modules


class RMSNorm(eqx.Module):
    r"""RMSNorm of one row: $\operatorname{RMSNorm}(y) = g \odot y / \sqrt{\operatorname{mean}(y^2) + \epsilon}$ ($\approx g\, y \sqrt d / \|y\|$).

    ``equinox.nn.RMSNorm(d, eps, use_bias=False)`` is the same map but rounds differently: it
    multiplies ``g * (y * r)`` where this module (and the numbers of every reproduction) has
    ``(g * y) * r``, which differs in the last bit once the gain is trained, and it computes in at
    least float32. So the gain is kept here.

    Attributes:
        g: ``(d,)`` gain (a ``Stack`` holds it with a leading ``(depth,)`` axis).
        eps: stabiliser inside the mean square (static; ``RMS_EPS`` as in Llama).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> r = mf.depth.RMSNorm(jnp.ones(2))(jnp.array([3.0, 4.0]))
        >>> round(float(jnp.sqrt(jnp.mean(r**2))), 4)
        1.0
    """

    g: Float[Array, "*layers d"]
    eps: float = eqx.field(static=True, default=RMS_EPS)

    def __call__(self, y: Float[Array, " d"]) -> Float[Array, " d"]:
        """The normalised ``(d,)`` row."""
        return self.g * y * jax.lax.rsqrt(jnp.mean(y * y) + self.eps)


class CausalSelfAttention(eqx.Module):
    r"""Causal multi-head self-attention of one sequence, no biases, no positional encoding ("NoPE").

    $\operatorname{Attn}(X) = \operatorname{concat}_h(P_h X W_V^h)\, W_O$ with
    $P_h = \operatorname{softmax}\big(\operatorname{mask}(Q_h K_h^\top / \sqrt{d/\text{heads}})\big) - \alpha C_n$,
    $Q = X W_Q$, $K = X W_K$, $V = X W_V$ split into ``heads`` column blocks of width
    $d/\text{heads}$; the mask sets entries $j > i$ to $-\infty$, and $\alpha$ (``alpha_prefix``) removes
    the prefix average $C_n$ (``prefix_average_matrix``; docs/math/depth.md, Prefix average).

    ``equinox.nn.MultiheadAttention`` does not do this job: the ablation needs the attention
    matrix itself after the softmax (``attention_matrix``), which it does not expose, and its
    projections are ``(out, in)`` ``Linear`` layers with a uniform initialisation.

    Attributes:
        wq, wk, wv, wo: ``(d, d)`` weights acting on rows (``X @ wq``).
        heads: number of heads (static; divides ``d``).

    Example:
        >>> import jax, meanfield as mf
        >>> attn = mf.depth.Block.init(jax.random.key(0), d=8, d_ff=16, heads=2).attention
        >>> X = mf.depth.gaussian_tokens(jax.random.key(1), 5, 8)
        >>> attn(X).shape, attn.attention_matrix(X).shape
        ((5, 8), (2, 5, 5))
    """

    wq: Float[Array, "*layers d d"]
    wk: Float[Array, "*layers d d"]
    wv: Float[Array, "*layers d d"]
    wo: Float[Array, "*layers d d"]
    heads: int = eqx.field(static=True)

    def __check_init__(self) -> None:
        heads = check_int("heads", self.heads, minimum=1)
        d = self.wq.shape[-1]
        if d % heads != 0:
            raise ValueError(f"heads must divide d, got d = {d}, heads = {heads}")

    def attention_matrix(
        self, X: Float[Array | np.ndarray, "n d"], *, alpha_prefix: RealScalarLike = 0.0
    ) -> Float[Array, "heads n n"]:
        r"""The ``(heads, n, n)`` matrices $P_h$ (lower-triangular, rows summing to $1 - \alpha$)."""
        n, d = X.shape
        dh = d // self.heads
        q = matmul(X, self.wq).reshape(n, self.heads, dh)
        k = matmul(X, self.wk).reshape(n, self.heads, dh)
        logits = einsum("ihe,jhe->hij", q, k) / math.sqrt(dh)
        mask = jnp.tril(jnp.ones((n, n), dtype=bool))
        logits = jnp.where(mask, logits, -jnp.inf)
        P = jax.nn.softmax(logits, axis=-1)
        return P - alpha_prefix * prefix_average_matrix(n, X.dtype)

    def __call__(
        self, X: Float[Array | np.ndarray, "n d"], *, alpha_prefix: RealScalarLike = 0.0
    ) -> Float[Array, "n d"]:
        """``Attn(X)``: ``(n, d)``."""
        n, d = X.shape
        P = self.attention_matrix(X, alpha_prefix=alpha_prefix)
        v = matmul(X, self.wv).reshape(n, self.heads, d // self.heads)
        return matmul(einsum("hij,jhe->ihe", P, v).reshape(n, d), self.wo)


class SwiGLU(eqx.Module):
    r"""SwiGLU feed-forward map of one token: $\operatorname{FFN}(x) = (\operatorname{silu}(x W_1) \odot x W_3)\, W_2$, $\operatorname{silu}(u) = u\, \sigma(u)$.

    Acts on one ``(d,)`` row (lift to a sequence with ``jax.vmap``).

    Attributes:
        w1, w3: ``(d, d_ff)`` gate and up projections; w2: ``(d_ff, d)`` down projection.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> ffn = mf.depth.Block.init(jax.random.key(0), d=8, d_ff=16, heads=2).ffn
        >>> jax.vmap(ffn)(jnp.ones((5, 8))).shape
        (5, 8)
    """

    w1: Float[Array, "*layers d d_ff"]
    w3: Float[Array, "*layers d d_ff"]
    w2: Float[Array, "*layers d_ff d"]

    def __call__(self, x: Float[Array, " d"]) -> Float[Array, " d"]:
        """``FFN(x)``: ``(d,)``."""
        return matmul(jax.nn.silu(matmul(x, self.w1)) * matmul(x, self.w3), self.w2)


class AbstractNormPlacement(eqx.Module):
    r"""Where the RMSNorm of a residual sublayer sits: the difference between Post-Norm and Pre-Norm.

    A sublayer with branch $F$ (attention or FFN, on one ``(n, d)`` sequence), row norm
    $N$ and additive tap $\tau$ maps its stream input $X$ to ``(Y, X_next, N_in)``: the residual
    sum $Y$, the next stream state and the input of its RMSNorm;
    ``final`` is what the language model applies after the last block. A subclass defines
    ``name`` (the ``norm=`` string, listed in ``NORMS``), the facts ``renormalised_stream`` and
    ``suffix``, ``sublayer`` and ``final``; it has no fields, so it is static structure of a ``Block``.

    * ``PostNorm``: $Y = X + F(X) + \tau$, $X_{\text{next}} = N(Y)$, $N_{\text{in}} = Y$; no final norm.
    * ``PreNorm``: $Y = X + F(N(X)) + \tau$, $X_{\text{next}} = Y$, $N_{\text{in}} = X$; a final norm.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> norm = mf.depth.RMSNorm(jnp.ones(2))
        >>> X = jnp.array([[3.0, 4.0]])
        >>> Y, nxt, n_in = mf.depth.PreNorm().sublayer(lambda Z: 0 * Z, norm, X, 0.0)
        >>> nxt.tolist(), mf.depth.PostNorm.name
        ([[3.0, 4.0]], 'post')
    """

    name: eqx.AbstractClassVar[str]
    #: The stream is renormalised after every sublayer (Post-Norm): its energy stays $n d$, so the
    #: amount of attention of every layer is the first one's (``amount_of_attention_profile``).
    renormalised_stream: eqx.AbstractClassVar[bool]
    #: The file suffix of the placement's figures and fields in a reproduction ("" for Post-Norm).
    suffix: eqx.AbstractClassVar[str]

    @abc.abstractmethod
    def sublayer(
        self,
        branch: Callable[[Array], Array],
        norm: RMSNorm,
        X: Float[Array, "n d"],
        tap: ArrayLike,
    ) -> tuple[Float[Array, "n d"], Float[Array, "n d"], Float[Array, "n d"]]:
        """``(Y, X_next, N_in)`` of one residual sublayer (see the class docstring)."""

    @abc.abstractmethod
    def final(self, norm: RMSNorm, H: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """The last residual-stream state as the unembedding sees it."""


class PostNorm(AbstractNormPlacement):
    r"""Post-Norm: $X_{\text{next}} = \operatorname{RMSNorm}(X + F(X))$ (docs/math/depth.md, Blocks).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> norm = mf.depth.RMSNorm(jnp.ones(2))
        >>> _, nxt, _ = mf.depth.PostNorm().sublayer(lambda Z: 0 * Z, norm, jnp.array([[3.0, 4.0]]), 0.0)
        >>> [round(v, 4) for v in nxt[0].tolist()]  # 3, 4 over their RMS 5/sqrt(2)
        [0.8485, 1.1314]
    """

    name: ClassVar[str] = "post"
    renormalised_stream: ClassVar[bool] = True
    suffix: ClassVar[str] = ""

    def sublayer(
        self,
        branch: Callable[[Array], Array],
        norm: RMSNorm,
        X: Float[Array, "n d"],
        tap: ArrayLike,
    ) -> tuple[Float[Array, "n d"], Float[Array, "n d"], Float[Array, "n d"]]:
        Y = X + branch(X) + tap
        return Y, jax.vmap(norm)(Y), Y

    def final(self, norm: RMSNorm, H: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return H


class PreNorm(AbstractNormPlacement):
    r"""Pre-Norm: $X_{\text{next}} = X + F(\operatorname{RMSNorm}(X))$, and a final RMSNorm (docs/math/depth.md, Blocks).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> norm = mf.depth.RMSNorm(jnp.ones(2))
        >>> [round(v, 4) for v in mf.depth.PreNorm().final(norm, jnp.array([[3.0, 4.0]]))[0].tolist()]
        [0.8485, 1.1314]
    """

    name: ClassVar[str] = "pre"
    renormalised_stream: ClassVar[bool] = False
    suffix: ClassVar[str] = "_pre"

    def sublayer(
        self,
        branch: Callable[[Array], Array],
        norm: RMSNorm,
        X: Float[Array, "n d"],
        tap: ArrayLike,
    ) -> tuple[Float[Array, "n d"], Float[Array, "n d"], Float[Array, "n d"]]:
        Y = X + branch(jax.vmap(norm)(X)) + tap
        return Y, Y, X

    def final(self, norm: RMSNorm, H: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return jax.vmap(norm)(H)


_PLACEMENTS: dict[str, type[AbstractNormPlacement]] = {cls.name: cls for cls in (PostNorm, PreNorm)}


def _placement(norm: str | AbstractNormPlacement) -> AbstractNormPlacement:
    """A placement Module from ``"post"``/``"pre"`` (the one ``ValueError`` for anything else)."""
    if isinstance(norm, AbstractNormPlacement):
        return norm
    _check_norm(norm)
    return _PLACEMENTS[norm]()


class Block(eqx.Module):
    r"""One Llama-style decoder block on one sequence ``X: (n, d)``.

    Post-Norm: $X_{\text{out}} = \operatorname{RMSNorm}(Y_2)$, $Y_2 = X_2 + \operatorname{FFN}(X_2)$, $X_2 = \operatorname{RMSNorm}(X_1 + \operatorname{Attn}(X_1))$;
    Pre-Norm: $X_{\text{out}} = Y_2 = X_2 + \operatorname{FFN}(\operatorname{RMSNorm}(X_2))$, $X_2 = X_1 + \operatorname{Attn}(\operatorname{RMSNorm}(X_1))$.
    The placement of the two RMSNorms is the field ``placement`` (``PostNorm()`` or ``PreNorm()``).

    ``__call__`` returns ``(X_out, states)``: ``states`` holds the four residual-stream states
    ``X1`` (block input), ``Y1 = X1 + Attn(.)``, ``X2`` (FFN-sublayer input), ``Y2 = X2 + FFN(.)``,
    and ``N1, N2``: the inputs of the two RMSNorms (Post: ``Y1, Y2``; Pre: ``X1, X2``).
    ``taps`` (optional, ``(4, n, d)``) are added to ``X1, Y1, X2, Y2``: differentiating at
    ``taps = 0`` gives ``dL/dX1, dL/dY1, dL/dX2, dL/dY2``.

    Attributes:
        attention: ``CausalSelfAttention``; attention_norm: its ``RMSNorm`` (gain ``g_attn``).
        ffn: ``SwiGLU``; ffn_norm: its ``RMSNorm`` (gain ``g_ffn``).
        placement: ``PostNorm()`` or ``PreNorm()``.

    Example:
        >>> import jax, meanfield as mf
        >>> blk = mf.depth.Block.init(jax.random.key(0), d=8, d_ff=16, heads=2, norm="pre")
        >>> out, st = blk(mf.depth.gaussian_tokens(jax.random.key(1), 5, 8))
        >>> out.shape, sorted(st), type(blk.placement).__name__
        ((5, 8), ['N1', 'N2', 'X1', 'X2', 'Y1', 'Y2'], 'PreNorm')
    """

    attention: CausalSelfAttention
    attention_norm: RMSNorm
    ffn: SwiGLU
    ffn_norm: RMSNorm
    placement: AbstractNormPlacement

    @classmethod
    def init(
        cls,
        key: PRNGKeyArray,
        *,
        d: int,
        d_ff: int,
        heads: int,
        norm: str | AbstractNormPlacement = "post",
        sigma_w: RealScalarLike | None = None,
        dtype: DTypeLike = jnp.float32,
    ) -> Block:
        r"""A block with every weight entry $N(0, \sigma_w^2)$ and RMSNorm gains 1.

        The weights are drawn from ``split(key, 7)`` in the order ``wq, wk, wv, wo, w1, w3, w2``
        (the draws of ``init_block_params``).

        Args:
            key: PRNG key.
            d, d_ff, heads: model, FFN and head counts (``heads`` must divide ``d``).
            norm: ``"post"``, ``"pre"`` or a placement Module.
            sigma_w: weight standard deviation (``None``: ``1/sqrt(d)``).
            dtype: float dtype of every leaf.

        Returns:
            a ``Block``.
        """
        _check_sizes(d=d, d_ff=d_ff, heads=heads)
        placement = _placement(norm)
        s = _sigma(sigma_w, d)
        k = jax.random.split(key, 7)
        shapes = {
            "wq": (d, d),
            "wk": (d, d),
            "wv": (d, d),
            "wo": (d, d),
            "w1": (d, d_ff),
            "w3": (d, d_ff),
            "w2": (d_ff, d),
        }
        w = {
            name: jnp.asarray(s * jax.random.normal(kk, shape, dtype))
            for kk, (name, shape) in zip(k, shapes.items())
        }
        ones = jnp.ones((d,), dtype)
        return cls(
            attention=CausalSelfAttention(w["wq"], w["wk"], w["wv"], w["wo"], heads=heads),
            attention_norm=RMSNorm(ones),
            ffn=SwiGLU(w["w1"], w["w3"], w["w2"]),
            ffn_norm=RMSNorm(ones),
            placement=placement,
        )

    @classmethod
    def from_params(cls, p: dict, *, norm: str | AbstractNormPlacement, heads: int) -> Block:
        """The block of a parameter dict (``init_block_params``'s keys; leaves may carry a
        leading ``(depth,)`` axis, as in ``init_stack``)."""
        return cls(
            attention=CausalSelfAttention(p["wq"], p["wk"], p["wv"], p["wo"], heads=heads),
            attention_norm=RMSNorm(p["g_attn"]),
            ffn=SwiGLU(p["w1"], p["w3"], p["w2"]),
            ffn_norm=RMSNorm(p["g_ffn"]),
            placement=_placement(norm),
        )

    def to_params(self) -> dict:
        """The parameter dict of ``init_block_params`` (the same arrays)."""
        a, f = self.attention, self.ffn
        return {
            "wq": a.wq,
            "wk": a.wk,
            "wv": a.wv,
            "wo": a.wo,
            "w1": f.w1,
            "w3": f.w3,
            "w2": f.w2,
            "g_attn": self.attention_norm.g,
            "g_ffn": self.ffn_norm.g,
        }

    def __call__(
        self,
        X: Float[Array | np.ndarray, "n d"],
        *,
        alpha_prefix: RealScalarLike = 0.0,
        taps: Float[Array, "4 n d"] | None = None,
    ) -> tuple[Float[Array, "n d"], dict]:
        """``(X_out: (n, d), states)``, ``states`` a dict of ``(n, d)`` arrays (see the class docstring)."""
        t = jnp.zeros((4,) + X.shape, X.dtype) if taps is None else taps
        X1 = jnp.add(X, t[0])
        Y1, X2, N1 = self.placement.sublayer(
            lambda Z: self.attention(Z, alpha_prefix=alpha_prefix), self.attention_norm, X1, t[1]
        )
        X2 = X2 + t[2]
        Y2, out, N2 = self.placement.sublayer(jax.vmap(self.ffn), self.ffn_norm, X2, t[3])
        return out, {"X1": X1, "Y1": Y1, "X2": X2, "Y2": Y2, "N1": N1, "N2": N2}


class Stack(eqx.Module):
    r"""``depth`` decoder blocks run in sequence: $X^l = \operatorname{block}_l(X^{l-1})$, $l = 1, \dots, \text{depth}$, $X^0 = X$.

    ``blocks`` is ONE ``Block`` whose array leaves carry a leading ``(depth,)`` axis (equinox's
    stacked-layers idiom: built with ``equinox.filter_vmap``, run with ``lax.scan`` over the
    partitioned arrays), so the stack compiles one block whatever its depth.

    ``__call__(X, alpha_prefix=, taps=, observe=)`` returns the final residual stream and
    ``observe(states, out)`` stacked over layers (``states`` as in ``Block``): observables, not
    states, are saved. The default ``observe`` records, each ``(depth,)``: ``t_x1, t_y1, t_x2,
    t_y2, t_out`` (token similarity of the block input, after the attention residual addition, of
    the FFN-sublayer input, after the FFN residual addition, of the block output), ``rms_attn,
    rms_ffn`` (RMSNorm factors ``sqrt(d)/||y||`` averaged over rows) and ``norm_out`` (output
    RMS). ``taps``: optional ``(depth, 4, n, d)`` zeros to differentiate at (see ``Block``).

    Attributes:
        blocks: a ``Block`` with leaves stacked on a leading ``(depth,)`` axis.

    Example:
        >>> import jax, meanfield as mf
        >>> stack = mf.depth.Stack.init(jax.random.key(0), depth=3, d=8, d_ff=16, heads=2, norm="post")
        >>> out, stats = stack(mf.depth.gaussian_tokens(jax.random.key(1), 5, 8))
        >>> stack.depth, out.shape, stats["t_out"].shape
        (3, (5, 8), (3,))
    """

    blocks: Block

    def __check_init__(self) -> None:
        if self.blocks.attention.wq.ndim != 3:
            raise ValueError(
                "Stack.blocks must be one Block with leaves stacked on a leading (depth, ...) axis, "
                f"got wq of shape {self.blocks.attention.wq.shape}"
            )

    @classmethod
    def init(
        cls,
        key: PRNGKeyArray,
        *,
        depth: int,
        d: int,
        d_ff: int,
        heads: int,
        norm: str | AbstractNormPlacement = "post",
        sigma_w: RealScalarLike | None = None,
        dtype: DTypeLike = jnp.float32,
    ) -> Stack:
        """``depth`` independent blocks: block ``l`` is ``Block.init`` of the ``l``-th key of ``split(key, depth)``.

        Args:
            key: PRNG key; depth: number of blocks; d, d_ff, heads, norm, sigma_w, dtype: as in ``Block.init``.

        Returns:
            a ``Stack``.
        """
        _check_sizes(d=d, d_ff=d_ff, heads=heads, depth=depth)
        placement = _placement(norm)
        s = _sigma(sigma_w, d)
        keys = jax.random.split(key, depth)
        return cls(
            eqx.filter_vmap(
                lambda k: Block.init(
                    k, d=d, d_ff=d_ff, heads=heads, norm=placement, sigma_w=s, dtype=dtype
                )
            )(keys)
        )

    @classmethod
    def from_params(cls, blocks: dict, *, norm: str | AbstractNormPlacement, heads: int) -> Stack:
        """The stack of stacked parameters (``init_stack``'s dict of ``(depth, ...)`` arrays)."""
        return cls(Block.from_params(blocks, norm=norm, heads=heads))

    def to_params(self) -> dict:
        """The dict of ``(depth, ...)`` arrays of ``init_stack``."""
        return self.blocks.to_params()

    @property
    def depth(self) -> int:
        """Number of blocks."""
        return self.blocks.attention.wq.shape[0]

    @property
    def placement(self) -> AbstractNormPlacement:
        """The norm placement shared by every block."""
        return self.blocks.placement

    def __call__(
        self,
        X: Float[Array, "n d"],
        *,
        alpha_prefix: RealScalarLike = 0.0,
        taps: Float[Array, "depth 4 n d"] | None = None,
        observe: Callable[[dict, Array], Any] | None = None,
    ) -> tuple[Float[Array, "n d"], Any]:
        """``(X^depth: (n, d), observables)``, the observables stacked over layers (see the class docstring)."""
        observe = _layer_stats if observe is None else observe
        if taps is None:
            taps = jnp.zeros((self.depth, 4) + X.shape, X.dtype)
        dynamic, static = eqx.partition(self.blocks, eqx.is_array)

        def body(x: Float[Array, "n d"], layer: tuple[Any, Any]) -> tuple[Array, Any]:
            p, tp = layer
            out, states = eqx.combine(p, static)(x, alpha_prefix=alpha_prefix, taps=tp)
            return out, observe(states, out)

        return jax.lax.scan(body, X, (dynamic, taps))


class DecoderLM(eqx.Module):
    r"""A small decoder language model on one token sequence: embedding, ``Stack``, unembedding.

    $\text{logits} = H W_U$ with $H = \operatorname{Stack}(E_{\text{tokens}})$, followed by the final
    RMSNorm in Pre-Norm (``placement.final``). No positional encoding (causal masking alone
    carries position). ``__call__(tokens, taps=)`` returns ``(logits: (n, vocab), stats)``, the
    statistics of ``Stack`` plus ``t_final`` (token similarity of $H$).

    Attributes:
        embed: ``(vocab, d)``; stack: the blocks; final_norm: the final ``RMSNorm`` (Pre-Norm only);
        unembed: ``(d, vocab)``.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> lm = mf.depth.DecoderLM.init(jax.random.key(0), vocab=10, depth=2, d=8, d_ff=16, heads=2, norm="pre")
        >>> logits, stats = lm(jnp.arange(5))
        >>> logits.shape, stats["t_final"].shape
        ((5, 10), ())
    """

    embed: Float[Array, "vocab d"]
    stack: Stack
    final_norm: RMSNorm
    unembed: Float[Array, "d vocab"]

    @classmethod
    def init(
        cls,
        key: PRNGKeyArray,
        *,
        vocab: int,
        depth: int,
        d: int,
        d_ff: int,
        heads: int,
        norm: str | AbstractNormPlacement = "post",
        sigma_w: RealScalarLike | None = None,
        dtype: DTypeLike | None = None,
    ) -> DecoderLM:
        r"""Embedding entries $N(0, 1)$ (RMS-1 token vectors, as the inputs of ``similarity_profile``),
        blocks as ``Stack.init``, final gain 1, unembedding entries $N(0, \sigma_w^2)$.

        The keys are ``split(key, 3)``: embedding, blocks, unembedding (the draws of ``init_lm``).

        Args:
            key: PRNG key; vocab: vocabulary size; depth, d, d_ff, heads, norm, sigma_w: as in ``Stack.init``.
            dtype: float dtype of every leaf; ``None`` (``init_lm``'s layout): the embedding, final gain
                and unembedding in JAX's default float dtype and the blocks in float32.

        Returns:
            a ``DecoderLM``.
        """
        vocab = check_int("vocab", vocab, minimum=2)
        _check_sizes(d=d, d_ff=d_ff, heads=heads, depth=depth)
        placement = _placement(norm)
        s = _sigma(sigma_w, d)
        outer = jnp.result_type(float) if dtype is None else dtype
        ke, kb, ku = jax.random.split(key, 3)
        return cls(
            embed=jax.random.normal(ke, (vocab, d), outer),
            stack=Stack.init(
                kb,
                depth=depth,
                d=d,
                d_ff=d_ff,
                heads=heads,
                norm=placement,
                sigma_w=s,
                dtype=jnp.float32 if dtype is None else dtype,
            ),
            final_norm=RMSNorm(jnp.ones((d,), outer)),
            unembed=jnp.asarray(s * jax.random.normal(ku, (d, vocab), outer)),
        )

    @classmethod
    def from_params(
        cls, params: dict, *, norm: str | AbstractNormPlacement, heads: int
    ) -> DecoderLM:
        """The model of an ``init_lm`` dict (keys ``embed, blocks, final_gain, unembed``)."""
        return cls(
            embed=params["embed"],
            stack=Stack.from_params(params["blocks"], norm=norm, heads=heads),
            final_norm=RMSNorm(params["final_gain"]),
            unembed=params["unembed"],
        )

    def to_params(self) -> dict:
        """The ``init_lm`` dict of this model (the same arrays)."""
        return {
            "embed": self.embed,
            "blocks": self.stack.to_params(),
            "final_gain": self.final_norm.g,
            "unembed": self.unembed,
        }

    def __call__(
        self,
        tokens: Int[Array | np.ndarray, " n"],
        *,
        taps: Float[Array, "depth 4 n d"] | None = None,
    ) -> tuple[Float[Array, "n vocab"], dict]:
        """``(logits: (n, vocab), stats)`` of one sequence (see the class docstring)."""
        H, stats = self.stack(self.embed[tokens], taps=taps)
        H = self.stack.placement.final(self.final_norm, H)
        stats["t_final"] = metrics.token_similarity(H)
        return matmul(H, self.unembed), stats


# ----------------------------------------------------------------------------- parameters


def init_block_params(
    key: PRNGKeyArray,
    *,
    d: int,
    d_ff: int,
    heads: int,
    sigma_w: RealScalarLike | None = None,
    dtype: DTypeLike = jnp.float32,
) -> dict:
    r"""Parameters of one block, every weight entry $N(0, \sigma_w^2)$, RMSNorm gains 1: ``Block.init(key, ...).to_params()``.

    Shapes: ``wq, wk, wv, wo: (d, d)``; ``w1, w3: (d, d_ff)`` (gate, up);
    ``w2: (d_ff, d)``; ``g_attn, g_ffn: (d,)``. ``sigma_w=None`` means $1/\sqrt d$.

    Args:
        key: PRNG key.
        d, d_ff, heads: model, FFN and head counts (``heads`` must divide ``d``).
        sigma_w: weight standard deviation (``None``: ``1/sqrt(d)``).
        dtype: float dtype of every leaf.

    Returns:
        dict of the arrays above.

    Example:
        >>> import jax, meanfield as mf
        >>> p = mf.depth.init_block_params(jax.random.key(0), d=8, d_ff=16, heads=2)
        >>> p["w1"].shape
        (8, 16)
    """
    return Block.init(key, d=d, d_ff=d_ff, heads=heads, sigma_w=sigma_w, dtype=dtype).to_params()


def init_stack(
    key: PRNGKeyArray,
    *,
    depth: int,
    d: int,
    d_ff: int,
    heads: int,
    sigma_w: RealScalarLike | None = None,
    dtype: DTypeLike = jnp.float32,
) -> dict:
    """``depth`` independent blocks, leaves stacked on a leading ``(depth, ...)`` axis.

    Block ``l`` is ``init_block_params`` of the ``l``-th key of ``split(key, depth)``:
    ``Stack.init(key, ...).to_params()``.

    Args:
        key: PRNG key.
        depth: number of blocks; d, d_ff, heads, sigma_w, dtype: as in ``init_block_params``.

    Returns:
        dict of ``(depth, ...)`` arrays (e.g. ``wq: (depth, d, d)``).

    Example:
        >>> import jax, meanfield as mf
        >>> s = mf.depth.init_stack(jax.random.key(0), depth=2, d=8, d_ff=16, heads=2)
        >>> s["wq"].shape, s["w2"].shape
        ((2, 8, 8), (2, 16, 8))
    """
    return Stack.init(
        key, depth=depth, d=d, d_ff=d_ff, heads=heads, sigma_w=sigma_w, dtype=dtype
    ).to_params()


# ----------------------------------------------------------------------------- pieces


def rms_norm(
    y: Float[Array, " d"], g: Float[Array, " d"], eps: float = RMS_EPS
) -> Float[Array, " d"]:
    r"""$\operatorname{RMSNorm}(y) = g \odot y / \sqrt{\operatorname{mean}(y^2) + \epsilon}$ for one row ($\approx g\, y \sqrt d / \|y\|$).

    Args:
        y: ``(d,)`` row; g: ``(d,)`` gain; eps: stabiliser inside the mean square.

    Returns:
        ``(d,)`` row, of RMS ``~ 1`` when ``g = 1``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> r = mf.depth.rms_norm(jnp.array([3.0, 4.0]), jnp.ones(2))
        >>> round(float(jnp.sqrt(jnp.mean(r**2))), 4)
        1.0
    """
    return RMSNorm(g, eps)(y)


def rms_factor(Y: Float[Array | np.ndarray, "n d"]) -> Float[Array, ""]:
    r"""RMSNorm scale averaged over rows: $\frac1n \sum_i \sqrt d / \|y_i\|_2$ for ``Y: (n, d)``.

    Args:
        Y: ``(n, d)`` inputs of an RMSNorm.

    Returns:
        scalar ``()``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> round(float(mf.depth.rms_factor(jnp.array([[3.0, 4.0], [0.0, 2.0]]))), 4)  # (sqrt2/5 + sqrt2/2)/2
        0.495
    """
    d = Y.shape[-1]
    return jnp.mean(math.sqrt(d) / jnp.linalg.norm(Y, axis=-1))


def prefix_average_matrix(n: int, dtype: DTypeLike = jnp.float32) -> Float[Array, "n n"]:
    r"""Causal prefix-averaging matrix $(C_n)_{ij} = 1/i$ for $j \le i$ (1-based), else 0.

    Row-stochastic and lower-triangular: $C_n X$ replaces token $i$ by the
    mean of tokens $1, \dots, i$ (docs/math/depth.md, Prefix average).

    Args:
        n: sequence length; dtype: float dtype.

    Returns:
        ``(n, n)`` array.

    Example:
        >>> import meanfield as mf
        >>> mf.depth.prefix_average_matrix(3).tolist()
        [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.3333333432674408, 0.3333333432674408, 0.3333333432674408]]
    """
    n = check_int("n", n, minimum=1)
    i = jnp.arange(1, n + 1, dtype=dtype)[:, None]
    return jnp.tril(jnp.ones((n, n), dtype)) / i


def causal_attention_matrix(
    p: dict, X: Float[Array | np.ndarray, "n d"], heads: int, alpha_prefix: RealScalarLike = 0.0
) -> Float[Array, "heads n n"]:
    r"""$P_h = \operatorname{softmax}\big(\operatorname{mask}(Q_h K_h^\top / \sqrt{d/\text{heads}})\big) - \alpha C_n$ for each head $h$.

    $Q = X W_Q$, $K = X W_K$ split into ``heads`` column blocks of width $d/\text{heads}$;
    the mask sets entries $j > i$ to $-\infty$ (causal).

    Args:
        p: block parameters (``init_block_params``).
        X: ``(n, d)`` one sequence.
        heads: number of heads (divides ``d``).
        alpha_prefix: prefix-averaging ablation strength ``alpha`` (may be traced).

    Returns:
        ``(heads, n, n)`` lower-triangular matrices with rows summing to ``1 - alpha``.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> p = mf.depth.init_block_params(jax.random.key(0), d=8, d_ff=16, heads=2)
        >>> X = mf.depth.gaussian_tokens(jax.random.key(1), 5, 8)
        >>> P = mf.depth.causal_attention_matrix(p, X, 2)
        >>> P.shape, bool(jnp.allclose(P.sum(-1), 1.0, atol=1e-5)), float(P[0, 0, 1])
        ((2, 5, 5), True, 0.0)
    """
    return _attention_module(p, heads).attention_matrix(X, alpha_prefix=alpha_prefix)


def _attention_module(p: dict, heads: int) -> CausalSelfAttention:
    return CausalSelfAttention(p["wq"], p["wk"], p["wv"], p["wo"], heads=heads)


def attention(
    p: dict, X: Float[Array | np.ndarray, "n d"], heads: int, alpha_prefix: RealScalarLike = 0.0
) -> Float[Array, "n d"]:
    r"""Causal multi-head attention $\operatorname{concat}_h(P_h X W_V^h)\, W_O$ (no biases, no positional encoding).

    Args:
        p, X, heads, alpha_prefix: as in ``causal_attention_matrix`` (``X: (n, d)``).

    Returns:
        ``(n, d)``.

    Example:
        >>> import jax, meanfield as mf
        >>> p = mf.depth.init_block_params(jax.random.key(0), d=8, d_ff=16, heads=2)
        >>> X = mf.depth.gaussian_tokens(jax.random.key(1), 5, 8)
        >>> mf.depth.attention(p, X, 2).shape
        (5, 8)
    """
    return _attention_module(p, heads)(X, alpha_prefix=alpha_prefix)


def swiglu(p: dict, X: Float[Array | np.ndarray, "n d"]) -> Float[Array, "n d"]:
    r"""SwiGLU FFN $(\operatorname{silu}(X W_1) \odot X W_3)\, W_2$, $\operatorname{silu}(u) = u\, \sigma(u)$.

    Args:
        p: block parameters (``w1, w3: (d, d_ff)``, ``w2: (d_ff, d)``); X: ``(n, d)``.

    Returns:
        ``(n, d)``.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> p = mf.depth.init_block_params(jax.random.key(0), d=8, d_ff=16, heads=2)
        >>> Y = mf.depth.swiglu(p, jnp.ones((5, 8)))
        >>> Y.shape, bool(jnp.allclose(Y, 0.0))
        ((5, 8), False)
    """
    return jax.vmap(SwiGLU(p["w1"], p["w3"], p["w2"]))(jnp.asarray(X))


def block(
    p: dict,
    X: Float[Array | np.ndarray, "n d"],
    *,
    norm: str,
    heads: int,
    alpha_prefix: RealScalarLike = 0.0,
    taps: Float[Array, "4 n d"] | None = None,
) -> tuple[Float[Array, "n d"], dict]:
    r"""One decoder block on one sequence; returns ``(X_out, states)``: ``Block.from_params(p, norm=norm, heads=heads)(X, ...)``.

    ``states`` holds the four residual-stream states ``X1`` (block input),
    ``Y1 = X1 + Attn(.)``, ``X2`` (FFN-sublayer input: ``RMSNorm(Y1)`` in
    Post-Norm, ``Y1`` in Pre-Norm), ``Y2 = X2 + FFN(.)``, and ``N1, N2``: the
    inputs of the two RMSNorms (Post: ``Y1, Y2``; Pre: ``X1, X2``).
    ``taps`` (optional, shape ``(4, n, d)``) are added to ``X1, Y1, X2, Y2``:
    differentiating at ``taps = 0`` gives ``dL/dX1, dL/dY1, dL/dX2, dL/dY2``.

    Post-Norm: $X_{\text{out}} = \operatorname{RMSNorm}(Y_2)$, $Y_2 = X_2 + \operatorname{FFN}(X_2)$, $X_2 = \operatorname{RMSNorm}(X_1 + \operatorname{Attn}(X_1))$;
    Pre-Norm: $X_{\text{out}} = Y_2 = X_2 + \operatorname{FFN}(\operatorname{RMSNorm}(X_2))$, $X_2 = X_1 + \operatorname{Attn}(\operatorname{RMSNorm}(X_1))$.

    Args:
        p: block parameters; X: ``(n, d)`` one sequence.
        norm: ``"post"`` or ``"pre"``; heads: number of heads.
        alpha_prefix: prefix-averaging strength (see ``causal_attention_matrix``).
        taps: optional ``(4, n, d)`` additive taps.

    Returns:
        ``(X_out: (n, d), states)``, ``states`` a dict of ``(n, d)`` arrays.

    Example:
        >>> import jax, meanfield as mf
        >>> p = mf.depth.init_block_params(jax.random.key(0), d=8, d_ff=16, heads=2)
        >>> X = mf.depth.gaussian_tokens(jax.random.key(1), 5, 8)
        >>> out, st = mf.depth.block(p, X, norm="post", heads=2)
        >>> out.shape, sorted(st)
        ((5, 8), ['N1', 'N2', 'X1', 'X2', 'Y1', 'Y2'])
    """
    return Block.from_params(p, norm=norm, heads=heads)(X, alpha_prefix=alpha_prefix, taps=taps)


def _layer_stats(states: dict[str, Array], out: Float[Array, "n d"]) -> dict[str, Array]:
    ts = metrics.token_similarity
    return {
        "t_x1": ts(states["X1"]),
        "t_y1": ts(states["Y1"]),
        "t_x2": ts(states["X2"]),
        "t_y2": ts(states["Y2"]),
        "t_out": ts(out),
        "rms_attn": rms_factor(states["N1"]),
        "rms_ffn": rms_factor(states["N2"]),
        "norm_out": jnp.mean(jnp.linalg.norm(out, axis=-1)) / math.sqrt(out.shape[-1]),
    }


def _init_layer_stats(states: dict[str, Array], out: Float[Array, "n d"]) -> dict[str, Array]:
    # init_trace adds the residual-stream norms (kept out of forward so that the training
    # program, and so its floating-point rounding, is unchanged)
    return {
        **_layer_stats(states, out),
        "sq_x1": jnp.sum(states["X1"] ** 2),
        "sq_x2": jnp.sum(states["X2"] ** 2),
    }


def forward(
    blocks: dict,
    X: Float[Array, "n d"],
    *,
    norm: str,
    heads: int,
    alpha_prefix: RealScalarLike = 0.0,
    taps: Float[Array, "depth 4 n d"] | None = None,
) -> tuple[Float[Array, "n d"], dict]:
    r"""Run a stack of blocks (leaves ``(depth, ...)``) on one sequence with ``lax.scan``: ``Stack.from_params(blocks, ...)(X, ...)``.

    Returns the final residual stream and per-layer statistics, each ``(depth,)``:
    ``t_x1, t_y1, t_x2, t_y2, t_out`` (token similarity of the block input, after the
    attention residual addition, of the FFN-sublayer input, after the FFN residual
    addition, of the block output), ``rms_attn, rms_ffn`` (RMSNorm factors
    ``sqrt(d)/||y||`` averaged over rows) and ``norm_out`` (output RMS).
    ``taps``: optional ``(depth, 4, n, d)`` zeros to differentiate at (see ``block``).

    $X^l = \operatorname{block}(p_l, X^{l-1})$, $l = 1, \dots, \text{depth}$, $X^0 = X$.

    Args:
        blocks: stacked parameters (``init_stack``).
        X: ``(n, d)`` one sequence.
        norm, heads, alpha_prefix, taps: as in ``block``.

    Example:
        >>> import jax, meanfield as mf
        >>> blocks = mf.depth.init_stack(jax.random.key(0), depth=2, d=8, d_ff=16, heads=2)
        >>> X = mf.depth.gaussian_tokens(jax.random.key(1), 5, 8)
        >>> out, stats = mf.depth.forward(blocks, X, norm="pre", heads=2)
        >>> out.shape, stats["t_out"].shape
        ((5, 8), (2,))
    """
    return Stack.from_params(blocks, norm=norm, heads=heads)(
        X, alpha_prefix=alpha_prefix, taps=taps
    )


# ----------------------------------------------------------------------------- initialisation


def gaussian_tokens(
    key: PRNGKeyArray, n: int, d: int, dtype: DTypeLike = jnp.float32
) -> Float[Array, "n d"]:
    r"""$n$ i.i.d. Gaussian tokens with RMS-normalised rows: $x_i = \sqrt d\, g_i / \|g_i\|$, $g_i \sim N(0, I_d)$.

    Args:
        key: PRNG key; n: number of tokens; d: dimension; dtype: float dtype.

    Returns:
        ``(n, d)`` array, every row of norm ``sqrt(d)``.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> X = mf.depth.gaussian_tokens(jax.random.key(0), 4, 8)
        >>> X.shape, round(float(jnp.linalg.norm(X[0]) ** 2), 3)
        ((4, 8), 8.0)
    """
    g = jax.random.normal(key, (n, d), dtype)
    return g * math.sqrt(d) / jnp.linalg.norm(g, axis=-1, keepdims=True)


@partial(jax.jit, static_argnames=("depth", "n", "d", "d_ff", "heads", "norm"))
def _init_trace(
    key: PRNGKeyArray,
    sigma_w: Array,
    alpha_prefix: Array,
    *,
    depth: int,
    n: int,
    d: int,
    d_ff: int,
    heads: int,
    norm: str,
) -> dict[str, Array]:
    kx, kp = jax.random.split(key)
    X = gaussian_tokens(kx, n, d)
    stack = Stack.init(kp, depth=depth, d=d, d_ff=d_ff, heads=heads, norm=norm, sigma_w=sigma_w)
    _, stats = stack(X, alpha_prefix=alpha_prefix, observe=_init_layer_stats)
    stats["t_input"] = metrics.token_similarity(X)
    return stats


def init_trace(
    key: PRNGKeyArray,
    *,
    depth: int,
    n: int,
    d: Any,  # an int, checked with its own message (``TypeError`` for 16.0)
    d_ff: int,
    heads: int,
    norm: str = "post",
    sigma_w: RealScalarLike | None = None,
    alpha_prefix: RealScalarLike = 0.0,
) -> dict:
    r"""Per-layer statistics of a freshly initialised stack on Gaussian tokens.

    Same inputs as ``similarity_profile``; returns the dict of
    ``forward`` (each entry ``(depth,)``) plus ``sq_x1, sq_x2`` (``(depth,)``: the squared
    Frobenius norms $\|X_1^l\|_F^2$, $\|X_2^l\|_F^2$ of the two sublayer inputs, for
    ``amount_of_attention``) and ``t_input`` (a scalar).
    ``sigma_w`` and ``alpha_prefix`` may be traced (vmap over a sweep compiles once).

    ``X^0``: ``n`` Gaussian tokens with ``||x_i|| = sqrt(d)``; ``X^l`` as in ``forward``
    with weights ``N(0, sigma_w^2)``.

    Args:
        key: PRNG key (inputs and weights).
        depth, n, d, d_ff, heads, norm, sigma_w, alpha_prefix: as in ``similarity_profile``.

    Returns:
        dict of ``(depth,)`` arrays and the scalar ``t_input``.

    Example:
        >>> import jax, meanfield as mf
        >>> tr = mf.depth.init_trace(jax.random.key(0), depth=2, n=8, d=8, d_ff=16, heads=2)
        >>> tr["t_out"].shape, tr["t_input"].shape
        ((2,), ())
    """
    _check_sizes(d=d, d_ff=d_ff, heads=heads, depth=depth, n=n)
    _check_norm(norm)
    _check_alpha(alpha_prefix)
    s = _sigma(sigma_w, d)
    return _init_trace(
        key,
        jnp.asarray(s, jnp.float32),
        jnp.asarray(alpha_prefix, jnp.float32),
        depth=depth,
        n=n,
        d=d,
        d_ff=d_ff,
        heads=heads,
        norm=norm,
    )


def similarity_profile(
    key: PRNGKeyArray,
    *,
    depth: int,
    n: int,
    d: Any,  # an int, checked with its own message (``TypeError`` for 16.0)
    d_ff: int,
    heads: int,
    norm: str = "post",
    sigma_w: RealScalarLike | None = None,
    alpha_prefix: RealScalarLike = 0.0,
) -> Float[Array, " depth"]:
    r"""Token similarity of the residual stream after each block, at initialisation.

    $t_l = t_{\text{sim}}(X^l)$, $l = 1, \dots, \text{depth}$, where $X^0$ are $n$ i.i.d. Gaussian
    tokens with RMS-normalised rows and every weight is $N(0, \sigma_w^2)$
    (``sigma_w=None``: $1/\sqrt d$), RMSNorm gains 1; ``alpha_prefix`` replaces
    each attention matrix $P$ by $P - \alpha C_n$.

    Args:
        key: PRNG key (inputs and weights are both drawn from it).
        depth, n, d, d_ff, heads: sizes; ``heads`` must divide ``d``.
        norm: ``"post"`` or ``"pre"``.
    Returns:
        ``(depth,)`` array of token similarities in ``[0, 1]``.

    Example:
        >>> import jax, meanfield as mf
        >>> t = mf.depth.similarity_profile(jax.random.key(0), depth=2, n=8, d=8, d_ff=16, heads=2)
        >>> t.shape, bool(((t >= 0) & (t <= 1)).all())
        ((2,), True)
    """
    return init_trace(
        key,
        depth=depth,
        n=n,
        d=d,
        d_ff=d_ff,
        heads=heads,
        norm=norm,
        sigma_w=sigma_w,
        alpha_prefix=alpha_prefix,
    )["t_out"]


def sublayer_increments(key: PRNGKeyArray, **kwargs: Any) -> dict:
    r"""One-step token-similarity increments of each sublayer at initialisation (paper Fig. 1).

    $\text{attn}_l = t_{\text{sim}}(Y_1^l) - t_{\text{sim}}(X_1^l)$ and $\text{ffn}_l = t_{\text{sim}}(Y_2^l) - t_{\text{sim}}(X_2^l)$:
    the change made by the residual update ``Y = X + F(.)`` itself, before any
    Post-Norm RMSNorm (whose own effect is ``rms_l``, the remaining change of the
    block).

    Args:
        key: PRNG key; keyword arguments as ``similarity_profile``.

    Returns:
        dict of ``(depth,)`` arrays ``attn, ffn, rms, t_out``, with
        ``attn + ffn + rms = t_out - t_sim(X1)`` per layer.

    Example:
        >>> import jax, meanfield as mf
        >>> inc = mf.depth.sublayer_increments(jax.random.key(0), depth=2, n=8, d=8, d_ff=16, heads=2)
        >>> sorted(inc), inc["attn"].shape
        (['attn', 'ffn', 'rms', 't_out'], (2,))
    """
    s = init_trace(key, **kwargs)
    block_total = s["t_out"] - s["t_x1"]
    attn = s["t_y1"] - s["t_x1"]
    ffn = s["t_y2"] - s["t_x2"]
    return {"attn": attn, "ffn": ffn, "rms": block_total - attn - ffn, "t_out": s["t_out"]}


# ----------------------------------------------------------------------------- forward closed forms (Sec. 3.1, App. C)


def _check_t(t: Any) -> None:
    if is_concrete(t):
        a = np.asarray(t, dtype=np.float64)
        if not np.all(np.isfinite(a)) or np.any(a < 0) or np.any(a > 1):
            raise ValueError(f"t (a token similarity) must lie in [0, 1], got {t!r}")


def _harmonic(n: int) -> float:
    return float(np.sum(1.0 / np.arange(1, n + 1, dtype=np.float64)))


def equal_correlation_matrix(n: int, d: RealScalarLike, t: RealScalarLike) -> Float[Array, "n n"]:
    r"""The equal-correlation closure $R_{\text{eq}}(t)$ of a token Gram matrix (Sec. 3.1, App. C.1 (iii)).

    The symmetric $n \times n$ matrix in the span of $I$ and $\mathbf 1 \mathbf 1^\top$ with
    diagonal $d$ (RMS-normalised rows) and $\operatorname{tr}(\Pi R) / \operatorname{tr}(R) = t$:

    $$R_{\text{eq}}(t) = d\,\big[(1 - \rho)\, I + \rho\, \mathbf 1 \mathbf 1^\top\big], \qquad \rho = \frac{n t - 1}{n - 1}.$$

    Derivation (reconstruction: the extraction lost the displayed formula, the text states its
    two constraints): with $R = a I + b \mathbf 1 \mathbf 1^\top$, $\operatorname{tr} R = n d$ and
    $\operatorname{tr}(\Pi R) = \mathbf 1^\top R \mathbf 1 / n = a + b n$, so $a + b = d$ and
    $a + b n = n d t$, giving $b = d \rho$, $a = d (1 - \rho)$. $\rho$ is the common cosine
    between tokens; it is $\ge -1/(n-1)$ for every $t \in [0, 1]$, and $R$ is positive
    semi-definite there.

    Args:
        n: number of tokens (``>= 2``); d: row squared norm; t: token similarity in ``[0, 1]``.

    Returns:
        ``(n, n)`` float32 array.

    Example:
        >>> import meanfield as mf
        >>> mf.depth.equal_correlation_matrix(3, 2, 0.5).tolist()  # rho = 1/4
        [[2.0, 0.5, 0.5], [0.5, 2.0, 0.5], [0.5, 0.5, 2.0]]
    """
    n = check_int("n", n, minimum=2)
    check_positive("d", d)
    _check_t(t)
    rho = (n * t - 1.0) / (n - 1.0)
    eye = jnp.eye(n, dtype=jnp.float32)
    return jnp.asarray(d * ((1.0 - rho) * eye + rho * jnp.ones((n, n), jnp.float32)))


def value_output_variance(sigma_w: ArrayLike, d: ArrayLike) -> Any:
    r"""Entry variance $\sigma_W^2 = d\, \sigma_w^4$ of the merged value-output map $W = W_V W_O$.

    The paper's attention sublayer is $Y = X + P X W$ with one $d \times d$ Gaussian matrix $W$
    (App. C.1 (i)); this package's block has $W_V, W_O$ with $N(0, \sigma_w^2)$ entries and
    heads of width $d_h$, with $\mathbb E[W_V^h W_O^h (W_V^h W_O^h)^\top] = d\, d_h\, \sigma_w^4 I$
    per head and no cross-head terms, so for a common attention matrix
    $\mathbb E[W W^\top] = d^2 \sigma_w^4 I = d\, \sigma_W^2 I$: the same second moments as one
    matrix of entry variance $d \sigma_w^4$ (only second moments enter the one-step formulas).

    Args:
        sigma_w: per-matrix weight standard deviation; d: model dimension.

    Returns:
        $d\, \sigma_w^4$ (same type as the inputs).

    Example:
        >>> import meanfield as mf
        >>> mf.depth.value_output_variance(0.5, 4)  # sigma_w = 1/sqrt(d): sigma_W^2 = 1/d
        0.25
    """
    check_positive("sigma_w", sigma_w)
    check_positive("d", d)
    return d * sigma_w**4


def amount_of_attention(
    frob_sq: _ArrayLike, *, n: int, d: RealScalarLike, sigma_w: RealScalarLike
) -> Array:
    r"""The amount of attention $s = n d^2 \sigma_W^2 / \|X\|_F^2$ of a sublayer (Sec. 3.1).

    $\sigma_W^2 = d \sigma_w^4$ (``value_output_variance``). It is the factor in
    $\mathbb E_W[Y Y^\top] = X X^\top + s\, P \tilde X \tilde X^\top P^\top\, \|X\|_F^2/(n d)$,
    where $\tilde X$ is the attention input: $X$ itself in Post-Norm, whose rows have norm
    $\sqrt d$ so $\|X\|_F^2 = n d$ and $s = d \sigma_W^2 = d^2 \sigma_w^4$ at every layer; the
    RMS-normalised $X$ in Pre-Norm, whose residual norm grows with depth (roughly linearly),
    so $s^l$ decays like $1/l$.

    Args:
        frob_sq: $\|X\|_F^2$ of the residual stream at the sublayer input (array or scalar, ``> 0``).
        n, d: sequence length and model dimension; sigma_w: per-matrix weight standard deviation.

    Returns:
        $s$, shaped like ``frob_sq``.

    Example:
        >>> import meanfield as mf
        >>> float(mf.depth.amount_of_attention(8 * 16, n=8, d=16, sigma_w=0.25))  # Post-Norm, sigma_w = 1/sqrt(d)
        1.0
    """
    n = check_int("n", n, minimum=1)
    check_positive("frob_sq", frob_sq)
    return n * d**2 * value_output_variance(sigma_w, d) / jnp.asarray(frob_sq, jnp.float32)


def one_step_attention(
    t: _ArrayLike, s: _ArrayLike, *, n: int, alpha_prefix: RealScalarLike = 0.0
) -> Array:
    r"""Expected one-step token-similarity change of an attention residual update (Thm 3.2, Cor. 3.3).

    Model (App. C.1-C.2): $Y = X + (1 - \alpha) C_n \tilde X W$ with the causal attention
    matrix replaced by its prefix-averaging surrogate $C_n$ (``alpha_prefix`` $= \alpha$ removes
    $\alpha C_n$ as in Cor. 3.3), $X X^\top$ replaced by the closure $R_{\text{eq}}(t)$
    (``equal_correlation_matrix``) and $t_{\text{sim}}(Y)$ by the ratio of expectations
    $\mathbb E\|\Pi Y\|_F^2 / \mathbb E\|Y\|_F^2$ over the Gaussian $W$; $s$ is the amount of
    attention (``amount_of_attention``). With $s' = (1 - \alpha)^2 s$,
    $\mathbb E_W[Y Y^\top] \propto R + s' C_n R C_n^\top$, and with
    $\operatorname{tr}(C_n C_n^\top) = H_n$ (harmonic number),
    $\operatorname{tr}(\Pi C_n C_n^\top) = \frac1n \sum_j (H_n - H_{j-1})^2 = 2 - H_n/n$,
    $C_n \mathbf 1 = \mathbf 1$:

    $$\Delta t = \frac{t + s'\,[\rho + (1 - \rho)(2 - H_n/n)/n]}{1 + s'\,[\rho + (1 - \rho) H_n / n]} - t
      = \frac{s' (1 - t)\,\big[(n - H_n)\, t + 1 - H_n/n\big]}{(n - 1) + s'\,\big[n t - 1 + (1 - t) H_n\big]},$$

    $\rho = (nt - 1)/(n - 1)$. It is $> 0$ for $t < 1$ and $s' > 0$ (attention amplifies
    similarity) and $0$ at $t = 1$. Reconstruction: the extraction lost the displayed
    statement of Thm 3.2; this is the derivation of App. C from the assumptions it lists.

    Args:
        t: token similarity of the sublayer input, in ``[0, 1]`` (array or scalar).
        s: amount of attention ``>= 0`` (broadcasts with ``t``).
        n: sequence length (``>= 2``); alpha_prefix: ablation strength $\alpha$.

    Returns:
        $\Delta t$, broadcast shape of ``t`` and ``s``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.depth.one_step_attention(0.0, 1.0, n=2)), 6)  # (1 - 3/4) / (1 + 1/2), H_2 = 3/2
        0.166667
    """
    n = check_int("n", n, minimum=2)
    _check_t(t)
    check_nonnegative("s", s)
    _check_alpha(alpha_prefix)
    return _one_step_attention(
        jnp.asarray(t, jnp.float32),
        jnp.asarray(s, jnp.float32),
        jnp.asarray(alpha_prefix, jnp.float32),
        n=n,
    )


@partial(jax.jit, static_argnames=("n",))
def _one_step_attention(t: Array, s: Array, alpha_prefix: Array, *, n: int) -> Array:
    # one compiled program per shape (the reproduction evaluates it at every layer and seed)
    h = _harmonic(n)
    sp = (1.0 - alpha_prefix) ** 2 * s
    num = sp * (1.0 - t) * ((n - h) * t + 1.0 - h / n)
    return num / ((n - 1.0) + sp * (n * t - 1.0 + (1.0 - t) * h))


# Probabilists' Gauss-Hermite rule for E f(u), u ~ N(0, 1); 48 nodes integrate the smooth
# silu products below to float32 rounding for tau <= 3 (checked against scipy.integrate in
# tests/test_depth.py).
_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(48)
_GH_W = _GH_W / _GH_W.sum()


def swiglu_correlation(rho: _ArrayLike, tau2: _ArrayLike) -> Array:
    r"""$m(\rho) = \mathbb E[\operatorname{silu}(u) \operatorname{silu}(u')]$ for $(u, u')$ centred Gaussian, variances $\tau^2$, correlation $\rho$.

    The SwiGLU moment of Thm 3.4 (App. C.4): for a SwiGLU input row pair of common cosine
    $\rho$ and squared norm $d$, the gate pre-activations $u = x^\top w_1$, $u' = x'^\top w_1$
    (entries of $W_1$ of variance $\sigma_w^2$) have variance $\tau^2 = d \sigma_w^2$ and
    correlation $\rho$. Computed by a tensor Gauss-Hermite rule with
    $u = \tau z_1$, $u' = \tau(\rho z_1 + \sqrt{1 - \rho^2}\, z_2)$. $m(0) = (\mathbb E \operatorname{silu} u)^2$,
    $m(1) = \mathbb E \operatorname{silu}(u)^2$, and $m$ increases on $[0, 1]$. Identification
    (reconstruction): the paper quotes $m(0) \approx 0.006$, $m(1) \approx 0.100$ "under the
    current variance setting", which this $m$ gives at $\tau^2 = 1/3$ ($0.0060$, $0.0998$).

    Args:
        rho: correlation(s) in ``[-1, 1]``; tau2: pre-activation variance ``> 0`` (broadcasts).

    Returns:
        $m(\rho)$, broadcast shape of ``rho`` and ``tau2``.

    Example:
        >>> import meanfield as mf
        >>> [round(float(mf.depth.swiglu_correlation(r, 1 / 3)), 4) for r in (0.0, 1.0)]
        [0.006, 0.0998]
    """
    if is_concrete(rho):
        r = np.asarray(rho, dtype=np.float64)
        if not np.all(np.isfinite(r)) or np.any(np.abs(r) > 1):
            raise ValueError(f"rho must lie in [-1, 1], got {rho!r}")
    check_positive("tau2", tau2)
    return _swiglu_correlation(jnp.asarray(rho, jnp.float32), jnp.asarray(tau2, jnp.float32))


@jax.jit
def _swiglu_correlation(rho: Array, tau2: Array) -> Array:
    rho = rho[..., None, None]
    tau = jnp.sqrt(tau2)[..., None, None]
    z1 = jnp.asarray(_GH_X, jnp.float32)[:, None]
    z2 = jnp.asarray(_GH_X, jnp.float32)[None, :]
    w = jnp.asarray(np.outer(_GH_W, _GH_W), jnp.float32)
    u = tau * z1
    v = tau * (rho * z1 + jnp.sqrt(jnp.clip(1.0 - rho * rho, 0.0)) * z2)
    return jnp.sum(w * jax.nn.silu(u) * jax.nn.silu(v), axis=(-2, -1))


def one_step_ffn(
    t: _ArrayLike,
    *,
    n: int,
    d: int,
    d_ff: int,
    sigma_w: RealScalarLike,
    frob_sq: _ArrayLike | None = None,
) -> Array:
    r"""Expected one-step token-similarity change of a SwiGLU residual update (Thm 3.4).

    Model (App. C.4): $Y = X + (\operatorname{silu}(\tilde X W_1) \odot \tilde X W_3) W_2$,
    all weights $N(0, \sigma_w^2)$, $\tilde X$ with rows of norm $\sqrt d$ and Gram matrix
    $R_{\text{eq}}(t)$, ratio of expectations. With $\tau^2 = d \sigma_w^2$, $m$ as in
    ``swiglu_correlation``, $\mathbb E[h_i^\top h_j] = d_{ff}\, \tau^2 \rho_{ij}\, m(\rho_{ij})$ for
    the hidden rows and $\mathbb E_{W_2}[y y'^\top] = d \sigma_w^2\, h^\top h'$, so the branch
    adds $a = \frac{n d}{\|X\|_F^2}\, d_{ff}\, \sigma_w^2 \tau^2 m(1)$ times $\|X\|_F^2$ to the
    denominator and

    $$\Delta t = -\frac{a}{1 + a}\,\Big(t - \frac1n\Big)\Big(1 - \frac{m(\rho)}{m(1)}\Big), \qquad \rho = \frac{n t - 1}{n - 1}.$$

    Only the numerator $\mathbb E\|\Pi Y\|_F^2$ sees $t$, as the paper says of its Eq. (6).
    $\Delta t \le 0$ for $t \ge 1/n$ (damping; for $t < 1/n$ it pushes $t$ up to $1/n$), and $0$
    at $t = 1/n$ and at $t = 1$.
    ``frob_sq`` $= \|X\|_F^2$ of the residual stream (Pre-Norm; ``None``: $n d$, Post-Norm).
    Reconstruction: the extraction lost the displayed statement of Thm 3.4.

    Args:
        t: input token similarity in ``[0, 1]``.
        n, d, d_ff: sizes; sigma_w: weight standard deviation.
        frob_sq: residual-stream $\|X\|_F^2$ (broadcasts with ``t``) or ``None``.

    Returns:
        $\Delta t$ (``<= 0``), broadcast shape of ``t`` and ``frob_sq``.

    Example:
        >>> import meanfield as mf
        >>> abs(float(mf.depth.one_step_ffn(1 / 8, n=8, d=16, d_ff=48, sigma_w=0.25)))  # t = 1/n: no change
        0.0
    """
    n = check_int("n", n, minimum=2)
    d = check_int("d", d, minimum=1)
    d_ff = check_int("d_ff", d_ff, minimum=1)
    _check_t(t)
    check_positive("sigma_w", sigma_w)
    if frob_sq is not None:
        check_positive("frob_sq", frob_sq)
    sq = jnp.asarray(n * d if frob_sq is None else frob_sq, jnp.float32)
    return _one_step_ffn(
        jnp.asarray(t, jnp.float32), sq, jnp.asarray(sigma_w, jnp.float32), n=n, d=d, d_ff=d_ff
    )


@partial(jax.jit, static_argnames=("n", "d", "d_ff"))
def _one_step_ffn(t: Array, frob_sq: Array, sigma_w: Array, *, n: int, d: int, d_ff: int) -> Array:
    tau2 = d * sigma_w**2
    m1 = _swiglu_correlation(jnp.float32(1.0), tau2)
    rho = jnp.clip((n * t - 1.0) / (n - 1.0), -1.0, 1.0)
    a = n * d / frob_sq * d_ff * sigma_w**2 * tau2 * m1
    return -a / (1.0 + a) * (t - 1.0 / n) * (1.0 - _swiglu_correlation(rho, tau2) / m1)


def amount_of_attention_profile(
    *,
    depth: int,
    n: int,
    d: int,
    d_ff: int,
    sigma_w: RealScalarLike,
    norm: str = "pre",
    attn_energy_factor: RealScalarLike = 1.0,
) -> Float[Array, " depth"]:
    r"""Predicted amount of attention $s^l$ at the attention input of blocks $l = 1, \dots, \text{depth}$ (Sec. 3.1).

    Post-Norm: every block input is RMS-normalised, $\|X_1^l\|_F^2 = n d$, so
    $s^l = d\, \sigma_W^2 = d^2 \sigma_w^4$ at every layer. Pre-Norm: the residual stream is not
    renormalised and its squared norm grows by the expected energy of each branch (the cross
    terms vanish in expectation over the zero-mean output weights):

    $$\|X_2^l\|_F^2 = \|X_1^l\|_F^2 + n d^2 \sigma_W^2 \big[\rho_l + (1 - \rho_l) H_n/n\big], \qquad
      \|X_1^{l+1}\|_F^2 = \|X_2^l\|_F^2 + n d\; d_{ff}\, \sigma_w^2\, \tau^2 m(1),$$

    ($\tau^2 = d \sigma_w^2$, $m$ = ``swiglu_correlation``, $H_n$ the harmonic number,
    $\rho_l$ the closure correlation of the predicted similarity $t$), starting from
    $\|X_1^1\|_F^2 = n d$, $t = 1/n$ (the mean similarity of $n$ i.i.d. isotropic tokens), $t$
    advanced by ``one_step_attention`` and ``one_step_ffn``; then
    $s^l = n d^2 \sigma_W^2 / \|X_1^l\|_F^2$. The growth per block is between two constants,
    so $s^l \sim 1/l$. (Reconstruction from App. C's second moments; the paper cites the
    linear norm growth of Xiong et al. 2020 instead.)

    Args:
        depth, n, d, d_ff: sizes; sigma_w: weight standard deviation; norm: ``"post"`` or ``"pre"``.
        attn_energy_factor: multiplies the attention-branch energy (``1``: the formula above;
            the surrogate $C_n$ is the least-energy causal averaging, so softmax attention adds
            more, and ``2`` sizes that model error).

    Returns:
        ``(depth,)`` array of $s^l$.

    Example:
        >>> import meanfield as mf
        >>> s = mf.depth.amount_of_attention_profile(depth=3, n=8, d=16, d_ff=48, sigma_w=0.25, norm="post")
        >>> s.tolist()
        [1.0, 1.0, 1.0]
    """
    depth = check_int("depth", depth, minimum=1)
    n = check_int("n", n, minimum=2)
    d = check_int("d", d, minimum=1)
    d_ff = check_int("d_ff", d_ff, minimum=1)
    check_positive("sigma_w", sigma_w)
    check_nonnegative("attn_energy_factor", attn_energy_factor)
    _check_norm(norm)
    return jnp.asarray(
        _attention_amounts(depth, n, d, d_ff, float(sigma_w), norm, float(attn_energy_factor)),
        jnp.float32,
    )


def _attention_amounts(
    depth: int,
    n: int,
    d: int,
    d_ff: int,
    sigma_w: float,
    norm: str,
    attn_energy_factor: float,
) -> np.ndarray:
    """``amount_of_attention_profile`` in float64 NumPy."""
    attn_energy = n * d**2 * d * sigma_w**4  # n d^2 sigma_W^2, sigma_W^2 = d sigma_w^4
    if _placement(norm).renormalised_stream:
        return np.full(depth, attn_energy / (n * d))
    tau2 = d * sigma_w**2
    ffn_energy = n * d * d_ff * sigma_w**2 * tau2 * float(swiglu_correlation(1.0, tau2))
    h = _harmonic(n)
    sq, t, out = float(n * d), 1.0 / n, []
    for _ in range(depth):
        out.append(attn_energy / sq)
        rho = (n * t - 1.0) / (n - 1.0)
        t = min(max(t + float(one_step_attention(t, out[-1], n=n)), 0.0), 1.0)
        sq += attn_energy_factor * attn_energy * (rho + (1.0 - rho) * h / n)
        t = min(
            max(t + float(one_step_ffn(t, n=n, d=d, d_ff=d_ff, sigma_w=sigma_w, frob_sq=sq)), 0.0),
            1.0,
        )
        sq += ffn_energy
    return np.asarray(out)


# ----------------------------------------------------------------------------- frequency loss


def frequency_distribution(labels: ArrayLike, vocab: int) -> Float[Array, " vocab"]:
    r"""Label frequencies $p_{\text{freq}}(v) = \#\{\text{labels} = v\} / \#\text{labels}$ over the whole collection.

    Args:
        labels: integer array of any shape, values in ``[0, vocab)``.
        vocab: vocabulary size.

    Returns:
        ``(vocab,)`` probability vector.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> mf.depth.frequency_distribution(jnp.array([0, 1, 1, 1]), 3).tolist()
        [0.25, 0.75, 0.0]
    """
    vocab = check_int("vocab", vocab, minimum=1)
    if is_concrete(labels):
        lab = np.asarray(labels)
        if lab.size == 0 or not np.issubdtype(lab.dtype, np.integer):
            raise ValueError(
                f"labels must be a non-empty integer array, got dtype {lab.dtype}, size {lab.size}"
            )
        if lab.min() < 0 or lab.max() >= vocab:
            raise ValueError(
                f"labels must lie in [0, {vocab - 1}] for vocab = {vocab}, "
                f"got range [{lab.min()}, {lab.max()}]"
            )
    counts = jnp.bincount(jnp.ravel(labels), length=vocab)
    return counts / counts.sum()


def frequency_loss(labels: ArrayLike, vocab: int) -> Float[Array, ""]:
    r"""Entropy of the label frequencies $H(p_{\text{freq}}) = -\sum_v p_{\text{freq}}(v) \log p_{\text{freq}}(v)$ (Thm 3.8).

    The smallest cross-entropy a network with one output distribution at every
    position can reach on ``labels`` (all positions of all sequences aggregated).

    Args:
        labels: integer array of any shape, values in ``[0, vocab)``; vocab: vocabulary size.

    Returns:
        scalar ``()`` in nats.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> round(float(mf.depth.frequency_loss(jnp.array([0, 1, 0, 1]), 2)), 6)
        0.693147
    """
    p = frequency_distribution(labels, vocab)
    return -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))


def collapsed_cross_entropy(
    logits: Float[ArrayLike, " vocab"], labels: Int[ArrayLike, "..."]
) -> Float[Array, ""]:
    r"""Cross-entropy $-\operatorname{mean}_i \log \operatorname{softmax}(\text{logits})_{y_i}$ of ONE distribution used at every position.

    Args:
        logits: ``(vocab,)`` logits shared by all positions; labels: integer array of any shape.

    Returns:
        scalar ``()``; minimal (``= H(p_freq)``) at ``logits = log p_freq``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> round(float(mf.depth.collapsed_cross_entropy(jnp.zeros(2), jnp.array([0, 1, 1]))), 4)  # log 2
        0.6931
    """
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(logp[jnp.ravel(labels)])


# ----------------------------------------------------------------------------- Zipf-Markov corpus


def zipf_markov_source(
    key: PRNGKeyArray, *, vocab: int, exponent: RealScalarLike = 1.1, mix: RealScalarLike = 0.5
) -> tuple[Float[Array, "V V"], Float[Array, " V"]]:
    r"""A seeded first-order Markov token source with Zipf-shaped rows.

    Row $s$ of the transition matrix is $T_s = (1 - \text{mix})\, z + \text{mix}\; z \circ \pi_s$,
    where $z_k \propto k^{-\text{exponent}}$ is a Zipf law over the vocabulary and
    $\pi_s$ a random permutation per state (so the marginal frequencies are
    Zipf-like and the next token depends on the current one).

    Args:
        key: PRNG key (the permutations).
        vocab: number of states; exponent: Zipf exponent ``> 0``; mix: weight in ``[0, 1]``.

    Returns:
        ``(T, p0)``: the ``(vocab, vocab)`` row-stochastic matrix and the ``(vocab,)`` initial law ``z``.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> T, p0 = mf.depth.zipf_markov_source(jax.random.key(0), vocab=6)
        >>> T.shape, bool(jnp.allclose(T.sum(1), 1.0, atol=1e-6)), bool(p0[0] > p0[-1])
        ((6, 6), True, True)
    """
    vocab = check_int("vocab", vocab, minimum=2)
    check_positive("exponent", exponent)
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must be in [0, 1], got {mix!r}")
    z = jnp.arange(1, vocab + 1, dtype=jnp.float32) ** (-exponent)
    z = z / z.sum()
    perms = jax.vmap(lambda k: jax.random.permutation(k, vocab))(jax.random.split(key, vocab))
    T = jnp.asarray((1.0 - mix) * z[None, :] + mix * z[perms])
    return T, z


def sample_tokens(
    key: PRNGKeyArray,
    T: Float[ArrayLike, "V V"],
    p0: Float[ArrayLike, " V"],
    *,
    batch: int,
    length: int,
) -> Int[Array, "batch length"]:
    r"""``(batch, length)`` int32 token sequences from the Markov source ``(T, p0)``.

    $x_0 \sim p_0$, $x_{t+1} \sim T_{x_t}$, independently per sequence.

    Args:
        key: PRNG key; T: ``(V, V)`` transition matrix; p0: ``(V,)`` initial law.
        batch, length: output shape.

    Returns:
        ``(batch, length)`` int32 array with values in ``[0, V)``.

    Example:
        >>> import jax, meanfield as mf
        >>> T, p0 = mf.depth.zipf_markov_source(jax.random.key(0), vocab=6)
        >>> x = mf.depth.sample_tokens(jax.random.key(1), T, p0, batch=2, length=7)
        >>> x.shape, str(x.dtype), bool((x >= 0).all() & (x < 6).all())
        ((2, 7), 'int32', True)
    """
    batch = check_int("batch", batch, minimum=1)
    length = check_int("length", length, minimum=1)
    return _sample_tokens(key, T, p0, batch=batch, length=length)


@partial(jax.jit, static_argnames=("batch", "length"))
def _sample_tokens(
    key: PRNGKeyArray,
    T: Float[Array, "V V"],
    p0: Float[Array, " V"],
    *,
    batch: int,
    length: int,
) -> Int[Array, "batch length"]:
    k0, ks = jax.random.split(key)
    x0 = jax.random.categorical(k0, jnp.log(p0), shape=(batch,))
    logT = jnp.log(T)

    def step(x: Int[Array, " batch"], k: PRNGKeyArray) -> tuple[Array, Array]:
        nxt = jax.random.categorical(k, logT[x])
        return nxt, nxt

    _, rest = jax.lax.scan(step, x0, jax.random.split(ks, length - 1))
    return jnp.concatenate([x0[:, None], rest.T], axis=1).astype(jnp.int32)


# ----------------------------------------------------------------------------- language model


def init_lm(
    key: PRNGKeyArray,
    *,
    vocab: int,
    depth: int,
    d: int,
    d_ff: int,
    heads: int,
    sigma_w: RealScalarLike | None = None,
) -> dict:
    """Decoder LM parameters: ``embed (vocab, d)`` with ``N(0, 1)`` entries (RMS-1 token
    vectors, as the inputs of ``similarity_profile``), ``blocks`` (stacked),
    ``final_gain (d,)`` (final RMSNorm, used by Pre-Norm only) and
    ``unembed (d, vocab)`` with ``N(0, sigma_w^2)`` entries: the arrays of
    ``DecoderLM.init(key, ...)`` (``.to_params()``).

    Args:
        key: PRNG key; vocab: vocabulary size.
        depth, d, d_ff, heads, sigma_w: as in ``init_stack``.

    Returns:
        dict with keys ``embed, blocks, final_gain, unembed``.

    Example:
        >>> import jax, meanfield as mf
        >>> lm = mf.depth.init_lm(jax.random.key(0), vocab=10, depth=2, d=8, d_ff=16, heads=2)
        >>> lm["embed"].shape, lm["blocks"]["wq"].shape, lm["unembed"].shape
        ((10, 8), (2, 8, 8), (8, 10))
    """
    return DecoderLM.init(
        key, vocab=vocab, depth=depth, d=d, d_ff=d_ff, heads=heads, sigma_w=sigma_w
    ).to_params()


def lm_logits(
    params: dict,
    tokens: Int[Array | np.ndarray, " n"],
    *,
    norm: str,
    heads: int,
    taps: Float[Array, "depth 4 n d"] | None = None,
) -> tuple[Float[Array, "n vocab"], dict]:
    r"""Logits ``(n, vocab)`` of one sequence, and the per-layer statistics of ``forward``.

    $\text{logits} = H W_U$, $H = \operatorname{forward}(E_{\text{tokens}})$ (then the final RMSNorm for Pre-Norm):
    ``DecoderLM.from_params(params, norm=norm, heads=heads)(tokens, taps=taps)``.

    Args:
        params: ``init_lm`` parameters; tokens: ``(n,)`` int ids.
        norm, heads, taps: as in ``forward``.

    Returns:
        ``(logits: (n, vocab), stats)``; ``stats`` adds ``t_final`` (token similarity of ``H``).

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> lm = mf.depth.init_lm(jax.random.key(0), vocab=10, depth=2, d=8, d_ff=16, heads=2)
        >>> logits, stats = mf.depth.lm_logits(lm, jnp.arange(5), norm="post", heads=2)
        >>> logits.shape, stats["t_out"].shape
        ((5, 10), (2,))
    """
    return DecoderLM.from_params(params, norm=norm, heads=heads)(tokens, taps=taps)


def lm_loss(
    params: dict,
    tokens: Int[Array | np.ndarray, "B n1"],
    *,
    norm: str,
    heads: int,
    taps: Float[Array, "B depth 4 n d"] | None = None,
) -> tuple[Float[Array, ""], dict]:
    r"""Mean next-token cross-entropy over a batch (inputs ``tokens[:, :-1]``, labels
    ``tokens[:, 1:]``): $L = -\operatorname{mean}_{b,i} \log \operatorname{softmax}(\text{logits}_{b,i})_{\text{tokens}_{b, i + 1}}$.

    Args:
        params: ``init_lm`` parameters; tokens: ``(B, n + 1)`` int ids.
        norm, heads: as in ``forward``; taps: optional ``(B, depth, 4, n, d)``.

    Returns:
        ``(loss: (), stats)``, statistics averaged over the batch.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> lm = mf.depth.init_lm(jax.random.key(0), vocab=10, depth=2, d=8, d_ff=16, heads=2)
        >>> loss, stats = mf.depth.lm_loss(lm, jnp.arange(12).reshape(2, 6) % 10, norm="pre", heads=2)
        >>> loss.shape, bool(jnp.isfinite(loss))
        ((), True)
    """
    inp, lab = jnp.asarray(tokens)[:, :-1], jnp.asarray(tokens)[:, 1:]

    def one(
        tok: Int[Array, " n"], y: Int[Array, " n"], tp: Float[Array, "depth 4 n d"] | None
    ) -> tuple[Float[Array, ""], dict]:
        logits, stats = lm_logits(params, tok, norm=norm, heads=heads, taps=tp)
        ce = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=-1))
        return ce, stats

    if taps is None:
        ce, stats = jax.vmap(lambda t, y: one(t, y, None))(inp, lab)
    else:
        ce, stats = jax.vmap(one)(inp, lab, taps)
    return jnp.mean(ce), jax.tree_util.tree_map(lambda s: jnp.mean(s, axis=0), stats)


def lm_diagnostics(
    params: dict, tokens: Int[Array | np.ndarray, "B n1"], *, norm: str, heads: int
) -> tuple[Float[Array, ""], dict, dict[str, Array]]:
    """Loss, gradients and per-layer diagnostics of one batch.

    Returns ``(loss, grads, diag)`` with ``diag`` entries ``(depth,)`` (or scalars):
    ``tsim`` (block outputs), ``t_final``, ``rms_attn, rms_ffn`` (``sqrt(d)/||y||``),
    ``alpha_attn, alpha_ffn`` (``||dL/dX_k|| / ||dL/dY_k||``), ``c_attn, c_ffn``
    (``alpha * sqrt(d)/||y||``), ``g_stream`` (``||dL/dX1||_F`` at each block input,
    the backward signal reaching that layer), ``grad_norm`` (per-layer parameter-gradient norm)
    and ``grad_norm_total``.

    Args:
        params: ``init_lm`` parameters; tokens: ``(B, n + 1)`` int ids.
        norm, heads: as in ``forward``.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> lm = mf.depth.init_lm(jax.random.key(0), vocab=10, depth=2, d=8, d_ff=16, heads=2)
        >>> diagnostics = jax.jit(mf.depth.lm_diagnostics, static_argnames=("norm", "heads"))
        >>> loss, grads, diag = diagnostics(lm, jnp.arange(12).reshape(2, 6) % 10, norm="post", heads=2)
        >>> diag["alpha_attn"].shape, grads["embed"].shape
        ((2,), (10, 8))
    """
    B, n1 = tokens.shape
    depth = params["blocks"]["wq"].shape[0]
    d = params["embed"].shape[1]
    taps = jnp.zeros((B, depth, 4, n1 - 1, d), params["embed"].dtype)
    (loss, stats), (grads, g_taps) = jax.value_and_grad(
        lambda p, t: lm_loss(p, tokens, norm=norm, heads=heads, taps=t),
        argnums=(0, 1),
        has_aux=True,
    )(params, taps)
    gn = jnp.sqrt(jnp.sum(g_taps**2, axis=(0, 3, 4)))  # (depth, 4): X1, Y1, X2, Y2
    alpha_attn = gn[:, 0] / gn[:, 1]
    alpha_ffn = gn[:, 2] / gn[:, 3]
    layer_gn = jnp.sqrt(
        sum(
            jnp.sum(g**2, axis=tuple(range(1, g.ndim)))
            for g in jax.tree_util.tree_leaves(grads["blocks"])
        )
    )
    diag = {
        "tsim": stats["t_out"],
        "t_final": stats["t_final"],
        "rms_attn": stats["rms_attn"],
        "rms_ffn": stats["rms_ffn"],
        "alpha_attn": alpha_attn,
        "alpha_ffn": alpha_ffn,
        "c_attn": alpha_attn * stats["rms_attn"],
        "c_ffn": alpha_ffn * stats["rms_ffn"],
        "g_stream": gn[:, 0],
        "grad_norm": layer_gn,
        "grad_norm_total": optax.tree.norm(grads),
    }
    return loss, grads, diag


def make_optimizer(
    lr_peak: RealScalarLike,
    *,
    steps: int,
    warmup: int,
    weight_decay: float = 0.1,
    clip: float = 1.0,
) -> optax.GradientTransformation:
    r"""AdamW(b1=0.9, b2=0.95) with linear warmup to ``lr_peak`` then cosine decay to
    ``lr_peak/10`` at ``steps``, after global-norm clipping at ``clip``. ``lr_peak`` may be traced.

    $\text{lr}(t) = \text{lr}_{\text{peak}}\, t / \text{warmup}$ for $t < \text{warmup}$, then
    $\text{lr}_{\text{peak}} \big(0.1 + 0.9\, (1 + \cos(\pi (t - \text{warmup}) / (\text{steps} - \text{warmup}))) / 2\big)$.

    Args:
        lr_peak: peak learning rate; steps, warmup: schedule lengths;
        weight_decay: AdamW decoupled decay; clip: global-norm clipping threshold.

    Returns:
        an ``optax.GradientTransformation``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> opt = mf.depth.make_optimizer(1e-3, steps=10, warmup=2)
        >>> w = {"w": jnp.ones(3)}
        >>> upd, _ = opt.update(w, opt.init(w), w)
        >>> float(jnp.abs(upd["w"]).max())  # lr(0) = 0 during warmup
        0.0
    """
    unit = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=1.0, warmup_steps=warmup, decay_steps=steps, end_value=0.1
    )

    def sched(count: Array) -> Array:  # the peak is a factor, so it may be a traced (vmapped) rate
        return lr_peak * unit(count)

    return optax.chain(
        optax.clip_by_global_norm(clip),
        optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=weight_decay),
    )


@partial(jax.jit, static_argnames=("norm", "heads", "warmup"))
def _train(
    params: dict,
    data: Int[Array, "steps B n1"],
    lr_peak: Array,
    *,
    norm: str,
    heads: int,
    warmup: int,
) -> tuple[dict, dict[str, Array]]:
    steps = data.shape[0]
    opt = make_optimizer(lr_peak, steps=steps, warmup=warmup)

    def step(carry: tuple[dict, Any], batch: Int[Array, "B n1"]) -> tuple[tuple[dict, Any], dict]:
        p, s = carry
        loss, grads, diag = lm_diagnostics(p, batch, norm=norm, heads=heads)
        upd, s = opt.update(grads, s, p)
        p = optax.apply_updates(p, upd)
        diag["loss"] = loss
        return (p, s), diag

    (params, _), hist = jax.lax.scan(step, (params, opt.init(params)), data)
    return params, hist


def train_lm(
    params: dict,
    data: Int[Array | np.ndarray, "..."],
    lr_peak: RealScalarLike,
    *,
    norm: str,
    heads: int,
    warmup: int,
) -> tuple[dict, dict[str, Array]]:
    """Train a decoder LM for ``data.shape[0]`` AdamW steps, one batch ``data[t]`` per step.

    The loss and all diagnostics of ``lm_diagnostics`` are recorded at every
    step (before that step's update). ``lr_peak`` may be a traced scalar, so
    ``jax.vmap(lambda lr: train_lm(p, data, lr, ...))(lrs)`` sweeps rates in one
    compilation. Returns ``(final_params, history)`` with history leaves ``(steps, ...)``.

    Args:
        params: ``init_lm`` parameters.
        data: ``(steps, B, n + 1)`` token ids.
        lr_peak: peak rate of ``make_optimizer``; norm, heads: as in ``forward``;
        warmup: warmup steps.

    Example (the training call is ``+SKIP``: compiling the step takes ~10 s on a 2-core CPU):
        >>> import jax, meanfield as mf
        >>> lm = mf.depth.init_lm(jax.random.key(0), vocab=10, depth=2, d=8, d_ff=16, heads=2)
        >>> T, p0 = mf.depth.zipf_markov_source(jax.random.key(1), vocab=10)
        >>> data = mf.depth.sample_tokens(jax.random.key(2), T, p0, batch=6, length=6).reshape(3, 2, 6)
        >>> lm, hist = mf.depth.train_lm(lm, data, 1e-2, norm="post", heads=2, warmup=1)  # doctest: +SKIP
        >>> hist["loss"].shape, hist["tsim"].shape  # doctest: +SKIP
        ((3,), (3, 2))
    """
    _check_norm(norm)
    check_int("warmup", warmup, minimum=0)
    check_nonnegative("lr_peak", lr_peak)
    if data.ndim != 3 or data.shape[2] < 2:
        raise ValueError(
            f"data must be (steps, batch, n + 1) token ids with n >= 1, got shape {data.shape}"
        )
    return _train(params, data, lr_peak, norm=norm, heads=heads, warmup=warmup)
