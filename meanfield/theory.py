r"""Closed forms and limit laws from the papers (docs/math/kernels.md, docs/math/attention.md).

Section 1 (USA-AV particle dynamics) first: the maximal energy $e^\beta / (2\beta)$ of the
exp-gauge kernels, the great circle, the RoPE latitude circle. The long-context attention laws
(docs/math/attention.md) follow: a fixed query $q$, keys $x_j$ i.i.d. with density $\rho$ on
$S^{d-1}$, distances $T_j = 1 - \langle q, x_j\rangle$, weights
$A_j = e^{-\beta T_j} / Z_n$, governed by the small-$T$ tail
$P(T < t) \sim C(q)\, t^{1/\alpha}$ with $\alpha = 2/(d-1)$. Last, the noisy Kuramoto (Lohe) model
(docs/math/noise.md, The Kuramoto model).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammainc, gammaincc
from jaxtyping import Array, ArrayLike, DTypeLike, Float, PRNGKeyArray

from ._checks import check_finite, check_int, check_nonnegative, check_plane, check_positive
from ._precision import dot, matmul

__all__ = [
    "max_energy",
    "great_circle_gap",
    "great_circle_energy",
    "latitude_height",
    # Section 2: long-context attention
    "attention_alpha",
    "critical_beta",
    "tail_constant",
    "window_size",
    "subcritical_profile",
    "cumulative_profile",
    "partition_function",
    "partition_function_uniform",
    "critical_weights",
    "drift",
    # Section 2: attention outputs (paper Sec. 4)
    "supercritical_scale",
    "supercritical_radial_cdf",
    "sample_supercritical_output",
    "sample_critical_output",
    "fluctuation_constant",
    "fluctuation_covariance",
    "fluctuation_scale",
    "fluctuation_beta",
    "drift_fluctuation_tau",
    # noise: the noisy Kuramoto / Lohe model
    "kuramoto_threshold",
    "kuramoto_order_parameter",
]


# --------------------------------------------------------------------------
# Section 1: USA-AV
# --------------------------------------------------------------------------


def max_energy(beta: ArrayLike, *, rescaled: bool = False) -> Float[Array, "..."]:
    r"""Maximal energy of every exp-gauge kernel (USA, RoPE, phase field, gauge, prompt).

    $h \le e^\beta / \beta$, so $E = \frac{1}{2 n^2} \sum_{i,j} h(z_i, z_j) \le e^\beta / (2 \beta)$,
    attained by the maximisers (Dirac in the gauge frame), for any finite $n$.
    With ``rescaled=True`` (the time-rescaled kernels, $h e^{-\beta}$) it is $1 / (2 \beta)$.

    Args:
        beta: inverse temperature, ``> 0`` (scalar or array).
        rescaled: the ``e^{-beta}``-rescaled kernels.

    Returns:
        $E_{\max}$, same shape as ``beta``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.theory.max_energy(1.0)), 4)   # e / 2
        1.3591
    """
    check_positive("beta", beta)
    beta = jnp.asarray(beta)
    if rescaled:
        return 1.0 / (2.0 * beta)
    return jnp.exp(beta) / (2.0 * beta)


def great_circle_gap(n: Any) -> float:
    r"""$G_x$ of $n$ equally spaced points on a great circle: $1 + 1/(n-1)$.

    ($\sum_{i,j} \langle x_i, x_j\rangle = 0$, so $G_x = 1 + n/(n(n-1))$.)

    Args:
        n: number of points, ``n >= 2``.

    Returns:
        float $1 + 1/(n-1)$.

    Example:
        >>> import meanfield as mf
        >>> mf.theory.great_circle_gap(5)
        1.25
    """
    n = check_int("n", n, minimum=2)
    return 1.0 + 1.0 / (n - 1)


def great_circle_energy(m: Any = 1) -> float:
    r"""Maximal energy of the Toeplitz kernel $\cos(2 \pi m (t-s)) \langle x, y\rangle$: $1/4$.

    Attained by $x(s) = \cos(2 \pi m s)\, a + \sin(2 \pi m s)\, b$ (the uniform great circle
    traversed $m$ times): $E = \frac12 \operatorname{mean}_{s,t} \cos^2(2 \pi m (t-s)) = 1/4$.

    Args:
        m: the Toeplitz frequency, ``m >= 1``.

    Returns:
        ``0.25`` (independent of ``m``).

    Example:
        >>> import meanfield as mf
        >>> mf.theory.great_circle_energy(2)
        0.25
    """
    check_int("m", m, minimum=1)
    return 0.25


def latitude_height(u: ArrayLike, plane: Any = (0, 1)) -> Float[Array, "..."]:
    r"""Height of the RoPE latitude circle $x(s) = R_{-\omega s} u$: $\|P_{E^\perp} u\|$, $E = \operatorname{span}(e_a, e_b)$.

    A rotation in $\operatorname{span}(e_a, e_b)$ fixes the orthogonal complement, so the
    circle lies at $\|P_{E^\perp} u\|$ from the plane $E$: the norm of the
    components of $u$ outside ``plane``.

    Args:
        u: ``(..., d)`` unit vector(s).
        plane: the rotation plane ``(a, b)``.

    Returns:
        array of shape ``u.shape[:-1]``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> round(float(mf.theory.latitude_height(jnp.array([0.6, 0.0, 0.8]))), 4)
        0.8
    """
    u = jnp.asarray(u)
    a, b = check_plane(plane, u.shape[-1])
    mask = jnp.ones(u.shape[-1], dtype=bool).at[a].set(False).at[b].set(False)
    return jnp.sqrt(jnp.sum(jnp.where(mask, u * u, 0.0), axis=-1))


# --------------------------------------------------------------------------
# Section 2: long-context attention (docs/math/attention.md)
# --------------------------------------------------------------------------
# Fixed query q, keys x_j i.i.d. rho on S^{d-1}, D2Q T_j = 1 - <q, x_j>,
# A_j = exp(-beta T_j) / Z_n.  Everything is governed by the small-T tail
# P(T < t) ~ C(q) t^{1/alpha}, alpha = 2 / (d - 1).


def attention_alpha(d: Any) -> float:
    r"""Tail exponent $\alpha = 2 / (d - 1)$ of $P(T < t) \sim C t^{1/\alpha}$ on $S^{d-1}$.

    Args:
        d: ambient dimension, ``d >= 2``.

    Returns:
        $\alpha$ as a float.

    Example:
        >>> import meanfield as mf
        >>> mf.theory.attention_alpha(5)
        0.5
    """
    d = check_int("d", d, minimum=2)
    return 2.0 / (d - 1)


def critical_beta(n: ArrayLike, d: Any) -> Float[Array, "..."]:
    r"""Critical inverse temperature $\beta^*_n = n^\alpha = n^{2/(d-1)}$.

    Below it ($\beta \ll n^\alpha$) the softmax averages over a diverging window,
    at it finitely many keys share the mass (Poisson limit), above it the
    nearest key takes everything (paper Sec. 3).

    Args:
        n: context length(s), ``> 0`` (scalar or array).
        d: ambient dimension, ``d >= 2``.

    Returns:
        $n^\alpha$, same shape as ``n``.

    Example:
        >>> import meanfield as mf
        >>> float(mf.theory.critical_beta(10_000, 5))
        100.0
    """
    alpha = attention_alpha(d)
    check_positive("n", n)
    return jnp.asarray(n, dtype=jnp.result_type(float)) ** alpha


def tail_constant(d: Any, density: ArrayLike | None = None) -> float | Float[Array, "..."]:
    r"""Tail constant $C(q)$ of $P(T < t) \sim C(q)\, t^{1/\alpha}$.

    $C(q) = \rho(q)\, \omega_{d-1}\, 2^{(d-1)/2}$, with $\omega_{d-1} = \pi^{(d-1)/2} / \Gamma((d+1)/2)$
    the volume of the unit $(d-1)$-ball. With ``density=None`` the keys are
    uniform: $\rho = 1 / |S^{d-1}| = \Gamma(d/2) / (2 \pi^{d/2})$ ($d = 5$: $C = 0.75$).

    Args:
        d: ambient dimension, ``d >= 2``.
        density: optional value $\rho(q) > 0$ of the key density (w.r.t. surface
            measure) at the query; scalar or array.

    Returns:
        $C(q)$ (a float for uniform keys, an array otherwise).

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.theory.tail_constant(5)), 12)
        0.75
    """
    d = check_int("d", d, minimum=2)
    ball = math.pi ** ((d - 1) / 2) / math.gamma((d + 1) / 2)
    factor = ball * 2.0 ** ((d - 1) / 2)
    if density is None:
        return factor * math.gamma(d / 2) / (2.0 * math.pi ** (d / 2))
    check_positive("density", density)
    return jnp.asarray(density) * factor


def window_size(
    n: ArrayLike, beta: ArrayLike, d: Any, density: ArrayLike | None = None
) -> Float[Array, "..."]:
    r"""Active softmax window $m_n(q) = C(q)\, n\, \beta^{-1/\alpha}$.

    The expected number of keys with $T_j < 1/\beta$ (up to $\Gamma$ factors):
    the number of keys sharing the attention mass in the subcritical regime.

    Args:
        n: context length(s), ``> 0``.
        beta: inverse temperature(s), ``> 0``.
        d: ambient dimension, ``d >= 2``.
        density: optional key density ``rho(q)`` at the query (default uniform).

    Returns:
        $m_n(q)$, broadcast shape of ``n``, ``beta`` and ``density``.

    Example:
        >>> import meanfield as mf
        >>> float(mf.theory.window_size(1000, 4.0, 5))  # 0.75 * 1000 / 16
        46.875
    """
    alpha = attention_alpha(d)
    check_positive("n", n)
    check_positive("beta", beta)
    C = tail_constant(d, density)
    return (
        C
        * jnp.asarray(n, dtype=jnp.result_type(float))
        * jnp.asarray(beta, dtype=jnp.result_type(float)) ** (-1.0 / alpha)
    )


def subcritical_profile(x: ArrayLike, d: Any) -> Float[Array, "..."]:
    r"""Subcritical ordered-weight profile $A_{(k)} / A_{(1)} \to e^{-x^\alpha}$, $x = k / m_n$.

    Args:
        x: rank(s) in window units, ``>= 0``.
        d: ambient dimension, ``d >= 2``.

    Returns:
        $e^{-x^\alpha}$, same shape as ``x``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.theory.subcritical_profile(4.0, 5)), 6)  # exp(-2)
        0.135335
    """
    alpha = attention_alpha(d)
    check_nonnegative("x", x)
    return jnp.exp(-(jnp.asarray(x, dtype=jnp.result_type(float)) ** alpha))


def cumulative_profile(x: ArrayLike, d: Any) -> Float[Array, "..."]:
    r"""Subcritical cumulative weight $\sum_{i \le x m_n} A_{(i)} \to P(1/\alpha, x^\alpha)$.

    $P$ is the regularised lower incomplete gamma function; it is the
    normalised integral of $e^{-y^\alpha}$:
    $\int_0^x e^{-y^\alpha}\, dy \,/\, \Gamma(1/\alpha + 1)$.

    Args:
        x: rank(s) in window units, ``>= 0``.
        d: ambient dimension, ``d >= 2``.

    Returns:
        $P(1/\alpha, x^\alpha)$ in $[0, 1]$, same shape as ``x``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.theory.cumulative_profile(1.0, 3)), 4)  # 1 - exp(-1)
        0.6321
    """
    alpha = attention_alpha(d)
    check_nonnegative("x", x)
    x = jnp.asarray(x, dtype=jnp.result_type(float))
    return gammainc(1.0 / alpha, x**alpha)


def partition_function(
    n: ArrayLike, beta: ArrayLike, d: Any, density: ArrayLike | None = None
) -> Float[Array, "..."]:
    r"""Subcritical mean partition function $E[Z_n] \sim C\, n\, \beta^{-1/\alpha}\, \Gamma(1/\alpha + 1)$.

    $Z_n = \sum_j e^{-\beta T_j}$; the asymptotic holds for $\beta \to \infty$
    (relative corrections $O(1/\beta)$; see ``partition_function_uniform``
    for the exact mean under uniform keys).

    Args:
        n: context length(s), ``> 0``.
        beta: inverse temperature(s), ``> 0``.
        d: ambient dimension, ``d >= 2``.
        density: optional key density ``rho(q)`` at the query (default uniform).

    Returns:
        the asymptotic $E[Z_n]$, broadcast shape of the arguments.

    Example:
        >>> import meanfield as mf
        >>> float(mf.theory.partition_function(1000, 10.0, 5))  # 0.75 * 1000 / 100 * 2
        15.0
    """
    alpha = attention_alpha(d)
    return window_size(n, beta, d, density) * math.gamma(1.0 / alpha + 1.0)


def partition_function_uniform(n: ArrayLike, beta: ArrayLike, d: Any) -> np.ndarray | np.float64:
    r"""Exact $E[Z_n] = n\, E[e^{-\beta T}]$ for keys uniform on $S^{d-1}$.

    $\langle q, x\rangle$ has density $\propto (1 - u^2)^{(d-3)/2}$ on $[-1, 1]$, so

    $$E[e^{-\beta T}] = e^{-\beta}\, \Gamma(d/2)\, (2/\beta)^{d/2 - 1} I_{d/2-1}(\beta)$$

    ($I_\nu$ the modified Bessel function), evaluated with the exponentially scaled
    ``scipy.special.ive`` so that large $\beta$ does not overflow. Not traceable
    (NumPy/SciPy); $\beta = 0$ gives $n$.

    Args:
        n: context length(s), ``> 0``.
        beta: inverse temperature(s), ``>= 0``.
        d: ambient dimension, ``d >= 2``.

    Returns:
        NumPy array $E[Z_n]$, broadcast shape of ``n`` and ``beta`` (a ``np.float64`` for
        scalar arguments).

    Example:
        >>> import meanfield as mf
        >>> float(mf.theory.partition_function_uniform(1, 0.0, 3))
        1.0
        >>> round(float(mf.theory.partition_function_uniform(1, 2.0, 3)), 6)  # (1 - e^-4) / 4
        0.245421
    """
    from scipy.special import ive  # local: keeps scipy off the import path of jax users

    d = check_int("d", d, minimum=2)
    check_positive("n", n)
    check_nonnegative("beta", beta)
    n = np.asarray(n, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    nu = d / 2 - 1
    b = np.where(beta > 0, beta, 1.0)
    # ive(nu, b) = I_nu(b) e^{-b}; Gamma(d/2) (2/b)^nu I_nu(b) -> 1 as b -> 0.
    mean = np.where(beta > 0, math.gamma(d / 2) * (2.0 / b) ** nu * ive(nu, b), 1.0)
    return n * mean


def critical_weights(
    key: PRNGKeyArray,
    gamma: ArrayLike,
    d: Any,
    k: Any,
    num: Any,
    *,
    density: ArrayLike | None = None,
    terms: Any = 512,
    batch_size: Any = 1024,
) -> Float[Array, "num k"]:
    r"""Samples of the critical limit law $(W_1, \dots, W_k)$ of the ordered weights.

    At $\beta = \gamma n^\alpha$ the rescaled distances $\beta T_{(l)}$ converge to a
    Poisson process with mean measure $c\, y^{1/\alpha}$, $c = C \gamma^{-1/\alpha}$:
    $y_l = (\Gamma_l / c)^\alpha$ with $\Gamma_l$ partial sums of i.i.d. Exp(1),
    and $W_k = e^{-y_k} / \sum_l e^{-y_l}$ (paper Thm 3.2, docs/math/attention.md, Critical regime).

    The first ``terms`` points are sampled exactly; the rest of the denominator
    is replaced by its conditional mean
    $\sum_{y > y_L} e^{-y} \to c\, \Gamma(1/\alpha + 1)\, Q(1/\alpha, y_L)$ ($Q$ the regularised
    upper incomplete gamma), whose relative fluctuation is below 1% for the defaults.

    Args:
        key: a ``jax.random`` key.
        gamma: critical ratio $\beta / n^\alpha > 0$ (traceable scalar).
        d: ambient dimension, ``d >= 2``.
        k: number of leading weights returned, ``1 <= k <= terms``.
        num: number of samples.
        density: optional key density $\rho(q)$ at the query (uniform if None).
        terms: number of Poisson points sampled exactly.
        batch_size: samples drawn per vectorised batch (bounds memory).

    Returns:
        ``(num, k)`` array, rows decreasing, $W_1 + \dots + W_k \le 1$.

    Example:
        >>> import jax, meanfield as mf
        >>> W = mf.theory.critical_weights(jax.random.key(0), 1.0, 5, 2, 4000)
        >>> bool(abs(W[:, 0].mean() - 0.277) < 0.03)
        True
    """
    alpha = attention_alpha(d)
    k = check_int("k", k, minimum=1)
    num = check_int("num", num, minimum=1)
    terms = check_int("terms", terms, minimum=k)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    check_positive("gamma", gamma)
    C = tail_constant(d, density)
    return _critical_weights(
        key, jnp.asarray(gamma), jnp.asarray(C), alpha, k, num, terms, min(batch_size, num)
    )


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6, 7))
def _critical_weights(
    key: PRNGKeyArray,
    gamma: Array,
    C: Array,
    alpha: float,
    k: int,
    num: int,
    terms: int,
    batch_size: int,
) -> Float[Array, "num k"]:
    dtype = jnp.result_type(float)
    c = C.astype(dtype) * gamma.astype(dtype) ** (-1.0 / alpha)
    log_tail_scale = jnp.log(c) + math.lgamma(1.0 / alpha + 1.0)
    s = 1.0 / alpha  # = (d - 1)/2

    def log_q_shifted(y_last: Float[Array, ""], y_first: Float[Array, ""]) -> Float[Array, ""]:
        # log(Q(s, y_L) e^{y_1}); for integer s (odd d) Q(s, y) = e^{-y} sum_{j<s} y^j / j!
        # (closed form: no overflow of e^{y_1}, cheap to compile), else jax's gammaincc.
        if float(s).is_integer():
            terms_ = sum(y_last**j / math.factorial(j) for j in range(int(s)))
            return jnp.log(terms_) - (y_last - y_first)
        return jnp.log(gammaincc(s, y_last)) + y_first

    def one(sample_key: PRNGKeyArray) -> Float[Array, " k"]:
        gaps = jax.random.exponential(sample_key, (terms,), dtype=dtype)
        y = (jnp.cumsum(gaps) / c) ** alpha
        # shift by y_1: W_k = exp(-(y_k - y_1)) / (sum_l exp(-(y_l - y_1)) + tail e^{y_1})
        head = jnp.exp(-(y - y[0]))
        tail = jnp.exp(log_tail_scale + log_q_shifted(y[-1], y[0]))
        return head[:k] / (jnp.sum(head) + tail)

    keys = jax.random.split(key, num)
    return jax.lax.map(one, keys, batch_size=batch_size)


def drift(q: ArrayLike, log_density: Any) -> Float[Array, " d"]:
    r"""Subcritical drift $Y(q) = \nabla_S \log \rho(q) - \frac{d-1}{2} q$ (paper Thm 4.3).

    $\beta Y_n(q) \to Y(q)$ when $\beta^{1+\alpha} n^{-\alpha} \to 0$. The
    spherical gradient is the tangent projection $P_q \nabla \log \rho(q)$ of the
    ambient gradient of ``log_density`` (computed by autodiff); an unnormalised
    log-density is fine.

    Args:
        q: unit query, shape ``(d,)``.
        log_density: ``x (d,) -> log rho(x)`` (scalar), differentiable.

    Returns:
        ``(d,)`` drift; its tangent part is $\nabla_S \log \rho(q)$ and
        $\langle Y(q), q\rangle = -(d-1)/2$.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> q = jnp.array([0.0, 0.0, 1.0])
        >>> mf.theory.drift(q, lambda x: x[0] * x[1]).tolist()
        [0.0, 0.0, -1.0]
    """
    if not callable(log_density):
        raise TypeError(f"log_density must be a callable x -> log rho(x), got {log_density!r}")
    q = jnp.asarray(q)
    if q.ndim != 1 or q.shape[0] < 2:
        raise ValueError(f"q must be one query of shape (d,) with d >= 2, got shape {q.shape}")
    check_finite("q", q)
    g = jax.grad(lambda x: jnp.asarray(log_density(x)).astype(x.dtype))(q)
    d = q.shape[0]
    return g - dot(q, g) * q - 0.5 * (d - 1) * q


# --------------------------------------------------------------------------
# Section 2: attention outputs (paper Sec. 4, App. E)
# --------------------------------------------------------------------------
# Y_n(q) = V sum_j A_j (x_j - q). Near q a key is x = cos(r) q + sin(r) theta with theta a unit
# tangent vector (the "mark", theta in S_q^{d-2}) and T = 1 - cos r, so that
# x - q = -T q + sqrt(T (2 - T)) theta: the tangent part is sqrt(2 T) theta to leading order.
# The formulas below take V = I; for a value matrix V apply z -> V z (covariances V Sigma V^T).


def supercritical_scale(
    n: ArrayLike, d: Any, density: ArrayLike | None = None
) -> Float[Array, "..."]:
    r"""Supercritical scale $a_n = (C(q)\, n)^\alpha$ of the nearest distance (App. E.1).

    $P(a_n T_{(1)} > y) = (1 - F(y / a_n))^n \to \exp(-y^{1/\alpha})$, with
    $F(t) = P(T < t) \sim C(q)\, t^{1/\alpha}$: $a_n T_{(1)}$ converges to the first point
    $R_1$ of a Poisson process with mean measure $y^{1/\alpha}$ (``supercritical_radial_cdf``).
    The output displacement is of order $a_n^{-1/2} \asymp n^{-\alpha/2}$: $\sqrt{a_n}\, Y_n(q) \to \Phi$
    (``sample_supercritical_output``).

    Args:
        n: context length(s), ``> 0``.
        d: ambient dimension, ``d >= 2``.
        density: optional key density $\rho(q)$ at the query (default uniform keys).

    Returns:
        $a_n$, broadcast shape of ``n`` and ``density``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.theory.supercritical_scale(10_000, 5)), 3)  # sqrt(0.75 * 1e4)
        86.603
    """
    alpha = attention_alpha(d)
    check_positive("n", n)
    C = tail_constant(d, density)
    return (C * jnp.asarray(n, dtype=jnp.result_type(float))) ** alpha


def supercritical_radial_cdf(y: ArrayLike, d: Any) -> Float[Array, "..."]:
    r"""Limit law of the rescaled nearest distance: $P(R_1 \le y) = 1 - \exp(-y^{1/\alpha})$.

    $R_1 = \lim a_n T_{(1)}$ (``supercritical_scale``) is Weibull with shape $1/\alpha = (d-1)/2$
    and scale 1, i.e. $R_1 = E^\alpha$ with $E \sim \mathrm{Exp}(1)$ (paper Thm 4.1, App. E.2: the
    mean measure of the limit point process is $\frac{1}{\alpha} y^{1/\alpha - 1}\, dy\, \nu_q(d\theta)$).
    In the supercritical regime the output's tangent part satisfies
    $\tfrac12 a_n \|P_q Y_n(q)\|^2 \to R_1$, so this is also the law of $\|\Phi\|^2 / 2$.

    Args:
        y: value(s) ``>= 0``.
        d: ambient dimension, ``d >= 2``.

    Returns:
        the CDF, same shape as ``y``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.theory.supercritical_radial_cdf(1.0, 3)), 6)  # 1 - exp(-1)
        0.632121
    """
    alpha = attention_alpha(d)
    check_nonnegative("y", y)
    y = jnp.asarray(y, dtype=jnp.result_type(float))
    return -jnp.expm1(-(y ** (1.0 / alpha)))


def sample_supercritical_output(key: PRNGKeyArray, d: Any, num: Any) -> Float[Array, "num tangent"]:
    r"""Samples of the supercritical output limit $\Phi = \sqrt{2 R_1}\, \Theta$ (paper Thm 4.1).

    For $\beta_n \gg n^\alpha$ all the mass sits on the nearest key
    $x^\star = \cos r^\star\, q + \sin r^\star\, \Theta$, so
    $Y_n(q) \approx x^\star - q = -T^\star q + \sqrt{T^\star (2 - T^\star)}\, \Theta$ and

    $$\sqrt{a_n}\, Y_n(q) \to \Phi = \sqrt{2 R_1}\, \Theta, \qquad R_1 = E^\alpha,\ E \sim \mathrm{Exp}(1),$$

    with the mark $\Theta$ uniform on the unit sphere of the tangent space $q^\perp$, independent of
    $R_1$ (the key density is locally constant at the scale $a_n^{-1/2}$). The radial part
    $\|\Phi\| = \sqrt{2 R_1}$ is Weibull with shape $d - 1$ and scale $\sqrt 2$.

    Reconstruction: the extracted theorem reads $a_n Y_n(q) \to V\Phi$, but the same text says
    $Y_n$ "scales as $n^{-\alpha/2}$" and App. E.2 works "at the finer scale $a_n^{-1/2}$"
    ($a_n = (C n)^\alpha$), and $\|x^\star - q\| \approx \sqrt{2 T^\star} \asymp a_n^{-1/2}$: the scaling is
    $\sqrt{a_n}$, and the radial coordinate $-T^\star q$ vanishes at that scale.

    Args:
        key: a ``jax.random`` key.
        d: ambient dimension, ``d >= 2``.
        num: number of samples.

    Returns:
        ``(num, d - 1)`` samples of $\Phi$ in an orthonormal basis of $q^\perp$ (the law is
        rotation invariant, so any basis; ``Phi @ mf.sphere.tangent_basis(q).T`` gives ambient
        vectors, and ``V`` applies after that).

    Example:
        >>> import jax, meanfield as mf
        >>> Phi = mf.theory.sample_supercritical_output(jax.random.key(0), 3, 20_000)
        >>> bool(abs((Phi**2).sum(1).mean() / 2 - 1.0) < 0.03)  # E R_1 = Gamma(1 + alpha) = 1 (d = 3)
        True
    """
    alpha = attention_alpha(d)
    num = check_int("num", num, minimum=1)
    dtype = jnp.result_type(float)
    k_r, k_t = jax.random.split(key)
    R = jax.random.exponential(k_r, (num,), dtype=dtype) ** alpha
    return jnp.sqrt(2.0 * R)[:, None] * _unit_marks(k_t, (num,), d - 1, dtype)


def _unit_marks(
    key: PRNGKeyArray, shape: tuple[int, ...], m: int, dtype: DTypeLike
) -> Float[Array, "... m"]:
    """Uniform unit vectors of ``R^m`` (normalised Gaussians; ``m = 1`` gives random signs)."""
    g = jax.random.normal(key, (*shape, m), dtype=dtype)
    return g / jnp.linalg.norm(g, axis=-1, keepdims=True)


def _log_gammaincc(s: float, y: Float[Array, "..."]) -> Float[Array, "..."]:
    """``log Q(s, y)``; for integer ``s`` the closed form ``Q = e^{-y} sum_{j<s} y^j / j!`` (no underflow)."""
    if float(s).is_integer():
        return jnp.log(sum(y**j / math.factorial(j) for j in range(int(s)))) - y
    return jnp.log(gammaincc(s, y))


def sample_critical_output(
    key: PRNGKeyArray,
    gamma: ArrayLike,
    d: Any,
    num: Any,
    *,
    density: ArrayLike | None = None,
    terms: Any = 512,
    batch_size: Any = 1024,
) -> Float[Array, "num tangent"]:
    r"""Samples of the critical output limit $\Xi$, the marked Poisson functional (paper Thm 4.2).

    At $\beta_n = \gamma n^\alpha$ the marked points $(\beta_n T_j, \Theta_j)$ converge to a Poisson
    process on $[0, \infty) \times S_q^{d-2}$ with mean measure $c\, d(y^{1/\alpha}) \otimes \nu_q$,
    $c = C(q) \gamma^{-1/\alpha}$, $\nu_q$ the uniform law of the marks (App. E.1, E.3). Since
    $\sqrt{\beta_n} (x_j - q) = -\sqrt{\beta_n} T_j q + \sqrt{\beta_n T_j (2 - T_j)}\, \Theta_j \approx \sqrt{2 y_j}\, \Theta_j$,

    $$\sqrt{\beta_n}\, Y_n(q) = \frac{\sum_j e^{-\beta_n T_j} \sqrt{\beta_n} (x_j - q)}{\sum_j e^{-\beta_n T_j}}
    \to \Xi = \frac{\sum_k e^{-y_k} \sqrt{2 y_k}\, \Theta_k}{\sum_k e^{-y_k}},$$

    with $y_k = (\Gamma_k / c)^\alpha$ ($\Gamma_k$ partial sums of i.i.d. Exp(1), as in
    ``critical_weights``) and i.i.d. uniform marks $\Theta_k$.

    Reconstruction: the extraction prints the limit as $\beta_n Y_n(q) \to V \Xi$ and the numerator
    functional as $e^{-y}\, 2 y\, \theta$; both lost a square root: $\|x_j - q\| \approx \sqrt{2 T_j}$, so
    $\beta_n (x_j - q)$ diverges like $\sqrt{\beta_n}$ at $\beta_n T_j = O(1)$. The $\sqrt{\beta_n}$
    scaling is the one that matches both neighbours: $\gamma \to \infty$ gives
    $\Xi \sqrt{C^\alpha/\gamma} \to \Phi$ (``sample_supercritical_output``) and $\gamma \to 0$ gives
    $\operatorname{Cov}(\Xi) \to 2^{-1/\alpha - 1} / (c\, \Gamma(1/\alpha + 1))\, I_{d-1}$, the subcritical
    covariance $\beta_n \operatorname{Cov}(Y_n)$ of ``fluctuation_covariance`` at $\beta_n = \gamma n^\alpha$.

    The first ``terms`` points are sampled exactly. Beyond them (given $y_L$, the rest is a Poisson
    process on $(y_L, \infty)$) the denominator is replaced by its mean
    $c\, \Gamma(1/\alpha + 1)\, Q(1/\alpha, y_L)$ (relative fluctuation below 1% for the defaults,
    as in ``critical_weights``) and the numerator by a centred Gaussian with its exact covariance
    $c\, 2^{-1/\alpha - 1}\, \Gamma(1/\alpha + 1)\, Q(1/\alpha + 1, 2 y_L)\, I_{d-1}$ (many small
    independent terms; $Q$ the regularised upper incomplete gamma).

    Args:
        key: a ``jax.random`` key.
        gamma: critical ratio $\beta / n^\alpha > 0$ (traceable scalar).
        d: ambient dimension, ``d >= 2``.
        num: number of samples.
        density: optional key density $\rho(q)$ at the query (uniform if None).
        terms: number of Poisson points sampled exactly, ``>= 1``.
        batch_size: samples drawn per vectorised batch (bounds memory).

    Returns:
        ``(num, d - 1)`` samples of $\Xi$ in an orthonormal basis of $q^\perp$ (rotation-invariant
        law; multiply by ``mf.sphere.tangent_basis(q).T`` for ambient vectors, then by ``V``).

    Example:
        >>> import jax, meanfield as mf
        >>> Xi = mf.theory.sample_critical_output(jax.random.key(0), 1.0, 5, 2000)
        >>> Xi.shape
        (2000, 4)
    """
    alpha = attention_alpha(d)
    num = check_int("num", num, minimum=1)
    terms = check_int("terms", terms, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    check_positive("gamma", gamma)
    C = tail_constant(d, density)
    batch_size = min(batch_size, num)
    # sample i uses split(key, num)[i]; the key list is padded to whole batches (one compiled body, no remainder)
    keys = jax.random.split(key, num)
    pad = -num % batch_size
    keys = jnp.concatenate([keys, keys[:pad]]) if pad else keys
    return _critical_output(keys, jnp.asarray(gamma), jnp.asarray(C), alpha, terms, batch_size)[
        :num
    ]


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _critical_output(
    keys: Array, gamma: Array, C: Array, alpha: float, terms: int, batch_size: int
) -> Float[Array, "num tangent"]:
    dtype = jnp.result_type(float)
    s = 1.0 / alpha  # = (d - 1) / 2
    m = int(round(2.0 * s))  # d - 1, the tangent dimension
    c = C.astype(dtype) * gamma.astype(dtype) ** (-s)
    log_mean_scale = jnp.log(c) + math.lgamma(s + 1.0)  # denominator tail: c Gamma(s+1) Q(s, y_L)
    log_var_scale = jnp.log(c) + math.lgamma(s + 1.0) - (s + 1.0) * math.log(2.0)  # numerator tail

    def one(sample_key: PRNGKeyArray) -> Float[Array, " tangent"]:
        k_gap, k_mark, k_tail = jax.random.split(sample_key, 3)
        y = (jnp.cumsum(jax.random.exponential(k_gap, (terms,), dtype=dtype)) / c) ** alpha
        marks = _unit_marks(k_mark, (terms,), m, dtype)
        # everything multiplied by e^{y_1}: no underflow of e^{-y} for large gamma
        head = jnp.exp(-(y - y[0]))
        num_head = matmul(head * jnp.sqrt(2.0 * y), marks)
        den_tail = jnp.exp(log_mean_scale + _log_gammaincc(s, y[-1]) + y[0])
        tail_sd = jnp.exp(0.5 * (log_var_scale + _log_gammaincc(s + 1.0, 2.0 * y[-1])) + y[0])
        num_tail = tail_sd * jax.random.normal(k_tail, (m,), dtype=dtype)
        return (num_head + num_tail) / (jnp.sum(head) + den_tail)

    return jax.lax.map(one, keys, batch_size=batch_size)


def fluctuation_constant(d: Any) -> float:
    r"""Constant $c_d = 2^{-d} \pi^{-(d-1)/2}$ of the subcritical output covariance (paper Thm 4.3).

    Derivation (App. E.4, E.5): with $X_j = (x_j - q) e^{-\beta T_j}$ the local moments are
    $E[X X^\top] = C(q)\, \Gamma(1/\alpha + 1) (2\beta)^{-1/\alpha - 1} P_q (1 + o(1))$ and
    $E[Z_n] = C(q)\, \Gamma(1/\alpha + 1)\, n \beta^{-1/\alpha} (1 + o(1))$, so
    $\operatorname{Cov}(Y_n) \approx n \operatorname{Cov}(X) / E[Z_n]^2 = \frac{2^{-1/\alpha - 1} \beta^{1/\alpha - 1}}{n\, C(q)\, \Gamma(1/\alpha + 1)} P_q$;
    with $C(q)\, \Gamma(1/\alpha + 1) = \rho(q) (2\pi)^{(d-1)/2}$ and $1/\alpha = (d-1)/2$ this is
    $\frac{c_d}{\rho(q)} P_q / (n \beta^{1 - 1/\alpha})$.

    Args:
        d: ambient dimension, ``d >= 2``.

    Returns:
        $c_d$ as a float.

    Example:
        >>> import math, meanfield as mf
        >>> mf.theory.fluctuation_constant(3) == 1 / (8 * math.pi)
        True
    """
    d = check_int("d", d, minimum=2)
    return 2.0**-d * math.pi ** (-(d - 1) / 2)


def fluctuation_covariance(q: ArrayLike, density: ArrayLike | None = None) -> Float[Array, "d d"]:
    r"""Subcritical output covariance $\Sigma(q) = \frac{c_d}{\rho(q)} P_q$, $P_q = I - q q^\top$ (paper Thm 4.3).

    The three subcritical output regimes, with $\tau_n = \beta_n^{1+\alpha} n^{-\alpha}$
    (``drift_fluctuation_tau``), $r_n = \sqrt{n \beta_n^{1 - 1/\alpha}}$ (``fluctuation_scale``) and the
    drift $Y(q)$ (``drift``), $V = I$:

    * drift dominated ($\tau_n \to 0$): $\beta_n Y_n(q) \to Y(q)$ in probability;
    * mixed ($\tau_n \to \tau$): $\beta_n Y_n(q) \Rightarrow \mathcal N(Y(q), \tau^{1/\alpha} \Sigma(q))$;
    * fluctuation dominated ($\tau_n \to \infty$): $r_n Y_n(q) \Rightarrow \mathcal N(0, \Sigma(q))$.

    Reconstruction: the extracted text keeps $\Sigma(q)$, $c_d$ and the mixed-regime covariance
    $\tau^{1/\alpha} \Sigma(q)$; the fluctuation scale printed as $r_n = n \beta_n^{-1/\alpha + 1}$ lost
    its square root ($r_n^2 \operatorname{Cov}(Y_n) \to \Sigma$ needs
    $r_n^2 = n \beta_n^{1 - 1/\alpha}$, see ``fluctuation_constant``), which also makes the two
    statements agree: $\beta_n^2 / r_n^2 = \tau_n^{1/\alpha}$. For a value matrix $V$ the covariance
    is $V \Sigma V^\top$.

    Args:
        q: unit query, shape ``(d,)``.
        density: $\rho(q) > 0$, the key density at the query w.r.t. surface measure (default:
            uniform keys, $\rho = \Gamma(d/2) / (2 \pi^{d/2})$).

    Returns:
        ``(d, d)`` matrix $\Sigma(q)$.

    Example:
        >>> import math, jax.numpy as jnp, meanfield as mf
        >>> S = mf.theory.fluctuation_covariance(jnp.array([0.0, 0.0, 1.0]))
        >>> round(float(S[0, 0]), 6), float(S[2, 2])  # c_3 |S^2| = 4 pi / (8 pi) = 1/2
        (0.5, 0.0)
    """
    q = jnp.asarray(q)
    if q.ndim != 1 or q.shape[0] < 2:
        raise ValueError(f"q must be one query of shape (d,) with d >= 2, got shape {q.shape}")
    check_finite("q", q)
    d = q.shape[0]
    if density is None:
        density = math.gamma(d / 2) / (2.0 * math.pi ** (d / 2))
    else:
        check_positive("density", density)
    P = jnp.eye(d, dtype=q.dtype) - jnp.outer(q, q)
    return (fluctuation_constant(d) / jnp.asarray(density, dtype=q.dtype)) * P


def fluctuation_scale(n: ArrayLike, beta: ArrayLike, d: Any) -> Float[Array, "..."]:
    r"""Fluctuation scale $r_n = \sqrt{n \beta^{1 - 1/\alpha}}$: $r_n Y_n(q) \Rightarrow \mathcal N(0, \Sigma(q))$ when $\tau_n \to \infty$.

    See ``fluctuation_covariance`` (the square root is a reconstruction).

    Args:
        n: context length(s), ``> 0``.
        beta: inverse temperature(s), ``> 0``.
        d: ambient dimension, ``d >= 2``.

    Returns:
        $r_n$, broadcast shape of ``n`` and ``beta``.

    Example:
        >>> import meanfield as mf
        >>> float(mf.theory.fluctuation_scale(10_000, 100.0, 3))  # alpha = 1: sqrt(n)
        100.0
    """
    alpha = attention_alpha(d)
    check_positive("n", n)
    check_positive("beta", beta)
    dtype = jnp.result_type(float)
    return jnp.sqrt(jnp.asarray(n, dtype) * jnp.asarray(beta, dtype) ** (1.0 - 1.0 / alpha))


def fluctuation_beta(n: ArrayLike, d: Any) -> Float[Array, "..."]:
    r"""Output-level transition scale $\beta = n^{\alpha / (1 + \alpha)} = n^{2/(d+1)}$ ($\tau_n = 1$).

    Below it the output is drift dominated ($\beta Y_n \to Y(q)$), above it (and below the critical
    $n^\alpha$) Gaussian fluctuations swamp the drift (paper Thm 4.3).

    Args:
        n: context length(s), ``> 0``.
        d: ambient dimension, ``d >= 2``.

    Returns:
        $n^{2/(d+1)}$, same shape as ``n``.

    Example:
        >>> import meanfield as mf
        >>> float(mf.theory.fluctuation_beta(10_000, 3))
        100.0
    """
    d = check_int("d", d, minimum=2)
    check_positive("n", n)
    return jnp.asarray(n, dtype=jnp.result_type(float)) ** (2.0 / (d + 1))


def drift_fluctuation_tau(n: ArrayLike, beta: ArrayLike, d: Any) -> Float[Array, "..."]:
    r"""Regime parameter $\tau_n = \beta^{1+\alpha} n^{-\alpha} = (\beta / n^{2/(d+1)})^{1+\alpha}$ (paper Thm 4.3).

    In the mixed regime $\beta Y_n(q) \approx \mathcal N(Y(q), \tau^{1/\alpha} \Sigma(q))$, so the ratio
    of the tangent drift to the fluctuation size is
    $\|\nabla_S \log \rho(q)\| / \sqrt{\tau^{1/\alpha} \operatorname{tr} \Sigma(q)}
    = \|\nabla_S \log \rho(q)\| \sqrt{\rho(q) / ((d-1) c_d)}\, \tau^{-1/(2\alpha)}$:
    a function of $\tau$ alone, large for $\tau \ll 1$ (drift dominated), small for
    $\tau \gg 1$ (fluctuation dominated).

    Args:
        n: context length(s), ``> 0``.
        beta: inverse temperature(s), ``> 0``.
        d: ambient dimension, ``d >= 2``.

    Returns:
        $\tau_n$, broadcast shape of ``n`` and ``beta``.

    Example:
        >>> import meanfield as mf
        >>> float(mf.theory.drift_fluctuation_tau(10_000, 100.0, 3))  # beta^2 / n
        1.0
    """
    alpha = attention_alpha(d)
    check_positive("n", n)
    check_positive("beta", beta)
    dtype = jnp.result_type(float)
    return jnp.asarray(beta, dtype) ** (1.0 + alpha) * jnp.asarray(n, dtype) ** (-alpha)


# --------------------------------------------------------------------------
# Noise: the noisy Kuramoto / Lohe model (docs/math/noise.md, The Kuramoto model)
# --------------------------------------------------------------------------


def kuramoto_threshold(sigma: float, d: int = 2) -> float:
    r"""The coupling at which independent noise of amplitude $\sigma$ stops destabilising the uniform
    law of the Kuramoto / Lohe model on $S^{d-1}$ ($n \to \infty$): $K_c = d \sigma^2 / 2$ (the degree-1
    rate $K (d - 1) / d - \frac{\sigma^2}{2} (d - 1)$ changes sign; $\sigma^2$ on the circle).

    Example:
        >>> import meanfield as mf
        >>> mf.theory.kuramoto_threshold(1.0), mf.theory.kuramoto_threshold(1.0, d=3)
        (1.0, 1.5)
    """
    check_nonnegative("sigma", sigma)
    d = check_int("d", d, minimum=2)
    return d * float(sigma) ** 2 / 2


def kuramoto_order_parameter(coupling: float, sigma: float, d: int = 2) -> float:
    r"""The stationary order parameter $r = |E x|$ of the noisy Kuramoto / Lohe model
    $dx_i = K P_{x_i} m\, dt + \sigma P_{x_i} \circ dW_i$ on $S^{d-1}$ as $n \to \infty$: 0 at and below
    ``kuramoto_threshold``, above it the positive root of

    $$r = A_d\Big(\frac{2 K r}{\sigma^2}\Big), \qquad A_d(\kappa) = \frac{I_{d/2}(\kappa)}{I_{d/2 - 1}(\kappa)}$$

    (the stationary law is the von Mises-Fisher law $\propto e^{\kappa \langle x, \hat m\rangle}$,
    $\kappa = 2 K r / \sigma^2$, whose mean resultant length is $A_d(\kappa)$), by bisection on
    exponentially scaled Bessel functions (``scipy``). $\sigma = 0$: 1 (collapse).

    Example:
        >>> import meanfield as mf
        >>> round(mf.theory.kuramoto_order_parameter(2.0, 1.0), 6)     # r = I_1(4 r) / I_0(4 r)
        0.831462
    """
    import scipy.optimize
    import scipy.special

    check_positive("coupling", coupling)
    check_nonnegative("sigma", sigma)
    d = check_int("d", d, minimum=2)
    K, s = float(coupling), float(sigma)
    if s == 0:
        return 1.0
    if K <= kuramoto_threshold(s, d):
        return 0.0
    nu = d / 2

    def excess(r: float) -> float:
        kappa = 2 * K * r / s**2
        return float(scipy.special.ive(nu, kappa) / scipy.special.ive(nu - 1, kappa)) - r

    return float(scipy.optimize.brentq(excess, 1e-12, 1.0, xtol=1e-15, rtol=1e-14))
