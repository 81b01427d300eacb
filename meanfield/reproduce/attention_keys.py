r"""Critical attention beyond i.i.d. keys: dependent tokens and RoPE-rotated keys.

Paper: "Scaling Limits of Long-Context Transformers" (Bruno, Chen, Lin, Polyanskiy, Rigollet; docs/papers.md), Sec. 2 ("Correlations and
positional encoding") and App. F (its text is not in our copy: the RoPE statement
below is a reconstruction). Part of ``meanfield reproduce attention``:
``key_checks`` returns check rows, figures and timings that the attention
experiment adds to its ``summary.json``.

The i.i.d. estimators, applied unchanged ($d = 5$, $\alpha = 2/(d-1) = 1/2$, query $q = e_1$):

* exponent: mean $A_{(1)}$ on a grid $\beta = \gamma n^\alpha$, the crossing
  $\beta_{1/2}(n)$ of $1/2$ by interpolation in $\log\beta$, and the weighted
  slope of $\log\beta_{1/2}$ against $\log n$ (theory: $\alpha$);
* Poisson limit: $A_{(1)}$ at $\beta = \gamma n^\alpha$ against samples of the
  limit law $W_1$ (``theory.critical_weights``): mean at $\gamma = 1$ within 4
  combined standard errors, and the two-sample Kolmogorov-Smirnov distance for
  $\gamma \ge 1$ within 1.5 times its 5% critical value.

Key laws:

* ``dependent_tokens``: ``GaussianARKeys`` (directions of a stationary Gaussian
  AR(1) process: uniform marginals, geometric mixing, anti-clustering $D'$), so
  the limit is the i.i.d. uniform one. Contrast: ``StickyKeys`` (each key
  repeated a geometric number of times: mixing but clustered, extremal index
  $1 - s$) follows a compound Poisson limit instead (reconstruction: Poisson
  clusters of intensity $(1-s)\, c\, y^{1/\alpha}$ with Geometric$(1-s)$ sizes).
* ``rope_keys``: ``RoPEKeys`` over i.i.d. base keys of density
  $\rho(x) \propto (1 + x_1)^2$ (peaked at $q$; RoFormer frequencies, so the plane
  $(e_1, e_2)$ turns by 1 rad per position). Key $j$ has density $\rho(R_j^\top x)$;
  the limit is the i.i.d. one with the orbit average
  $\bar\rho_n(q) = \frac1n \sum_j \rho(R_j^\top q) = \frac1n \sum_j (1 + \cos j)^2 / Z_2$
  ($\to \frac{3}{2} / Z_2$, Weyl) in place of $\rho(q) = 4 / Z_2$ (reconstruction of
  App. F). Contrast: the law with the unrotated $\rho(q)$ is rejected.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax import Array
from jaxtyping import ArrayLike, Float, Int, PRNGKeyArray
from scipy.special import gammaincc

from .. import attention, sphere, theory
from .._checks import RealScalarLike
from ._common import Experiment, Option, check
from ._estimators import _crossing, _ks_distance, _reduced_limit_note, _weighted_line

__all__ = ["key_checks", "clustered_critical_weights", "rope_density"]

_D = 5
# Poisson points sampled exactly in the limit laws (the rest of Z is replaced by its mean): the 128th
# sits at y_L = (128 / c)^alpha >= 11.6 for the uniform and RoPE laws (c <= 0.94 at gamma >= 1) and 7.2
# for the unrotated contrast law (c = 2.5); the rest fluctuates by about sqrt(c y_L e^{-2 y_L}) relative
# to e^{-y_1}: < 1e-4, resp. < 1e-2 (contrast row only), of Z
_TERMS = 128
_POWER = 2  # RoPE base keys: rho(x) propto (1 + x_1)^2 on S^4, peaked at e_1 = q


def _cap_sampler(key: PRNGKeyArray, m: int) -> Float[Array, "m 5"]:
    r"""``m`` i.i.d. keys on ``S^4`` with density $\propto (1 + x_1)^2$ (``_POWER``), drawn exactly (no rejection).

    $x = (w, \sqrt{1 - w^2}\, v)$ with $v$ uniform on $S^3$ and $(1 + w)/2 \sim$ Beta(4, 2), the
    law of $x_1$ under $(1 + x_1)^2$ times the uniform $x_1$-density $\propto 1 - x_1^2$; a
    Beta(4, 2) variable is the second largest of 5 uniforms.
    """
    k_w, k_v = jax.random.split(key)
    u = jax.random.uniform(k_w, (m, _POWER + 3), sphere.DRAW_DTYPE)
    w = 2.0 * jnp.sort(u, axis=1)[:, -2] - 1.0
    v = sphere.uniform(k_v, m, _D - 1)
    return jnp.concatenate([w[:, None], jnp.sqrt(jnp.clip(1.0 - w**2, 0.0))[:, None] * v], axis=1)


# Quick size of each limit sample, and its size before issue 32 ("quick means quick"): 20x the
# 1000 contexts per cell (40x the 500 clustered ones) keeps the two-sample tolerances within 1.2%
# of those at 40x (``_estimators._reduced_limit_note``) and halves the limits' sampling time.
_LIMIT_QUICK, _LIMIT_WAS = 20_000, 40_000

#: The part's options (quick: a shorter n grid, fewer trials; ``key_checks(quick=...)``) and steps,
#: timed into the attention experiment's ``timings``. Gamma grids geomspace(0.5, 8, 4 m + 1) contain
#: gamma = 1, 2, 4, 8: the law checks use those cells.
_PART = Experiment(
    "attention (dependent and RoPE-rotated keys)",
    {
        "d": Option(_D, doc="dimension d of the keys on S^(d-1)"),
        "ar_phi": Option(0.8, doc="lag-one coefficient phi of the Gaussian AR(1) key directions"),
        "sticky_stay": Option(0.5, doc="probability s that a sticky key repeats the previous one"),
        "power": Option(_POWER, doc="exponent k of the RoPE base-key density (1 + x_1)^k"),
        "ns": Option(
            [100, 316, 1000, 3162, 10_000, 31_623, 100_000],
            quick=[100, 316, 1000, 3162, 10_000],
            doc="context lengths n of the crossing estimator (the law checks use the largest)",
        ),
        "gammas": Option(
            np.geomspace(0.5, 8.0, 25).tolist(),
            quick=np.geomspace(0.5, 8.0, 13).tolist(),
            doc="grid of gamma in beta = gamma n^alpha",
        ),
        "trials": Option(2000, quick=1000, doc="random contexts per (n, beta) cell"),
        "contrast_trials": Option(
            1000, quick=500, doc="random contexts per gamma of the clustered (sticky) keys"
        ),
        "limit_samples": Option(
            100_000, quick=_LIMIT_QUICK, doc="samples of each limit law per gamma"
        ),
    },
    steps=("keys_limits", "dependent_tokens", "rope_keys", "clustered", "keys_figures"),
)


def _settings(quick: bool) -> dict[str, Any]:
    return _PART.settings("quick" if quick else "default")


def rope_density(
    n: int, power: int = _POWER, d: int = _D, theta: RealScalarLike = 1.0
) -> tuple[float, float, float]:
    r"""Orbit-averaged key density at $q = e_1$ for RoPE over base keys $\rho(x) \propto (1 + x_1)^k$.

    $$\bar\rho_n = \frac1n \sum_{j=0}^{n-1} \frac{(1 + \cos\theta j)^k}{Z_k}, \qquad Z_k = |S^{d-1}|\, E_{\text{unif}}[(1 + x_1)^k]$$

    (key $j$ is $R(\theta j) k_j$, and $\langle e_1, R(\theta j)^\top e_1\rangle = \cos\theta j$; the
    moments of $x_1$ under the uniform law are $E[x_1^{2i}] = \prod_{l<i} (2l + 1)/(d + 2l)$). With
    $\theta / 2\pi$ irrational, $\bar\rho_n \to \binom{2k}{k} 2^{-k} / Z_k$ (Weyl; the mean of
    $(1 + \cos\phi)^k$ over the circle); without rotation the density at $q$ is $2^k / Z_k$.

    Args:
        n: number of positions ``>= 1``; power: $k \ge 0$ (int); d: dimension;
            theta: frequency of the plane ``(e_1, e_2)``.

    Returns:
        ``(rho_bar_n, rho_bar_limit, rho_unrotated)``: densities w.r.t. surface measure.

    Example:
        >>> from meanfield.reproduce.attention_keys import rope_density
        >>> finite, limit, unrotated = rope_density(10_000)
        >>> round(limit / unrotated, 4)  # (6/4) / 2^2
        0.375
    """
    moment = 0.0
    for i in range(power // 2 + 1):  # E[(1 + x_1)^k] = sum_i binom(k, 2i) E[x_1^(2i)]
        moment += math.comb(power, 2 * i) * math.prod((2 * l + 1) / (d + 2 * l) for l in range(i))
    Z = 2 * math.pi ** (d / 2) / math.gamma(d / 2) * moment
    j = np.arange(int(n))
    finite = float(np.mean((1.0 + np.cos(theta * j)) ** power)) / Z
    return finite, math.comb(2 * power, power) / 2**power / Z, 2.0**power / Z


def clustered_critical_weights(
    rng: np.random.Generator,
    gamma: RealScalarLike,
    d: int,
    stay: RealScalarLike,
    num: int,
    *,
    terms: int = 512,
) -> Float[np.ndarray, " num"]:
    r"""Samples of the compound-Poisson critical limit of $A_{(1)}$ for ``StickyKeys`` (reconstruction).

    Clusters (runs of one repeated key) sit at $y_l = (\Gamma_l / c')^\alpha$, the
    points of a Poisson process of mean measure $c' y^{1/\alpha}$ with
    $c' = (1 - s)\, C \gamma^{-1/\alpha}$ (a fraction $1 - s$ of the keys are fresh);
    cluster $l$ holds $G_l \sim$ Geometric$(1 - s)$ identical keys. So

    $$W_1 = \frac{e^{-y_1}}{\sum_l G_l e^{-y_l}},$$

    the first ``terms`` clusters exact and the rest replaced by its mean
    $E[G]\, c'\, \Gamma(1/\alpha + 1)\, Q(1/\alpha, y_L)$ as in ``theory.critical_weights``.
    ``stay = 0`` is the Poisson limit of i.i.d. keys.

    Args:
        rng: NumPy generator; gamma: $\beta / n^\alpha > 0$; d: dimension; stay: $s \in [0, 1)$;
            num: number of samples; terms: clusters sampled exactly.

    Returns:
        ``(num,)`` samples of $W_1$.

    Example:
        >>> import numpy as np
        >>> from meanfield.reproduce.attention_keys import clustered_critical_weights
        >>> w = clustered_critical_weights(np.random.default_rng(0), 1.0, 5, 0.0, 4000)
        >>> bool(abs(w.mean() - 0.277) < 0.02)
        True
    """
    if not 0.0 <= stay < 1.0:
        raise ValueError(f"stay must be in [0, 1), got {stay!r}")
    alpha = theory.attention_alpha(d)
    c = (1.0 - stay) * float(theory.tail_constant(d)) * gamma ** (-1.0 / alpha)
    s = 1.0 / alpha
    y = (np.cumsum(rng.exponential(size=(num, terms)), axis=1) / c) ** alpha
    G = rng.geometric(1.0 - stay, size=(num, terms))
    head = np.sum(G * np.exp(-(y - y[:, :1])), axis=1)
    # E[G] c' = C gamma^(-1/alpha): the tail's mean mass, shifted by e^{y_1}
    tail = np.exp(
        math.log(c / (1.0 - stay)) + math.lgamma(s + 1.0) + np.log(gammaincc(s, y[:, -1])) + y[:, 0]
    )
    return 1.0 / (head + tail)


def key_checks(
    *, quick: bool, out_dir: str | os.PathLike[str], seed: int = 0, quiet: bool = False
) -> tuple[list[dict[str, Any]], list[str], dict[str, float]]:
    """Checks ``dependent_tokens*`` and ``rope_keys*`` (see the module docstring).

    Args:
        quick: small sizes (the ``--quick`` reproduction) or the full ones.
        out_dir: directory for the figure ``attention_keys.png`` and ``attention_keys.npz``.
        seed: PRNG seed.
        quiet: no progress lines.

    Returns:
        ``(checks, figures, timings)``: rows of ``_common.check``, figure file names
        (relative to ``out_dir``), wall times in seconds.
    """
    return _key_checks(_settings(quick), Path(out_dir), seed, quiet)


def _key_checks(
    st: Mapping[str, Any], out: Path, seed: int, quiet: bool
) -> tuple[list[dict[str, Any]], list[str], dict[str, float]]:
    out.mkdir(parents=True, exist_ok=True)
    d = st["d"]
    alpha = theory.attention_alpha(d)
    steps = _PART.start(quiet=quiet)
    timings = steps.timings
    checks: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    k_dep, k_rope, k_sticky, k_lim = jax.random.split(jax.random.key(seed), 4)
    rng = np.random.default_rng(seed)
    ar = attention.GaussianARKeys(d, st["ar_phi"])
    rope = attention.RoPEKeys(d, _cap_sampler)
    sticky = attention.StickyKeys(d, st["sticky_stay"])
    ns = np.asarray(st["ns"])
    gam = np.asarray(st["gammas"], dtype=float)
    nc = int(ns.max())
    law = np.nonzero(gam >= 1.0 - 1e-9)[0]  # grid cells at n = max(ns) used for the law: gamma >= 1
    cg = gam[law]
    i1 = int(np.argmin(np.abs(cg - 1.0)))
    trials = st["trials"]
    ks_crit = 1.36 * math.sqrt(1 / trials + 1 / st["limit_samples"])
    ks_crit_c = 1.36 * math.sqrt(1 / st["contrast_trials"] + 1 / st["limit_samples"])

    # Poisson limits: uniform density (AR keys) and the RoPE orbit average (and, as a contrast, rho(q))
    rho_n, rho_lim, rho_q = rope_density(nc, st["power"], d)
    with steps("keys_limits"):
        lim_unif = _limit(jax.random.fold_in(k_lim, 0), cg, d, st["limit_samples"], None)
        lim_rope = _limit(jax.random.fold_in(k_lim, 1), cg, d, st["limit_samples"], rho_n)
        lim_unrot = _limit(jax.random.fold_in(k_lim, 2), cg, d, st["limit_samples"], rho_q)
        lim_sticky = clustered_critical_weights(
            rng, float(cg[i1]), d, st["sticky_stay"], st["limit_samples"], terms=_TERMS
        )

    # one (n, beta = gamma n^alpha) grid per key law: the crossing uses every cell's mean, the law
    # checks the A_(1) samples of the cells n = max(ns), gamma >= 1 (one compilation per key law)
    results = {}
    for name, proc, key, lim in [
        ("dependent_tokens", ar, k_dep, lim_unif),
        ("rope_keys", rope, k_rope, lim_rope),
    ]:
        with steps(name):
            cross, draws = _exponent(key, proc, ns, gam, d, alpha, trials)
        results[name] = dict(cross=cross, crit=draws[-1][:, law], lim=lim)
    with steps("clustered"):
        crit_sticky = np.asarray(
            attention.sample_top_weights(
                k_sticky, nc, cg * nc**alpha, d, st["contrast_trials"], sampler=sticky
            )
        )[..., 0]

    # ---- rows ----------------------------------------------------------------------------------
    laws = {
        "dependent_tokens": (
            f"stationary Gaussian AR(1) directions, phi = {st['ar_phi']} (uniform marginals, lag-l coefficient "
            f"phi^l, anti-clustering D'), vs the i.i.d. uniform limit (C = {float(theory.tail_constant(d)):.3f})"
        ),
        "rope_keys": (
            f"RoPE-rotated keys of density propto (1 + x_1)^{st['power']} (RoFormer frequencies, 1 rad per position "
            f"in the (e_1, e_2) plane), vs the limit with the orbit-averaged density rho_bar_n(q) = {rho_n:.5f} "
            f"(Weyl limit {rho_lim:.5f}; unrotated rho(q) = {rho_q:.5f}); reconstruction of App. F"
        ),
    }
    for name, r in results.items():
        c = r["cross"]
        offsets = ", ".join(f"{v:.2f}" for v in c["log_beta_half"] - alpha * np.log(c["ns"]))
        checks.append(
            check(
                f"{name}_exponent",
                c["slope"],
                alpha,
                max(4 * c["slope_se"], 0.03),
                f"{laws[name]}: slope of log beta_1/2(n) vs log n over n = {c['ns'].min()}..{c['ns'].max()} "
                f"({trials} contexts per cell, beta = gamma n^alpha grid, crossing by interpolation in log beta: "
                f"the i.i.d. estimator); log beta_1/2 - alpha log n = {offsets}; SE {c['slope_se']:.3g} by the "
                f"delta method; tolerance max(4 SE, 0.03)",
            )
        )
        a, w = r["crit"][:, i1], r["lim"][:, i1]
        se = math.sqrt(a.var(ddof=1) / a.size + w.var(ddof=1) / w.size)
        checks.append(
            check(
                name,
                a.mean(),
                w.mean(),
                4 * se,
                f"{laws[name]}: mean A_(1) at beta = n^alpha, d = {d}, n = {nc}, {a.size} contexts, vs mean W_1 "
                f"of the Poisson limit ({w.size} samples); tolerance 4 combined SE ({se:.2g})",
            )
        )
        ks = [_ks_distance(r["crit"][:, i], r["lim"][:, i]) for i in range(len(cg))]
        r["ks"] = ks
        checks.append(
            check(
                f"{name}_law",
                max(ks),
                0.0,
                1.5 * ks_crit,
                f"largest two-sample KS distance between A_(1) (n = {nc}) and W_1 over gamma = "
                f"{', '.join(f'{g:g}' for g in cg)} ({', '.join(f'{v:.3f}' for v in ks)}); tolerance 1.5x the 5% "
                f"KS critical value {ks_crit:.3g} (as for i.i.d. keys)",
            )
        )
    ks_unrot = [
        _ks_distance(results["rope_keys"]["crit"][:, i], lim_unrot[:, i]) for i in range(len(cg))
    ]
    checks.append(
        check(
            "rope_keys_unrotated_contrast",
            min(ks_unrot),
            None,
            note=f"smallest KS distance between RoPE A_(1) and the limit law with the unrotated density rho(q) = "
            f"{rho_q:.5f} over gamma = {', '.join(f'{g:g}' for g in cg)}; pass if every one exceeds the 5% critical "
            f"value {ks_crit:.3g}: the law check above tells the rotation's orbit average from no rotation",
            passed=lambda v: v > ks_crit,
        )
    )
    s_st = st["sticky_stay"]
    a, w = crit_sticky[:, i1], lim_sticky
    se = math.sqrt(a.var(ddof=1) / a.size + w.var(ddof=1) / w.size)
    checks.append(
        check(
            "dependent_tokens_clustered",
            a.mean(),
            w.mean(),
            4 * se,
            f"clustered keys without anti-clustering (StickyKeys: repeat the previous key with probability "
            f"{s_st:g}, extremal index {1 - s_st:g}): mean A_(1) at beta = n^alpha, n = {nc}, {a.size} contexts, vs "
            f"the compound Poisson limit (clusters of intensity (1-s) c y^(1/alpha), Geometric(1-s) sizes; "
            f"reconstruction), {w.size} samples; tolerance 4 combined SE ({se:.2g})",
        )
    )
    ks_sticky = [_ks_distance(crit_sticky[:, i], lim_unif[:, i]) for i in range(len(cg))]
    checks.append(
        check(
            "dependent_tokens_clustered_contrast",
            min(ks_sticky),
            None,
            note=f"smallest KS distance between the clustered keys' A_(1) and the i.i.d. Poisson law W_1 over gamma "
            f"= {', '.join(f'{g:g}' for g in cg)}; pass if every one exceeds the 5% critical value {ks_crit_c:.3g}: "
            f"without anti-clustering the i.i.d. limit fails, so the dependent_tokens check has power",
            passed=lambda v: v > ks_crit_c,
        )
    )

    L = st["limit_samples"]
    if L == _LIMIT_QUICK != _PART.options["limit_samples"].default:
        contrast = "the smallest KS distance over the 5% critical value (pass: > 1)"
        for row in checks:
            if row["name"].endswith("_contrast"):
                n1 = st["contrast_trials"] if row["name"].startswith("dependent") else trials
                crit = ks_crit_c if row["name"].startswith("dependent") else ks_crit
                row["note"] = _reduced_limit_note(
                    row["note"], n1, L, _LIMIT_WAS, row["measured"] / crit, contrast
                )
            elif not row["name"].endswith("_exponent"):  # the exponents use no limit sample
                n1 = st["contrast_trials"] if row["name"].endswith("_clustered") else trials
                m = abs(row["measured"] - row["theory"]) / row["tolerance"]
                row["note"] = _reduced_limit_note(row["note"], n1, L, _LIMIT_WAS, m)

    with steps("keys_figures"):
        np.savez(
            out / "attention_keys.npz",
            gammas=cg,
            n=nc,
            **{f"{nm}_{k}": v for nm, r in results.items() for k, v in r["cross"].items()},
            dependent_finite=results["dependent_tokens"]["crit"],
            dependent_limit=lim_unif,
            rope_finite=results["rope_keys"]["crit"],
            rope_limit=lim_rope,
            rope_unrotated_limit=lim_unrot,
            clustered_finite=crit_sticky,
            clustered_limit=lim_sticky,
        )
        fig = _plot(
            out, d, alpha, nc, cg, i1, results, lim_unrot, crit_sticky, lim_sticky, lim_unif, st
        )
    steps.close()
    timings["keys_total"] = round(time.perf_counter() - t0, 3)
    return checks, [fig], timings


def _limit(
    key: PRNGKeyArray, gammas: Float[np.ndarray, " g"], d: int, num: int, density: float | None
) -> Float[np.ndarray, "num g"]:
    """``(num, len(gammas))`` samples of ``W_1`` (``theory.critical_weights``) for each gamma."""
    return np.stack(
        [
            np.asarray(
                theory.critical_weights(
                    jax.random.fold_in(key, i), float(g), d, 1, num, density=density, terms=_TERMS
                )
            )[:, 0]
            for i, g in enumerate(gammas)
        ],
        axis=1,
    )


def _exponent(
    key: PRNGKeyArray,
    proc: attention.AbstractKeyProcess,
    ns: Int[np.ndarray, " k"],
    gam: Float[np.ndarray, " b"],
    d: int,
    alpha: float,
    trials: int,
) -> tuple[dict[str, Any], Float[np.ndarray, "k trials b"]]:
    """The i.i.d. crossing estimator on contexts from ``proc``; also the ``(len(ns), trials, b)`` samples."""
    betas = np.outer(ns.astype(float) ** alpha, gam)
    mean, se, draws = attention.mean_top_weight_grid(
        key, ns.tolist(), betas, d, trials, sampler=proc, samples=True
    )
    half = np.asarray([_crossing(np.log(betas[i]), mean[i], se[i]) for i in range(len(ns))])
    slope, intercept, slope_se = _weighted_line(np.log(ns), half[:, 0], half[:, 1])
    cross = dict(
        ns=ns,
        betas=betas,
        mean=mean,
        se=se,
        log_beta_half=half[:, 0],
        log_beta_half_se=half[:, 1],
        slope=slope,
        intercept=intercept,
        slope_se=slope_se,
    )
    return cross, draws


def _ecdf(ax: Any, x: ArrayLike, **kw: Any) -> None:
    x = np.sort(x)
    ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", **kw)


def _plot(
    out: Path,
    d: int,
    alpha: float,
    nc: int,
    cg: np.ndarray,
    i1: int,
    results: Mapping[str, Mapping[str, Any]],
    lim_unrot: np.ndarray,
    crit_sticky: np.ndarray,
    lim_sticky: np.ndarray,
    lim_unif: np.ndarray,
    st: Mapping[str, Any],
) -> str:
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    ax = axes[0]
    for j, (name, r) in enumerate(results.items()):
        c = r["cross"]
        ax.errorbar(
            c["ns"],
            np.exp(c["log_beta_half"]),
            yerr=np.exp(c["log_beta_half"]) * c["log_beta_half_se"],
            fmt="o",
            color=f"C{j}",
            ms=4,
            label=f"{name}: slope {c['slope']:.3f} +- {c['slope_se']:.3f}",
        )
        nn = np.geomspace(c["ns"].min(), c["ns"].max(), 50)
        ax.plot(nn, np.exp(c["intercept"]) * nn ** c["slope"], "-", color=f"C{j}", lw=1)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="n",
        ylabel=r"$\beta_{1/2}(n)$: mean $A_{(1)} = 1/2$",
        title=rf"critical exponent (theory $\alpha$ = {alpha:g}), d = {d}",
    )
    ax.legend(fontsize=7)
    g = cg[i1]
    panels = [
        (
            axes[1],
            "dependent_tokens",
            [(results["dependent_tokens"]["lim"][:, i1], "k", "Poisson limit $W_1$ (uniform)")],
            f"AR(1) directions, $\\phi$ = {st['ar_phi']}",
        ),
        (
            axes[2],
            "rope_keys",
            [
                (
                    results["rope_keys"]["lim"][:, i1],
                    "k",
                    r"$W_1$ with orbit average $\bar\rho(q)$",
                ),
                (lim_unrot[:, i1], "C3", r"$W_1$ with unrotated $\rho(q)$"),
            ],
            rf"RoPE, base $\rho \propto (1 + x_1)^{st['power']}$",
        ),
    ]
    for ax, name, refs, title in panels:
        _ecdf(ax, results[name]["crit"][:, i1], color="C0", lw=2, label=f"$A_{{(1)}}$, n = {nc}")
        for w, col, lab in refs:
            _ecdf(ax, w, color=col, lw=1, ls="--", label=lab)
        ax.set(
            xlabel=r"$A_{(1)}$",
            ylabel="CDF",
            title=rf"{title}, $\beta = \gamma n^\alpha$, $\gamma$ = {g:g}",
        )
        ax.legend(fontsize=7, loc="lower right")
    ax = axes[3]
    _ecdf(ax, crit_sticky[:, i1], color="C0", lw=2, label=f"$A_{{(1)}}$, n = {nc}")
    _ecdf(ax, lim_sticky, color="k", lw=1, ls="--", label="compound Poisson limit")
    _ecdf(ax, lim_unif[:, i1], color="C3", lw=1, ls=":", label="i.i.d. Poisson limit $W_1$")
    ax.set(
        xlabel=r"$A_{(1)}$",
        ylabel="CDF",
        title=rf"clustered keys (repeat prob. {st['sticky_stay']:g}), $\gamma$ = {g:g}",
    )
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = out / "attention_keys.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name
