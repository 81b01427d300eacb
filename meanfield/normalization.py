r"""Layer-norm placements as particle dynamics: the token's speed regulated by its radius.

Karagodin, Ge, Polyanskiy, Rigollet, "Normalization in Attention Dynamics" (NeurIPS 2025,
arXiv 2510.22026) write each token as $x_i = r_i \theta_i$, direction $\theta_i \in S^{d-1}$ and
radius $r_i > 0$. The attention output is computed on the directions,
$A_i = \sum_j \operatorname{softmax}_j(\beta \langle Q\theta_i, K\theta_j\rangle) V \theta_j$, and every
scheme is the same equation with its own speed factor $s_i$ (the paper's equation (NA) and its
Table 2):

$$\dot\theta_i = \frac{1}{s_i(t)} P_{\theta_i} A_i, \qquad P_\theta = I - \theta\theta^\top.$$

| ``normalization`` | layer (step $h$) | $s_i(t)$ | $\dot r_i$ |
|---|---|---|---|
| ``"post"`` (Post-LN) | $x \leftarrow \mathrm{LN}(x + h\,\mathrm{Attn}(x))$ | $1$ | $0$ |
| ``"pre"`` (Pre-LN) | $x \leftarrow x + h\,\mathrm{Attn}(\mathrm{LN}(x))$ | $r_i$ | $\langle\theta_i, A_i\rangle$ |
| ``"mix"`` (Mix-LN) | Post-LN for $t \le \tau$ (``switch``), Pre-LN after | $1$, then $r_i$ | $0$, then $\langle\theta_i, A_i\rangle$ |
| ``"peri"`` (Peri-LN) | $x \leftarrow x + h\,\mathrm{LN}(\mathrm{Attn}(\mathrm{LN}(x)))$ | $r_i \|A_i\|$ | $\langle\theta_i, A_i\rangle / \|A_i\|$ |
| ``"ngpt"`` (nGPT) | $x \leftarrow \mathrm{LN}(x + h\alpha(\mathrm{LN}(\mathrm{Attn}(x)) - x))$ | $\|A_i\| / \alpha$ | $0$ |
| ``"scaling"`` (LN-scaling) | the sublayer scaled by $1/\sqrt{\ell}$ at layer $\ell = t + 1$ | $\sqrt{t + 1}$ | $0$ |

($\mathrm{LN}(y) = y / \|y\|$.) In $x$: Pre-LN is $\dot x_i = A_i$ and Peri-LN $\dot x_i = A_i / \|A_i\|$.
A model's ``field`` is the attention output after the scheme's own normalisation of it
(``output``: $\alpha A / \|A\|$ for nGPT, $A / \|A\|$ for Peri-LN, $A$ otherwise), so that
Pre- and Peri-LN are both $\dot x_i = $ ``field``, and nGPT the Post-LN flow of its field.

The engine (``mf.simulate``) integrates $x_i = r_i \theta_i$ in $\mathbb R^d$ for the schemes with
a radius (``RADIAL``: Pre-, Mix-, Peri-LN): $\theta_i = x_i / \|x_i\|$ is on the sphere by
construction, the radius costs one norm per token ($O(n)$ beyond the field), and
``Trajectory.radius`` holds $r_i = \|x_i\|$ (``simulate(r0=)`` sets $r_i(0)$, default 1; the
paper's theorems on Pre-, Mix-, Peri-LN start from a standard Gaussian, $r_i(0) \approx \sqrt d$).
The others stay on the sphere as Post-LN does (LN-scaling with the speed $1/\sqrt{t+1}$).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

__all__ = [
    "require_post",
    "NORMALIZATIONS",
    "RADIAL",
    "uses_radius",
    "output",
    "speed",
    "radial_velocity",
    "unit_output",
]

#: ``normalization=`` of ``mf.models.SelfAttention`` and the exp kernels (``mf.kernels.USA``, ...).
NORMALIZATIONS = ("post", "pre", "mix", "peri", "ngpt", "scaling")
#: The schemes whose tokens carry a radius (``Trajectory.radius``; ``simulate(r0=)``).
RADIAL = ("pre", "mix", "peri")


def uses_radius(model: Any) -> bool:
    """Whether ``model``'s tokens carry a radius (its ``normalization`` is one of ``RADIAL``).

    Example:
        >>> import meanfield as mf
        >>> uses_radius(mf.models.SelfAttention(1.0)), uses_radius(mf.models.SelfAttention(1.0, normalization="pre"))
        (False, True)
    """
    return getattr(model, "normalization", "post") in RADIAL


def require_post(model: Any, what: str) -> None:
    """``ValueError`` unless ``model`` runs the Post-LN flow on the sphere (``normalization="post"``,
    no ``geometry="euclidean"``): for the engines that implement that flow only (``what`` names it).

    Example:
        >>> import meanfield as mf
        >>> require_post(mf.kernels.USA(1.0, normalization="pre"), "simulate_long")
        Traceback (most recent call last):
        ...
        ValueError: simulate_long runs the Post-LN flow on the sphere; normalization='pre' needs mf.simulate
    """
    scheme = getattr(model, "normalization", "post")
    if scheme != "post":
        raise ValueError(
            f"{what} runs the Post-LN flow on the sphere; normalization={scheme!r} needs mf.simulate"
        )
    if getattr(model, "geometry", "sphere") != "sphere":
        raise ValueError(
            f"{what} runs the Post-LN flow on the sphere; geometry={model.geometry!r} needs mf.simulate"
        )


def unit_output(F: Float[Array, "n d"], scale: ArrayLike = 1.0) -> Float[Array, "n d"]:
    r"""$\text{scale}\; F_i / \|F_i\|$ row by row, 0 where $F_i = 0$ (nGPT's and Peri-LN's
    normalised attention output).

    Example:
        >>> import jax.numpy as jnp
        >>> unit_output(jnp.array([[0.0, 2.0], [0.0, 0.0]])).tolist()
        [[0.0, 1.0], [0.0, 0.0]]
    """
    norm = jnp.linalg.norm(F, axis=-1, keepdims=True)
    safe = jnp.where(norm > 0, norm, 1.0)
    return jnp.where(norm > 0, jnp.asarray(scale, F.dtype) * F / safe, 0.0)


def output(scheme: str, A: Float[Array, "n d"], alpha: ArrayLike = 0.2) -> Float[Array, "n d"]:
    r"""A model's ``field`` from its attention output $A$: $\alpha A / \|A\|$ (``"ngpt"``),
    $A / \|A\|$ (``"peri"``), $A$ (the others).

    Example:
        >>> import jax.numpy as jnp
        >>> output("peri", jnp.array([[0.0, 2.0]])).tolist(), output("pre", jnp.array([[0.0, 2.0]])).tolist()
        ([[0.0, 1.0]], [[0.0, 2.0]])
    """
    if scheme == "ngpt":
        return unit_output(A, alpha)
    if scheme == "peri":
        return unit_output(A)
    return A


def speed(scheme: str, t: ArrayLike, dtype: Any = None) -> Array | float:
    r"""The time factor of the tangent flow: $1 / \sqrt{t + 1}$ for LN-scaling, else 1.

    Example:
        >>> float(speed("scaling", 3.0)), speed("post", 3.0)
        (0.5, 1.0)
    """
    if scheme == "scaling":
        return 1.0 / jnp.sqrt(1.0 + jnp.asarray(t, dtype))
    return 1.0


def radial_velocity(
    scheme: str,
    x: Float[Array, "n d"],
    G: Float[Array, "n d"],
    *,
    switched: ArrayLike = True,
) -> Float[Array, "n d"]:
    r"""$\dot x_i$ of a scheme with a radius (``RADIAL``) at $x_i = r_i \theta_i$, from the model's
    ``field`` $G$ at the directions $\theta$: $G$ (Pre-LN; Peri-LN, whose field is $A / \|A\|$), and
    for Mix-LN $r_i P_{\theta_i} G_i$ (Post-LN: the radius stays) until ``switched``, then $G$.
    (``mf.simulate`` puts ``switch_time`` among its step points, so the switch falls on it
    exactly; a step point within ``dt / 1000`` of it is the switch point.)

    Example:
        >>> import jax.numpy as jnp
        >>> x, G = jnp.array([[2.0, 0.0]]), jnp.array([[1.0, 1.0]])
        >>> radial_velocity("pre", x, G).tolist(), radial_velocity("mix", x, G, switched=False).tolist()
        ([[1.0, 1.0]], [[0.0, 2.0]])
    """
    if scheme in ("pre", "peri"):
        return G
    if scheme == "mix":
        r = jnp.linalg.norm(x, axis=-1, keepdims=True)
        theta = x / r
        post = r * (G - jnp.sum(G * theta, axis=-1, keepdims=True) * theta)
        return jnp.where(switched, G, post)
    raise ValueError(
        f"normalization {scheme!r} has no radius; the schemes with one: {', '.join(RADIAL)}"
    )
