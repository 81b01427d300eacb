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

Each scheme is an object (``Post()``, ``Pre()``, ``Mix(switch_time)``, ``Peri()``, ``NGPT(alpha)``,
``Scaling()``: ``Scheme``, an equinox Module) that holds its parameters and its facts: its output,
speed, radial law, whether the radius is state (``radial``), its switch time. A model takes one as
its ``normalization`` field; the names of the table stay accepted everywhere
(``SelfAttention(normalization="ngpt", alpha=0.3)`` is ``SelfAttention(normalization=NGPT(0.3))``)
and are the flat values of the command line (``--normalization ngpt --alpha 0.3``) and a sweep. A
scheme of your own is a subclass registered with ``Scheme.register``.

The engine (``mf.simulate``) integrates $x_i = r_i \theta_i$ in $\mathbb R^d$ for the schemes with
a radius (``RADIAL``: Pre-, Mix-, Peri-LN): $\theta_i = x_i / \|x_i\|$ is on the sphere by
construction, the radius costs one norm per token ($O(n)$ beyond the field), and
``Trajectory.radius`` holds $r_i = \|x_i\|$ (``simulate(r0=)`` sets $r_i(0)$, default 1; the
paper's theorems on Pre-, Mix-, Peri-LN start from a standard Gaussian, $r_i(0) \approx \sqrt d$).
The others stay on the sphere as Post-LN does (LN-scaling with the speed $1/\sqrt{t+1}$).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._declare import Variant, param

__all__ = [
    "Scheme",
    "CollapseLaw",
    "Post",
    "Pre",
    "Mix",
    "Peri",
    "NGPT",
    "Scaling",
    "scheme_of",
    "as_scheme",
    "radial_names",
    "require_post",
    "NORMALIZATIONS",
    "RADIAL",
    "uses_radius",
    "output",
    "speed",
    "radial_velocity",
    "unit_output",
]


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


class CollapseLaw(NamedTuple):
    r"""How the last gap closes once the tokens form one cluster (the last column of Theorem 4.1 of
    Karagodin, Ge, Polyanskiy, Rigollet 2025; docs/normalization.md): $\log(1 - \rho_{\min})$ is
    affine in ``clock(t)`` with slope ``slope`` (SA, $Q = K = V = I$, $n \le e^\beta$).

    ``clock_name`` and ``statement`` say it in words; ``polynomial``: the clock is $\log t$ (the
    schemes with a radius, $r \sim t$); ``asymptotic``: a second clock the law tends to, or None
    (LN-scaling's $\sqrt t$ for $\sqrt{t + 1}$)."""

    slope: float
    clock: Callable[[Any], Any]
    clock_name: str
    statement: str
    polynomial: bool = False
    asymptotic: Callable[[Any], Any] | None = None
    asymptotic_name: str = ""


def _identity(t: Any) -> Any:
    return t


def _post_velocity(beta: float, n: int) -> float:
    return 2.0 / (math.exp(beta) + n - 1)


class Scheme(Variant):
    r"""A layer-norm placement as particle dynamics (the module's table): the base of the schemes.

    A scheme holds its parameters (fields declared with ``param``) and answers for its facts:
    ``output`` (a model's field from its attention output), ``speed`` and ``scale_velocity`` (the
    time factor of the tangent flow), ``radial`` (whether the tokens carry a radius, $x = r\theta$),
    ``radial_velocity`` (their $\dot x$), ``switch_at`` (a time the flow changes at, put among the
    step points), ``post_ln`` (the Post-LN flow itself: what the engines that run only it accept).
    The defaults are Post-LN's. A scheme of your own subclasses ``Scheme`` (or a scheme), sets
    ``name`` and registers (``Scheme.register``); it then runs in ``mf.simulate``, a sweep, the
    command line (``--normalization NAME``) and a phase diagram.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> @mf.normalization.Scheme.register
        ... class HalfSpeed(mf.normalization.Scheme):      # Post-LN at half speed
        ...     name = "half-speed-doc"
        ...     def speed(self, t, dtype=None):
        ...         return 0.5
        >>> m = mf.models.SelfAttention(1.0, normalization="half-speed-doc")
        >>> m.normalization, m.normalization.radial
        (HalfSpeed(), False)
        >>> mf.normalization.Scheme.unregister("half-speed-doc")
    """

    flat_name: ClassVar[str | None] = "normalization"
    what: ClassVar[str] = "normalisation scheme"
    #: The scheme's name in prose and figures ("Post-LN"); None: its ``name``.
    label: ClassVar[str | None] = None
    #: Facts a subclass does not inherit: it states them itself (a subclass of ``Post`` that
    #: changes the flow is not the Post-LN flow the fast paths run).
    own_facts: ClassVar[tuple[str, ...]] = ("post_ln",)
    #: Whether the tokens carry a radius ($x_i = r_i \theta_i$ integrated in $\mathbb R^d$;
    #: ``Trajectory.radius``; ``simulate(r0=)``).
    radial: ClassVar[bool] = False
    #: Whether the scheme is the Post-LN flow itself (the engines that run only it accept it).
    post_ln: ClassVar[bool] = False

    def output(self, A: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """The model's ``field`` from its attention output ``A`` (the base: ``A``)."""
        return A

    def speed(self, t: ArrayLike, dtype: Any = None) -> Array | float:
        """The time factor of the tangent flow at time ``t`` (the base: 1)."""
        return 1.0

    def scale_velocity(
        self, v: Float[Array, "*batch n d"], t: ArrayLike
    ) -> Float[Array, "*batch n d"]:
        """The velocity ``v`` at time ``t`` times the scheme's time factor (``speed``; ``v`` itself,
        no operation, where the speed is the constant 1)."""
        s = self.speed(t, v.dtype)
        if isinstance(s, (int, float)) and s == 1:
            return v
        return v * jnp.asarray(s, v.dtype)

    def scale_rate(self, rate: Any) -> Any:
        """A model's interaction rate after the scheme's output factor (the base: ``rate``)."""
        return rate

    def switch_at(self) -> Any:
        """The time the flow changes at (Mix-LN's ``switch_time``), or None: ``mf.simulate`` and the
        phase diagrams put it among the step points and raise the switch flag there, for the
        schemes with a radius (``radial``; the flag reaches ``radial_velocity``)."""
        return None

    def radial_velocity(
        self, x: Float[Array, "n d"], G: Float[Array, "n d"], *, switched: ArrayLike = True
    ) -> Float[Array, "n d"]:
        r"""$\dot x_i$ at $x_i = r_i \theta_i$ from the model's ``field`` $G$ at the directions:
        for a scheme with a radius (``radial``); the others refuse."""
        raise ValueError(
            f"normalization {self.name!r} has no radius; the schemes with one: {', '.join(radial_names())}"
        )

    def equiangular(
        self, t: float, G: float, r: float, c: float, norm: float
    ) -> tuple[float, float]:
        r"""$(\rho', r')$ of $n$ tokens at an equiangular configuration with a common radius $r$ (the
        reduction of ``mf.reproduce.dynamics.equiangular_system``; SA with $Q = K = V = I$): from
        $G = \rho'$ of Post-LN, $c = \langle\theta_i, A_i\rangle$ and $\|A_i\|$ (``norm``), the
        same for every token. The base class: the scheme states none (``NotImplementedError``)."""
        raise NotImplementedError(f"normalization {self.name!r} states no equiangular reduction")

    def after_switch(self) -> Scheme | None:
        """The scheme the flow continues as after ``switch_at`` (Mix-LN: Pre-LN), or None."""
        return None

    def initial_velocity(self, beta: float, n: int, r0: float) -> float:
        r"""$\gamma'(0)$ of Theorem 4.1 as printed: $\rho'(0)$ of $n$ orthogonal SA tokens ($Q = K = V = I$)
        with the common radius ``r0`` (the base class: the scheme states none, ``NotImplementedError``)."""
        raise NotImplementedError(f"normalization {self.name!r} states no initial velocity")

    def collapse_law(self) -> CollapseLaw:
        """The rate at which the last gap closes (``CollapseLaw``; the base class: the scheme states
        none, ``NotImplementedError``)."""
        raise NotImplementedError(f"normalization {self.name!r} states no collapse law")

    def require_post(self, what: str) -> None:
        """``ValueError`` unless this is the Post-LN flow (``post_ln``): for the engines that run only it."""
        if not self.post_ln:
            raise ValueError(
                f"{what} runs the Post-LN flow on the sphere; normalization={self.name!r} needs mf.simulate"
            )


@Scheme.builtin
class Post(Scheme):
    r"""Post-LN, $x \leftarrow \mathrm{LN}(x + h\,\mathrm{Attn}(x))$: the projected flow on the sphere
    (speed 1, no radius). The default of every model."""

    name: ClassVar[str | None] = "post"
    label: ClassVar[str | None] = "Post-LN"
    post_ln: ClassVar[bool] = True

    def equiangular(
        self, t: float, G: float, r: float, c: float, norm: float
    ) -> tuple[float, float]:
        r"""$(G, 0)$."""
        return G, 0.0

    def initial_velocity(self, beta: float, n: int, r0: float) -> float:
        r"""$2 / (e^\beta + n - 1)$."""
        return _post_velocity(beta, n)

    def collapse_law(self) -> CollapseLaw:
        r"""$1 - \rho \sim C e^{-2t}$."""
        return CollapseLaw(-2.0, _identity, "t", "-2 (Post-LN: 1 - rho ~ C e^(-2t))")


@Scheme.builtin
class Pre(Scheme):
    r"""Pre-LN, $x \leftarrow x + h\,\mathrm{Attn}(\mathrm{LN}(x))$: $\dot x_i = A_i$ (speed $r_i$)."""

    name: ClassVar[str | None] = "pre"
    label: ClassVar[str | None] = "Pre-LN"
    radial: ClassVar[bool] = True

    def radial_velocity(
        self, x: Float[Array, "n d"], G: Float[Array, "n d"], *, switched: ArrayLike = True
    ) -> Float[Array, "n d"]:
        r"""$\dot x_i = G_i$."""
        return G

    def equiangular(
        self, t: float, G: float, r: float, c: float, norm: float
    ) -> tuple[float, float]:
        r"""$(G / r, c)$: the speed $r$, the radial law $\langle\theta, A\rangle$."""
        return G / r, c

    def initial_velocity(self, beta: float, n: int, r0: float) -> float:
        r"""$2 / (r_0 (e^\beta + n - 1))$."""
        return _post_velocity(beta, n) / r0

    def collapse_law(self) -> CollapseLaw:
        r"""$1 - \rho \sim C t^{-2}$ ($r \sim t$)."""
        return _POLYNOMIAL


@Scheme.builtin
class Mix(Scheme):
    r"""Mix-LN: Post-LN for $t \le \tau$ (``switch_time``), Pre-LN after; the radius is state
    throughout (it stays until the switch)."""

    name: ClassVar[str | None] = "mix"
    label: ClassVar[str | None] = "Mix-LN"
    radial: ClassVar[bool] = True
    switch_time: Any = param(
        1.0,
        kind="float>0",
        optional=True,
        doc="Mix-LN switch time tau: Post-LN before, Pre-LN after (normalization = mix)",
    )

    def switch_at(self) -> Any:
        """``switch_time``."""
        return self.switch_time

    def radial_velocity(
        self, x: Float[Array, "n d"], G: Float[Array, "n d"], *, switched: ArrayLike = True
    ) -> Float[Array, "n d"]:
        r"""$r_i P_{\theta_i} G_i$ (Post-LN: the radius stays) until ``switched``, then $G_i$."""
        r = jnp.linalg.norm(x, axis=-1, keepdims=True)
        theta = x / r
        post = r * (G - jnp.sum(G * theta, axis=-1, keepdims=True) * theta)
        return jnp.where(switched, G, post)

    def equiangular(
        self, t: float, G: float, r: float, c: float, norm: float
    ) -> tuple[float, float]:
        r"""Post-LN's $(G, 0)$ for $t \le \tau$, then Pre-LN's $(G / r, c)$."""
        return (G / r, c) if t > self.switch_time else (G, 0.0)

    def after_switch(self) -> Scheme:
        """Pre-LN."""
        return Pre()

    def initial_velocity(self, beta: float, n: int, r0: float) -> float:
        r"""Post-LN's $2 / (e^\beta + n - 1)$ (before the switch)."""
        return _post_velocity(beta, n)

    def collapse_law(self) -> CollapseLaw:
        r"""Pre-LN's $1 - \rho \sim C t^{-2}$ (after the switch)."""
        return _POLYNOMIAL


@Scheme.builtin
class Peri(Scheme):
    r"""Peri-LN, $x \leftarrow x + h\,\mathrm{LN}(\mathrm{Attn}(\mathrm{LN}(x)))$: field $A / \|A\|$,
    $\dot x_i = $ field."""

    name: ClassVar[str | None] = "peri"
    label: ClassVar[str | None] = "Peri-LN"
    radial: ClassVar[bool] = True

    def output(self, A: Float[Array, "n d"]) -> Float[Array, "n d"]:
        r"""$A_i / \|A_i\|$."""
        return unit_output(A)

    def radial_velocity(
        self, x: Float[Array, "n d"], G: Float[Array, "n d"], *, switched: ArrayLike = True
    ) -> Float[Array, "n d"]:
        r"""$\dot x_i = G_i$."""
        return G

    def equiangular(
        self, t: float, G: float, r: float, c: float, norm: float
    ) -> tuple[float, float]:
        r"""$(G / (r \|A\|), c / \|A\|)$."""
        return G / (r * norm), c / norm

    def initial_velocity(self, beta: float, n: int, r0: float) -> float:
        r"""$2 / (r_0 \sqrt{e^{2\beta} + n - 1})$."""
        return 2.0 / (r0 * math.sqrt(math.exp(2 * beta) + n - 1))

    def collapse_law(self) -> CollapseLaw:
        r"""$1 - \rho \sim C t^{-2}$ ($r \sim t$)."""
        return _POLYNOMIAL


@Scheme.builtin
class NGPT(Scheme):
    r"""nGPT, $x \leftarrow \mathrm{LN}(x + h\alpha(\mathrm{LN}(\mathrm{Attn}(x)) - x))$: the Post-LN
    flow of the field $\alpha A / \|A\|$."""

    name: ClassVar[str | None] = "ngpt"
    label: ClassVar[str | None] = "nGPT"
    alpha: Any = param(
        0.2,
        kind="float>0",
        optional=True,
        doc="nGPT step factor alpha (normalization = ngpt; simuformer: 0.2)",
    )

    def output(self, A: Float[Array, "n d"]) -> Float[Array, "n d"]:
        r"""$\alpha A_i / \|A_i\|$."""
        return unit_output(A, self.alpha)

    def scale_rate(self, rate: Any) -> Any:
        """``rate * alpha`` (the output at unit norm, times alpha)."""
        xp = jnp if isinstance(self.alpha, jax.Array) else np
        return rate * xp.asarray(self.alpha)

    def equiangular(
        self, t: float, G: float, r: float, c: float, norm: float
    ) -> tuple[float, float]:
        r"""$(\alpha G / \|A\|, 0)$."""
        return float(self.alpha) * G / norm, 0.0

    def initial_velocity(self, beta: float, n: int, r0: float) -> float:
        r"""$2 \alpha / \sqrt{e^{2\beta} + n - 1}$."""
        return 2.0 * float(self.alpha) / math.sqrt(math.exp(2 * beta) + n - 1)

    def collapse_law(self) -> CollapseLaw:
        r"""$1 - \rho \sim C e^{-2 \alpha t}$."""
        a = float(self.alpha)
        return CollapseLaw(
            -2.0 * a,
            _identity,
            "t",
            f"-2 alpha = {-2.0 * a:g} (nGPT, alpha = {a:g}: C exp(-2 int alpha))",
        )


@Scheme.builtin
class Scaling(Scheme):
    r"""LN-scaling: the sublayer scaled by $1/\sqrt{\ell}$ at layer $\ell = t + 1$, speed
    $1 / \sqrt{t + 1}$ on the sphere."""

    name: ClassVar[str | None] = "scaling"
    label: ClassVar[str | None] = "LN-scaling"

    def speed(self, t: ArrayLike, dtype: Any = None) -> Array | float:
        r"""$1 / \sqrt{t + 1}$."""
        return 1.0 / jnp.sqrt(1.0 + jnp.asarray(t, dtype))

    def equiangular(
        self, t: float, G: float, r: float, c: float, norm: float
    ) -> tuple[float, float]:
        r"""$(G / \sqrt{t + 1}, 0)$."""
        return G / math.sqrt(t + 1.0), 0.0

    def initial_velocity(self, beta: float, n: int, r0: float) -> float:
        r"""Post-LN's $2 / (e^\beta + n - 1)$ (speed 1 at $t = 0$)."""
        return _post_velocity(beta, n)

    def collapse_law(self) -> CollapseLaw:
        r"""$1 - \rho \sim C e^{-4 \sqrt{t}}$: the speed $1 / \sqrt{t + 1}$ integrates to $2 \sqrt{t + 1}$."""
        return CollapseLaw(
            -4.0,
            lambda t: np.sqrt(t + 1.0),
            "sqrt(t + 1) (the speed 1/sqrt(t + 1) integrates to 2 sqrt(t + 1))",
            "-4 (LN-scaling: C e^(-4 sqrt t))",
            asymptotic=np.sqrt,
            asymptotic_name="sqrt(t)",
        )


#: The collapse law of the schemes with a radius ($r \sim t$, so $1 - \rho \sim C t^{-2}$).
_POLYNOMIAL = CollapseLaw(
    -2.0, np.log, "log t", "-2 (1 - rho ~ C t^-2 since r ~ t)", polynomial=True
)

#: The built-in schemes' names (``normalization=``; ``Scheme.names()`` adds the registered ones).
NORMALIZATIONS = Scheme.names()
#: The built-in schemes whose tokens carry a radius (``Trajectory.radius``; ``simulate(r0=)``).
RADIAL = tuple(n for n in NORMALIZATIONS if Scheme.lookup(n).radial)


def radial_names() -> tuple[str, ...]:
    """The registered schemes with a radius."""
    return tuple(n for n in Scheme.names() if Scheme.lookup(n).radial)


def scheme_of(model: Any) -> Scheme:
    """The normalisation scheme of ``model``: its ``normalization`` field, Post-LN for a model
    without one (a pair kernel with no layer norm, a model of your own).

    Example:
        >>> import meanfield as mf
        >>> scheme_of(mf.models.SelfAttention(1.0, normalization="mix", switch_time=2.0))
        Mix(switch_time=2.0)
    """
    scheme = getattr(model, "normalization", None)
    if scheme is None:
        return _POST
    return Scheme.coerce(scheme, type(model).__name__)  # a name: a model of another package


_POST = Post()


def as_scheme(scheme: Any, **params: Any) -> Scheme:
    """A scheme from a scheme or a registered name, with those of ``params`` it declares (the
    others ignored: a caller that passes every scheme's flat parameters, a phase diagram's).

    Example:
        >>> as_scheme("ngpt", alpha=0.5, switch_time=2.0), as_scheme("pre", alpha=0.5)
        (NGPT(alpha=0.5), Pre())
    """
    if isinstance(scheme, Scheme):
        return scheme
    member = Scheme.lookup(scheme)
    own = {f for f in getattr(member, "__dataclass_fields__", {})}
    return member(**{k: v for k, v in params.items() if k in own})  # type: ignore[return-value]


def uses_radius(model: Any) -> bool:
    """Whether ``model``'s tokens carry a radius (its scheme is ``radial``).

    Example:
        >>> import meanfield as mf
        >>> uses_radius(mf.models.SelfAttention(1.0)), uses_radius(mf.models.SelfAttention(1.0, normalization="pre"))
        (False, True)
    """
    return scheme_of(model).radial


def require_post(model: Any, what: str) -> None:
    """``ValueError`` unless ``model`` runs the Post-LN flow on the sphere (its scheme is ``post_ln``,
    its geometry the sphere): for the engines that implement that flow only (``what`` names it).

    Example:
        >>> import meanfield as mf
        >>> require_post(mf.kernels.USA(1.0, normalization="pre"), "simulate_long")
        Traceback (most recent call last):
        ...
        ValueError: simulate_long runs the Post-LN flow on the sphere; normalization='pre' needs mf.simulate
    """
    scheme_of(model).require_post(what)
    from .geometry import geometry_of

    geometry = geometry_of(model)
    if not geometry.on_sphere:
        raise ValueError(
            f"{what} runs the Post-LN flow on the sphere; geometry={geometry.name!r} needs mf.simulate"
        )


def output(scheme: Any, A: Float[Array, "n d"], alpha: ArrayLike = 0.2) -> Float[Array, "n d"]:
    r"""A model's ``field`` from its attention output $A$ under ``scheme`` (a ``Scheme`` or its name;
    ``alpha``: nGPT's, for a name): ``Scheme.output``.

    Example:
        >>> import jax.numpy as jnp
        >>> output("peri", jnp.array([[0.0, 2.0]])).tolist(), output("pre", jnp.array([[0.0, 2.0]])).tolist()
        ([[0.0, 1.0]], [[0.0, 2.0]])
    """
    return as_scheme(scheme, alpha=alpha).output(A)


def speed(scheme: Any, t: ArrayLike, dtype: Any = None) -> Array | float:
    r"""The time factor of the tangent flow (``Scheme.speed``): $1 / \sqrt{t + 1}$ for LN-scaling, else 1.

    Example:
        >>> float(speed("scaling", 3.0)), speed("post", 3.0)
        (0.5, 1.0)
    """
    return as_scheme(scheme).speed(t, dtype)


def radial_velocity(
    scheme: Any,
    x: Float[Array, "n d"],
    G: Float[Array, "n d"],
    *,
    switched: ArrayLike = True,
) -> Float[Array, "n d"]:
    r"""$\dot x_i$ of a scheme with a radius (``Scheme.radial_velocity``) at $x_i = r_i \theta_i$, from
    the model's ``field`` $G$ at the directions $\theta$: $G$ (Pre-LN; Peri-LN, whose field is
    $A / \|A\|$), and for Mix-LN $r_i P_{\theta_i} G_i$ (Post-LN: the radius stays) until
    ``switched``, then $G$. (``mf.simulate`` puts ``switch_time`` among its step points, so the
    switch falls on it exactly; a step point within ``dt / 1000`` of it is the switch point.)

    Example:
        >>> import jax.numpy as jnp
        >>> x, G = jnp.array([[2.0, 0.0]]), jnp.array([[1.0, 1.0]])
        >>> radial_velocity("pre", x, G).tolist(), radial_velocity("mix", x, G, switched=False).tolist()
        ([[1.0, 1.0]], [[0.0, 2.0]])
    """
    return as_scheme(scheme).radial_velocity(x, G, switched=switched)
