r"""Positional masks of the interaction: which tokens a token attends to, and with what weight.

Positions are the token order $i = 0, \dots, n - 1$ (the row of ``x``). A mask gives each pair a
weight $w_{ij} \ge 0$ ($0$: token $j$ is not admitted by token $i$):

* ``Causal(include_self=True)``: $w_{ij} = 1$ for $j \le i$ ($j < i$ without self);
* ``ALiBi(slope, include_self=True, normalized=False)``: $w_{ij} = e^{-(\text{slope}/n)(i - j)}$
  for $j \le i$ ($j < i$ without self), the linear biases of Press et al. as the lost-in-the-middle
  paper (Duerinckx, Geshkovski, Rossi, arXiv 2605.09213) writes them (``build_causal_weights``);
* ``Window(width, include_self=True, causal=False)``: $w_{ij} = 1$ for $|i - j| \le \text{width}$
  ($0 \le i - j \le \text{width}$ when ``causal``).

How a model uses the weights (``pair_weights``, ``log_weights``):

* unnormalised kernels ($F_i = \frac1n \sum_j \nabla_x h(z_i, z_j)$): the mask multiplies the pair
  weights, $F_i = \frac1n \sum_j w_{ij} \nabla_x h(z_i, z_j)$; with ``normalized=True`` the
  row-normalised mask replaces the $1/n$, $F_i = \sum_j \frac{w_{ij}}{\sum_k w_{ik}} \nabla_x h(z_i, z_j)$;
* softmax attention (``mf.models.SelfAttention``): $\log w_{ij}$ is added to the logits
  ($-\infty$ where $w_{ij} = 0$: the causal mask); the row normalisation changes nothing there.

A row that admits no token (the first token under ``Causal(include_self=False)``) has zero field.
Causal and ALiBi masks and row-normalised weights are not symmetric, so those dynamics are not
the gradient flow of a pair energy; meanfield defines no energy for any mask (a symmetric
``Window`` included): a masked kernel's ``has_energy`` is False and ``mf.energy`` refuses it
(``energy_problem``).

Example:
    >>> import meanfield as mf
    >>> mf.masks.Causal().weights(3).tolist()
    [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    >>> mf.masks.Causal(include_self=False, normalized=True).pair_weights(3).tolist()
    [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from ._checks import RealScalarLike, _error_if, check_scalar, is_concrete
from ._params import Param, check_float, check_value
from ._precision import einsum

__all__ = [
    "Mask",
    "Causal",
    "ALiBi",
    "Window",
    "MASKS",
    "MASK_PARAMS",
    "from_params",
    "to_params",
    "check_mask",
    "masked_mean",
    "energy_problem",
]

#: Accepted values of a model's ``mask`` option (the registry, ``--mask``, a sweep's ``mask`` key).
MASKS = ("none", "causal", "alibi", "window")


class Mask(eqx.Module):
    """Abstract base of the positional masks (``Causal``, ``ALiBi``, ``Window``).

    Subclasses define ``admitted`` (which pairs) and may override ``weights`` (the weights of the
    admitted pairs, 1 by default). ``include_self`` admits the pair ``(i, i)``; ``normalized``
    divides each row of the weights by its sum where the mask replaces the ``1/n`` of an
    unnormalised kernel (``pair_weights``).
    """

    include_self: bool = eqx.field(default=True, static=True, kw_only=True)
    normalized: bool = eqx.field(default=False, static=True, kw_only=True)

    #: The mask's name in the registry (``mask = NAME``).
    name: ClassVar[str] = ""

    def __check_init__(self) -> None:
        for flag in ("include_self", "normalized"):
            check_value(flag, "bool", getattr(self, flag))

    @abc.abstractmethod
    def admitted(self, n: int) -> Bool[np.ndarray, "n n"]:
        """``(n, n)`` booleans: token ``i`` (row) admits token ``j`` (column). Static (NumPy)."""

    def _offsets(self, n: int) -> np.ndarray:
        i = np.arange(n)
        return i[:, None] - i[None, :]  # i - j

    def _self_rule(self, keep: np.ndarray) -> np.ndarray:
        if not self.include_self:
            keep = keep & ~np.eye(keep.shape[0], dtype=bool)
        return keep

    def weights(self, n: int, dtype: Any = None) -> Float[Array, "n n"]:
        r"""The weights $w_{ij}$, ``(n, n)``: 1 on admitted pairs, 0 elsewhere (subclasses override).

        Example:
            >>> import meanfield as mf
            >>> mf.masks.Window(1).weights(3).tolist()
            [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]]
        """
        return jnp.asarray(self.admitted(n), dtype=dtype or jnp.result_type(float))

    def pair_weights(self, n: int, dtype: Any = None) -> Float[Array, "n n"]:
        r"""What replaces the $1/n$ of an unnormalised kernel: $w_{ij} / n$, or with ``normalized``
        $w_{ij} / \sum_k w_{ik}$ (a row with no admitted token stays 0).

        Example:
            >>> import meanfield as mf
            >>> mf.masks.Causal().pair_weights(2).tolist()
            [[0.5, 0.0], [0.5, 0.5]]
        """
        w = self.weights(n, dtype)
        if not self.normalized:
            return w / n
        total = jnp.sum(w, axis=-1, keepdims=True)
        return jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), 0.0)

    def log_weights(self, n: int, dtype: Any = None) -> Float[Array, "n n"]:
        r"""$\log w_{ij}$, ``(n, n)``, $-\infty$ on pairs not admitted: what softmax attention adds to
        its logits.

        Example:
            >>> import meanfield as mf
            >>> mf.masks.Causal().log_weights(2).tolist()
            [[0.0, -inf], [0.0, 0.0]]
        """
        w = self.weights(n, dtype)
        return jnp.where(w > 0, jnp.log(jnp.where(w > 0, w, 1.0)), -jnp.inf)

    def check_traced(self, x: Any) -> Any:
        """``x`` with the in-program checks of the mask's traced parameters attached
        (``equinox.error_if``, as ``mf.models.Model.check_traced``); none by default (``ALiBi``:
        its slope). Concrete values were checked on construction.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> x = jnp.eye(3)
            >>> bool(jnp.all(mf.masks.Causal().check_traced(x) == x))
            True
        """
        return x

    def empty_rows(self, n: int) -> Bool[np.ndarray, " n"]:
        """``(n,)`` booleans: rows that admit no token (their field is zero)."""
        return ~np.any(self.admitted(n), axis=-1)

    def params(self) -> dict[str, Any]:
        """The registry's mask parameters of this mask (``to_params``)."""
        return to_params(self)


class Causal(Mask):
    r"""The causal mask: token $i$ admits $j \le i$ ($j < i$ with ``include_self=False``).

    Example:
        >>> import meanfield as mf
        >>> mf.masks.Causal(include_self=False).admitted(3).astype(int).tolist()
        [[0, 0, 0], [1, 0, 0], [1, 1, 0]]
    """

    name = "causal"

    def admitted(self, n: int) -> Bool[np.ndarray, "n n"]:
        return self._self_rule(self._offsets(n) >= 0)


class ALiBi(Mask):
    r"""Causal linear biases: $w_{ij} = e^{-(\text{slope}/n)(i - j)}$ for $j \le i$ ($j < i$ without
    self), 0 above the diagonal. ``slope`` is traced (a sweep axis); ``slope = 0`` is ``Causal``.

    Example:
        >>> import meanfield as mf
        >>> w = mf.masks.ALiBi(2.0, include_self=False, normalized=True).pair_weights(3)
        >>> [round(v, 4) for v in w[2].tolist()]   # e^{-4/3}, e^{-2/3} normalised
        [0.3392, 0.6608, 0.0]
    """

    slope: RealScalarLike = 1.0

    name = "alibi"

    def __check_init__(self) -> None:
        super().__check_init__()
        check_scalar("slope", self.slope)
        if is_concrete(self.slope):
            check_float("slope", float(np.asarray(self.slope)), "float>=0")

    def check_traced(self, x: Any) -> Any:
        """``x`` with a traced ``slope`` checked in the program: ``>= 0`` and finite."""
        if is_concrete(self.slope):
            return x
        v = jnp.asarray(self.slope)
        bad = ~jnp.all(jnp.isfinite(v) & (v >= 0))
        return _error_if(x, bad, "slope must be >= 0 and finite; a traced slope was not")

    def admitted(self, n: int) -> Bool[np.ndarray, "n n"]:
        return self._self_rule(self._offsets(n) >= 0)

    def weights(self, n: int, dtype: Any = None) -> Float[Array, "n n"]:
        dtype = dtype or jnp.result_type(float)
        offsets = jnp.asarray(np.maximum(self._offsets(n), 0), dtype)
        decay = jnp.exp(-(jnp.asarray(self.slope, dtype) / n) * offsets)
        return jnp.where(jnp.asarray(self.admitted(n)), decay, 0.0).astype(dtype)


class Window(Mask):
    r"""A band: token $i$ admits $|i - j| \le \text{width}$ ($0 \le i - j \le \text{width}$ when
    ``causal``; without self, $j \ne i$). ``width`` is static (it shapes the program).

    Example:
        >>> import meanfield as mf
        >>> mf.masks.Window(1, causal=True).admitted(3).astype(int).tolist()
        [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    """

    width: int = eqx.field(default=1, static=True)
    causal: bool = eqx.field(default=False, static=True, kw_only=True)

    name = "window"

    def __check_init__(self) -> None:
        super().__check_init__()
        check_value("width", "int>=1", self.width)
        check_value("causal", "bool", self.causal)

    def admitted(self, n: int) -> Bool[np.ndarray, "n n"]:
        off = self._offsets(n)
        keep = (off >= 0) & (off <= self.width) if self.causal else np.abs(off) <= self.width
        return self._self_rule(keep)


_CLASSES: dict[str, type[Mask]] = {"causal": Causal, "alibi": ALiBi, "window": Window}

#: The registry's mask parameters, shared by every model that takes a mask (``mf.kernels.Kernel``,
#: ``mf.models.SelfAttention``): ``--mask``, ``--slope``, ``--width``, ``--include-self``,
#: ``--mask-normalized`` on the command line, keys of the same names in a sweep's ``[model]``.
#: A sweep spec records them only when they differ from their defaults (older stores keep
#: their hash).
MASK_PARAMS: tuple[Param, ...] = (
    Param("mask", "none", False, "choice", "positional mask of the interaction", MASKS, True),
    Param(
        "slope",
        1.0,
        True,
        "float>=0",
        "ALiBi slope: weights exp(-(slope/n)(i - j))",
        (),
        True,
        applies=(("mask", ("alibi",)),),
    ),
    Param(
        "width",
        1,
        False,
        "int>=1",
        "window half-width |i - j| <= width",
        (),
        True,
        applies=(("mask", ("window",)),),
    ),
    Param(
        "window_causal",
        False,
        False,
        "bool",
        "the window admits only earlier tokens, 0 <= i - j <= width",
        (),
        True,
        applies=(("mask", ("window",)),),
    ),
    Param(
        "include_self",
        True,
        False,
        "bool",
        "the mask admits each token itself",
        (),
        True,
        applies=(("mask", ("causal", "alibi", "window")),),
    ),
    Param(
        "mask_normalized",
        False,
        False,
        "bool",
        "row-normalised mask weights replace the 1/n of unnormalised kernels",
        (),
        True,
        applies=(("mask", ("causal", "alibi", "window")),),
    ),
)


def from_params(P: Mapping[str, Any]) -> Mask | None:
    """The mask of the registry's values ``P`` (``MASK_PARAMS``; missing keys take their defaults),
    None for ``mask = "none"``.

    Example:
        >>> import meanfield as mf
        >>> mf.masks.from_params({"mask": "alibi", "slope": 2.0})
        ALiBi(slope=2.0)
    """
    values = {p.name: P.get(p.name, p.default) for p in MASK_PARAMS}
    kind = check_value("mask", "choice", values["mask"], MASKS)
    if kind == "none":
        return None
    common = {"include_self": values["include_self"], "normalized": values["mask_normalized"]}
    if kind == "alibi":
        return ALiBi(values["slope"], **common)
    if kind == "window":
        return Window(values["width"], causal=values["window_causal"], **common)
    return Causal(**common)


def to_params(mask: Mask | None) -> dict[str, Any]:
    """The registry's values (``MASK_PARAMS``) of ``mask`` (``from_params`` inverted).

    Example:
        >>> import meanfield as mf
        >>> mf.masks.to_params(mf.masks.Window(3))["width"]
        3
    """
    out = {p.name: p.default for p in MASK_PARAMS}
    if mask is None:
        return out
    out.update(mask=mask.name, include_self=mask.include_self, mask_normalized=mask.normalized)
    if isinstance(mask, ALiBi):
        out["slope"] = mask.slope
    if isinstance(mask, Window):
        out["width"] = mask.width
        out["window_causal"] = mask.causal
    return out


def energy_problem(mask: Mask | None) -> str | None:
    """Why a kernel with ``mask`` has no pair energy, or None (no mask): the one reason of a kernel's
    ``refuse_masked_energy`` (``mf.energy``, ``has_energy``) and of a sweep spec's refusal of the
    energy's observables and ``time.early_stop`` with ``model.mask``.

    Example:
        >>> import meanfield as mf
        >>> print(mf.masks.energy_problem(mf.masks.Causal()))
        meanfield defines no pair energy for a masked interaction (causal and ALiBi masks and row-normalised weights are not symmetric: no gradient flow)
        >>> mf.masks.energy_problem(mf.masks.from_params({"mask": "none"})) is None
        True
    """
    if mask is None:
        return None
    return (
        "meanfield defines no pair energy for a masked interaction (causal and ALiBi masks and "
        "row-normalised weights are not symmetric: no gradient flow)"
    )


def check_mask(mask: object) -> Mask | None:
    """``mask`` if it is None or a ``Mask``, else a ``TypeError`` naming what is accepted."""
    if mask is None or isinstance(mask, Mask):
        return mask
    raise TypeError(
        f"mask must be None or a mask from mf.masks (Causal, ALiBi, Window), got {mask!r}"
    )


def masked_mean(
    weights: Float[ArrayLike, "n n"], values: Float[Array, "n n d"]
) -> Float[Array, "n d"]:
    r"""$\sum_j w_{ij} v_{ij}$ for pair values ``(n, n, d)`` (the masked pairwise field)."""
    return einsum("ij,ijd->id", jnp.asarray(weights, values.dtype), values)
