r"""``meanfield reproduce prototypes``: the DDCL prototype readout (MATH.md Sec. 4).

Three experiments, all on data that needs no download:

1. **Stability ablation on the 8x8 digits** (paper Fig. 6): a small MLP
   autoencoder (64 -> 64 -> m) is pre-trained on reconstruction, $K = 10$
   prototypes are initialised at the tokens of $K$ random images, then the
   clustering autoencoder $\|x - g(z)\|^2 + \lambda L_q$ is trained with two
   rates, $\eta_P$ on the prototypes and $\eta_\theta = \varepsilon\, \eta_P$ on the
   encoder/decoder, for a sweep of $\varepsilon$ (one ``vmap``). The reconstruction
   keeps the encoder from the trivial collapse of every token onto one point,
   which plain $L_q$ rewards. Recorded per epoch: $L_q$, $L_\text{OLS}$, $V$, the
   prototype separation $S(P)$ (min and mean pairwise distance), entropy,
   utilisation and ACC/NMI/ARI of the hard labels $\operatorname{argmax}_k q_{tk}$.
2. **Soft against hard vector quantisation** (paper Table 5 / Fig. 4): the same
   linear autoencoder on a seeded Gaussian-mixture token set, quantised either
   softly (decoder reads $\hat z$; loss $\text{recon} + \lambda L_q$) or by nearest
   code with the straight-through estimator
   ($\text{recon} + \text{codebook} + \beta\, \text{commitment}$), equal $K$, init, rates and budget; codebook utilisation
   per epoch.
3. **Hierarchical readout** (paper paradigm 5): level-1 soft summaries of the
   token sequences are the tokens of level 2; $L_q = L_\text{OLS} + V$ is checked at
   both levels through training.
"""

from __future__ import annotations

import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from tqdm.auto import tqdm

from .. import prototypes as P
from ._common import Timer, check, write_summary

__all__ = ["run"]

_NAME = "prototypes"


def _settings(quick: bool, options: dict) -> dict:
    options = dict(options)
    full = bool(options.pop("full", False))
    if full and quick:
        raise ValueError("choose at most one of quick and full")
    s = {
        "seed": 0,
        # digits ablation
        "digits_m": 10,
        "digits_K": 10,
        "digits_width": 64,
        "digits_pretrain_epochs": 30,
        "digits_epochs": 40 if quick else 150,
        "digits_batch": 128,
        "digits_eta_P": 1e-2,
        "digits_lam": 0.1,
        # temperature = factor * median squared token distance after pre-training
        "digits_temperature_factor": 0.1,
        "eps": [0.01, 0.05, 0.1, 0.5, 1.0, 2.0] if quick else [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0],
        "digits_seeds": 2 if quick else 4,
        # soft vs hard VQ
        "vq_K": [16] if quick else [16, 64],
        "vq_m": 8,
        "vq_temperature": 2.0,
        "vq_sequences": 256,
        "vq_seq_len": 16,
        "vq_d": 16,
        "vq_epochs": 20 if quick else 50,
        "vq_batch": 256,
        "vq_eta_P": 1e-2,
        "vq_eps": 0.1,
        "vq_lam": 0.5,
        "vq_beta": 0.25,
        # hierarchical
        "hier_K1": 16,
        "hier_K2": 4,
        "hier_m": 8,
        "hier_temperature1": 1.0,
        "hier_temperature2": 0.05,
        "hier_epochs": 20 if quick else 60,
        "hier_batch": 32,
        "hier_eta_P": 1e-2,
        "hier_eps": 0.05,
        "hier_lam": 0.5,
        "utilization_threshold": 0.01,
        "optimizer": "adam",
    }
    if full:  # the paper's sizes where it states them (Fig. 6: 300 epochs; Table 5: 50 epochs)
        s.update(digits_epochs=300, digits_seeds=5, vq_epochs=50, hier_epochs=60)
    for k, v in options.items():
        if k not in s:
            raise ValueError(f"unknown option {k!r} for reproduce prototypes; accepted: {', '.join(s)}")
        s[k] = v
    s["mode"] = "quick" if quick else "full" if full else "default"
    return s


# ---------------------------------------------------------------------------
# 1. digits: two-timescale stability ablation


def _digits(cfg, key, pbar):
    X_np, y = P.load_digits()
    X = jnp.asarray(X_np)
    K, m = cfg["digits_K"], cfg["digits_m"]
    kq, kd, kpre = jax.random.split(key, 3)
    readout = P.PrototypeReadout(64, m, K, 1.0, key=kq, width=cfg["digits_width"], depth=1)
    model = P.VQAutoencoder(readout, key=kd, width=cfg["digits_width"], depth=1)

    def recon_only(mod, xb):
        z = mod.quantizer.tokens(xb)
        return jnp.mean(jnp.sum((xb - jax.vmap(mod.decoder)(z)) ** 2, axis=-1))

    eta_P = cfg["digits_eta_P"]
    model, _ = P.train(
        model, recon_only, X, key=kpre, eta_theta=eta_P, eta_P=eta_P,
        epochs=cfg["digits_pretrain_epochs"], batch_size=cfg["digits_batch"], optimizer=cfg["optimizer"],
    )
    z0 = model.quantizer.tokens(X)
    temperature = cfg["digits_temperature_factor"] * float(jnp.median(P.squared_distances(z0, z0)))
    pbar.update(1)

    lam = cfg["digits_lam"]

    def loss(mod, xb):
        return mod.loss(xb, lam=lam, decode="tokens")[0]

    def record(mod):
        qz = mod.quantizer
        z = qz.tokens(X)
        L_q, L_ols, V = P._loss_terms(z, qz.prototypes, qz.temperature)
        q = P._assign(z, qz.prototypes, qz.temperature)
        smin, smean = P._separation(qz.prototypes)
        return {
            "L_q": L_q, "L_OLS": L_ols, "V": V, "S_min": smin, "S_mean": smean,
            "entropy": -jnp.mean(jnp.sum(jax.scipy.special.xlogy(q, q), axis=-1)),
            "utilization": jnp.mean(jnp.mean(q, axis=0) > cfg["utilization_threshold"]),
            "labels": jnp.argmax(q, axis=-1),
        }

    def one(k, eps):
        kinit, ktrain = jax.random.split(k)
        idx = jax.random.choice(kinit, X.shape[0], (K,), replace=False)
        mod = eqx.tree_at(
            lambda r: (r.quantizer.prototypes, r.quantizer.temperature),
            model, (z0[idx], jnp.asarray(temperature, z0.dtype)),
        )
        return P.train(
            mod, loss, X, key=ktrain, eta_theta=eps * eta_P, eta_P=eta_P, epochs=cfg["digits_epochs"],
            batch_size=cfg["digits_batch"], record=record, optimizer=cfg["optimizer"],
        )

    eps = jnp.asarray(cfg["eps"], dtype=jnp.float32)
    S = cfg["digits_seeds"]
    keys = jax.random.split(jax.random.fold_in(key, 1), S)
    # grid (seed, eps) flattened into one vmapped axis: one compilation
    ks = jnp.repeat(keys, len(eps), axis=0)
    es = jnp.tile(eps, S)
    models, hist = eqx.filter_vmap(one)(ks, es)
    hist = jax.tree_util.tree_map(lambda a: np.asarray(a).reshape(S, len(eps), *a.shape[1:]), hist)
    pbar.update(1)

    labels = hist.pop("labels")  # (S, E, epochs+1, N)
    acc = np.zeros(labels.shape[:3])
    nmi = np.zeros_like(acc)
    ari = np.zeros_like(acc)
    for s in range(S):
        for e in range(len(eps)):
            for t in range(labels.shape[2]):
                acc[s, e, t] = P.clustering_accuracy(y, labels[s, e, t])
                nmi[s, e, t] = P.nmi(y, labels[s, e, t])
                ari[s, e, t] = P.ari(y, labels[s, e, t])
    hist.update(acc=acc, nmi=nmi, ari=ari)

    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=K, n_init=10, random_state=cfg["seed"]).fit_predict(X_np)
    baseline = {"acc": P.clustering_accuracy(y, km), "nmi": P.nmi(y, km), "ari": P.ari(y, km)}

    # tokens and prototypes of the first seed at the eps closest to 0.05, for the PCA figure
    e_ref = int(np.argmin(np.abs(np.asarray(eps) - 0.05)))
    ref = jax.tree_util.tree_map(lambda a: a[e_ref] if eqx.is_array(a) else a, models)
    z_ref = np.asarray(ref.quantizer.tokens(X))
    p_ref = np.asarray(ref.quantizer.prototypes)
    return {
        "hist": hist, "eps": np.asarray(eps), "temperature": temperature, "kmeans": baseline,
        "y": y, "z": z_ref, "p": p_ref, "e_ref": e_ref, "pred": labels[0, e_ref, -1],
    }


# ---------------------------------------------------------------------------
# 2. soft against hard vector quantisation


def _vq(cfg, key, pbar):
    kdata, kq, kd, ktrain = jax.random.split(key, 4)
    x, comps, _, _ = P.gaussian_mixture_tokens(kdata, cfg["vq_sequences"], cfg["vq_seq_len"], cfg["vq_d"])
    X = x.reshape(-1, cfg["vq_d"])
    d, m = cfg["vq_d"], cfg["vq_m"]
    lam, beta = cfg["vq_lam"], cfg["vq_beta"]
    thr = cfg["utilization_threshold"]
    out = {}
    for K in cfg["vq_K"]:
        models = {
            "soft": P.VQAutoencoder(P.PrototypeReadout(d, m, K, cfg["vq_temperature"], key=kq), key=kd),
            "hard": P.VQAutoencoder(P.HardVQ(d, m, K, key=kq), key=kd),
        }
        if K == cfg["vq_K"][0]:
            # sensitivity: the same soft run at half the temperature
            models["soft-half-temperature"] = P.VQAutoencoder(
                P.PrototypeReadout(d, m, K, cfg["vq_temperature"] / 2, key=kq), key=kd
            )
        for kind, mod in models.items():

            def record(mm):
                qz = mm.quantizer
                q = qz.assign(X)
                r = {
                    "utilization": jnp.mean(jnp.mean(q, axis=0) > thr),
                    "loss": mm.loss(X, lam=lam, beta=beta)[0],
                    "recon": mm.loss(X, lam=lam, beta=beta)[1]["recon"],
                }
                smin, smean = P._separation(qz.prototypes)
                r.update(S_min=smin, S_mean=smean)
                if isinstance(qz, P.PrototypeReadout):
                    r["terms"] = jnp.stack(P._loss_terms(qz.tokens(X), qz.prototypes, qz.temperature))
                return r

            _, hist = P.train(
                mod, lambda mm, xb: mm.loss(xb, lam=lam, beta=beta)[0], X, key=ktrain,
                eta_theta=cfg["vq_eps"] * cfg["vq_eta_P"], eta_P=cfg["vq_eta_P"], epochs=cfg["vq_epochs"],
                batch_size=cfg["vq_batch"], record=record, optimizer=cfg["optimizer"],
            )
            out[(kind, K)] = jax.tree_util.tree_map(np.asarray, hist)
            pbar.update(1)
    return out


# ---------------------------------------------------------------------------
# 3. hierarchical readout


def _hierarchical(cfg, key, pbar):
    kdata, kmod, ktrain = jax.random.split(key, 3)
    xs, _, classes, _ = P.gaussian_mixture_tokens(kdata, cfg["vq_sequences"], cfg["vq_seq_len"], cfg["vq_d"])
    model = P.HierarchicalReadout(
        cfg["vq_d"], cfg["hier_m"], cfg["hier_K1"], cfg["hier_K2"],
        cfg["hier_temperature1"], cfg["hier_temperature2"], key=kmod,
    )
    decoder = eqx.nn.Linear(cfg["hier_m"], cfg["vq_d"], key=jax.random.fold_in(kmod, 1))
    lam = cfg["hier_lam"]

    def loss(md, xb):
        mod, dec = md
        N, T, d = xb.shape
        z = mod.level1.tokens(xb.reshape(N * T, d))
        rec = jnp.mean(jnp.sum((xb.reshape(N * T, d) - jax.vmap(dec)(z)) ** 2, axis=-1))
        (L1, _, _), (L2, _, _) = mod.level_terms(xb)
        return rec + lam * (L1 + L2)

    def record(md):
        mod, _ = md
        t1, t2 = mod.level_terms(xs)
        q2 = jax.vmap(mod)(xs)
        return {"level1": jnp.stack(t1), "level2": jnp.stack(t2), "labels": jnp.argmax(q2, axis=-1)}

    _, hist = P.train(
        (model, decoder), loss, xs, key=ktrain, eta_theta=cfg["hier_eps"] * cfg["hier_eta_P"],
        eta_P=cfg["hier_eta_P"], epochs=cfg["hier_epochs"], batch_size=cfg["hier_batch"], record=record,
        optimizer=cfg["optimizer"],
    )
    hist = jax.tree_util.tree_map(np.asarray, hist)
    y = np.asarray(classes)
    hist["acc"] = np.array([P.clustering_accuracy(y, lab) for lab in hist["labels"]])
    hist["nmi"] = np.array([P.nmi(y, lab) for lab in hist["labels"]])
    pbar.update(1)
    return hist


# ---------------------------------------------------------------------------
# figures


def _rel_err(terms):
    terms = np.asarray(terms, dtype=np.float64)
    L_q, L_ols, V = terms[..., 0], terms[..., 1], terms[..., 2]
    return np.abs(L_q - L_ols - V) / np.abs(L_q)


def _fig_decomposition(path, dig, vq, hier, e_ref):
    h = dig["hist"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ep = np.arange(h["L_q"].shape[2])
    ax = axes[0]
    ax.stackplot(ep, h["L_OLS"][0, e_ref], h["V"][0, e_ref], labels=["$L_{OLS}$", "$V$"], alpha=0.7)
    ax.plot(ep, h["L_q"][0, e_ref], "k--", lw=1.5, label="$L_q$ (computed separately)")
    ax.set(title=f"digits, eps = {dig['eps'][e_ref]:g}", xlabel="epoch", ylabel="loss")
    ax.legend()
    soft16 = vq[("soft", min(k for (_, k) in vq))]["terms"]
    ax = axes[1]
    ep = np.arange(soft16.shape[0])
    ax.stackplot(ep, soft16[:, 1], soft16[:, 2], labels=["$L_{OLS}$", "$V$"], alpha=0.7)
    ax.plot(ep, soft16[:, 0], "k--", lw=1.5, label="$L_q$")
    ax.set(title="soft VQ on Gaussian-mixture tokens", xlabel="epoch")
    ax.legend()
    ax = axes[2]
    ep = np.arange(hier["level1"].shape[0])
    for lvl, c in (("level1", "C0"), ("level2", "C3")):
        t = hier[lvl]
        ax.plot(ep, t[:, 0], c, label=f"{lvl}: $L_q$")
        ax.plot(ep, t[:, 1], c + "--", label=f"{lvl}: $L_{{OLS}}$")
        ax.plot(ep, t[:, 2], c + ":", label=f"{lvl}: $V$")
    ax.set(title="hierarchical readout, both levels", xlabel="epoch", yscale="log")
    ax.legend(fontsize=7)
    fig.suptitle("Exact decomposition $L_q = L_{OLS} + V$ (MATH.md Sec. 4)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fig_utilization(path, vq):
    fig, ax = plt.subplots(figsize=(6, 4))
    for (kind, K), h in sorted(vq.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        style = {"soft": "-", "hard": "--"}.get(kind, ":")
        ax.plot(100 * h["utilization"], style, label=f"{kind}, K = {K}")
    ax.set(xlabel="epoch", ylabel="codebook utilisation (%)", ylim=(0, 105),
           title="utilisation (mean assignment > 0.01):\nsoft readout vs hard VQ (straight-through)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fig_ablation(path, dig):
    h, eps = dig["hist"], dig["eps"]
    smin = h["S_min"][:, :, -1]
    smean = h["S_mean"][:, :, -1]
    best_acc = h["acc"].max(axis=2)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.axvspan(eps.min() / 1.5, 0.1, color="g", alpha=0.1, label="stable: eps <= 0.1")
    ax.axvspan(0.5, eps.max() * 1.5, color="r", alpha=0.1, label="eps >= 0.5")
    ax.errorbar(eps, smin.mean(0), yerr=smin.std(0), marker="o", label="final S(P): min distance")
    ax.errorbar(eps, smean.mean(0), yerr=smean.std(0), marker="s", label="final S(P): mean distance")
    ax.set(xscale="log", xlabel=r"$\varepsilon = \eta_\theta / \eta_P$", ylabel="prototype separation")
    ax2 = ax.twinx()
    ax2.errorbar(eps, best_acc.mean(0), yerr=best_acc.std(0), color="k", marker="^", ls=":", label="best ACC")
    ax2.axhline(dig["kmeans"]["acc"], color="gray", lw=0.8, ls="--", label="k-means ACC (raw pixels)")
    ax2.set(ylabel="clustering accuracy", ylim=(0, 1))
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="lower left")
    ax.set_title("digits stability ablation (mean +- sd over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fig_phase(path, dig):
    h, eps = dig["hist"], dig["eps"]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    picks = sorted({0, int(np.argmin(np.abs(eps - 0.1))), len(eps) - 1})
    markers = ["o", "s", "^", "D"]
    for j, e in enumerate(picks):
        V = h["V"][0, e]
        S = h["S_min"][0, e]
        ax.plot(V, S, "-", color="gray", lw=0.6)
        sc = ax.scatter(V, S, c=np.arange(len(V)), cmap="viridis", marker=markers[j % 4], s=18,
                        label=f"eps = {eps[e]:g}")
    fig.colorbar(sc, ax=ax, label="epoch")
    ax.set(xlabel="V / N (V is already a mean over tokens)", ylabel="S(P): min pairwise distance",
           title="phase portrait (V/N, S(P)), digits, seed 0")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fig_pca(path, dig):
    z, p, y, pred = dig["z"], dig["p"], dig["y"], dig["pred"]
    mu = z.mean(0)
    _, _, vt = np.linalg.svd(z - mu, full_matrices=False)
    Z = (z - mu) @ vt[:2].T
    Pp = (p - mu) @ vt[:2].T
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, c, title in ((axes[0], y, "true digit"), (axes[1], pred, "prototype assignment")):
        ax.scatter(Z[:, 0], Z[:, 1], c=c, cmap="tab10", s=4, alpha=0.6)
        ax.scatter(Pp[:, 0], Pp[:, 1], marker="*", s=250, c="k", edgecolors="w")
        ax.set(title=f"PCA of tokens, coloured by {title}", xlabel="PC1", ylabel="PC2")
    fig.suptitle(f"digits tokens and prototypes (stars), eps = {dig['eps'][dig['e_ref']]:g}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------


def run(out_dir, *, quick: bool = False, quiet: bool = False, **options) -> dict:
    """Run the prototype-readout reproduction; write ``out_dir/prototypes/`` and return the summary.

    Three sizes: ``quick``, the default, and ``full=True`` (the paper's epoch
    counts). Other options override the entries of the settings (see
    ``_settings``), e.g. ``eps=[0.05, 1.0]`` or ``digits_epochs=100``.
    """
    cfg = _settings(quick, options)
    out = Path(out_dir) / _NAME
    out.mkdir(parents=True, exist_ok=True)
    timings: dict = {}
    key = jax.random.key(cfg["seed"])
    kdig, kvq, khier = jax.random.split(key, 3)
    t0 = time.perf_counter()
    total = 2 + 2 * len(cfg["vq_K"]) + 2
    with tqdm(total=total, desc="prototypes", disable=quiet) as pbar:
        with Timer(timings, "digits_ablation_s"):
            dig = _digits(cfg, kdig, pbar)
        with Timer(timings, "soft_vs_hard_vq_s"):
            vq = _vq(cfg, kvq, pbar)
        with Timer(timings, "hierarchical_s"):
            hier = _hierarchical(cfg, khier, pbar)

    h = dig["hist"]
    eps = dig["eps"]
    e_ref = dig["e_ref"]

    # --- decomposition identity, over every recorded epoch of every run
    dig_terms = np.stack([h["L_q"], h["L_OLS"], h["V"]], axis=-1)
    err_dig = float(_rel_err(dig_terms).max())
    err_vq = max(float(_rel_err(v["terms"]).max()) for (kind, _), v in vq.items() if kind.startswith("soft"))
    err_h1 = float(_rel_err(hier["level1"]).max())
    err_h2 = float(_rel_err(hier["level2"]).max())
    v_min = float(min(h["V"].min(), *(v["terms"][:, 2].min() for (k, _), v in vq.items() if k.startswith("soft")),
                      hier["level1"][:, 2].min(), hier["level2"][:, 2].min()))
    tol32 = 1e-5  # float32: a few ulps times the number of terms summed

    # --- utilisation
    K0 = cfg["vq_K"][0]
    u_soft = float(vq[("soft", K0)]["utilization"][-1])
    u_hard = float(vq[("hard", K0)]["utilization"][-1])

    # --- stability ablation: final separation averaged over seeds and the eps of each regime
    stable = eps <= 0.1 + 1e-9
    unstable = eps >= 0.5 - 1e-9
    smin_f = h["S_min"][:, :, -1]
    smean_f = h["S_mean"][:, :, -1]
    ratio_min = float(smin_f[:, stable].mean() / smin_f[:, unstable].mean())
    ratio_mean = float(smean_f[:, stable].mean() / smean_f[:, unstable].mean())
    best_acc = h["acc"].max(axis=2)  # (S, E)
    acc_stable = float(best_acc[:, stable].mean())
    acc_unstable = float(best_acc[:, unstable].mean())

    # --- digits clustering at the reference eps (best epoch, as the paper reports)
    i_best = h["acc"][:, e_ref].argmax(axis=1)  # per seed
    seeds = np.arange(h["acc"].shape[0])
    acc_ref = float(h["acc"][seeds, e_ref, i_best].mean())
    nmi_ref = float(h["nmi"][seeds, e_ref, i_best].mean())
    ari_ref = float(h["ari"][seeds, e_ref, i_best].mean())
    km = dig["kmeans"]

    checks = [
        check("loss_decomposition", max(err_dig, err_vq), 0.0, tol32,
              f"max over all epochs and runs (digits sweep, soft VQ) of |L_q - L_OLS - V| / L_q, float32; "
              f"digits {err_dig:.2e}, soft VQ {err_vq:.2e}"),
        check("codebook_utilization_soft", u_soft, 1.0, 0.0,
              f"soft readout, K = {K0}, fraction of prototypes with mean assignment > 0.01 after "
              f"{cfg['vq_epochs']} epochs; epoch 1 {vq[('soft', K0)]['utilization'][1]:.3f}, min over epochs "
              f"{vq[('soft', K0)]['utilization'].min():.3f}; final recon {vq[('soft', K0)]['recon'][-1]:.3f}, "
              f"final min separation {vq[('soft', K0)]['S_min'][-1]:.3f}; at half the temperature "
              f"({cfg['vq_temperature'] / 2:g}) the soft codebook ends at "
              f"{vq[('soft-half-temperature', K0)]['utilization'][-1]:.3f}"),
        check("codebook_utilization_hard", u_hard, None,
              note=f"hard VQ (straight-through), K = {K0}, same init/rates/budget; epoch 1 "
                   f"{vq[('hard', K0)]['utilization'][1]:.3f}, min over epochs "
                   f"{vq[('hard', K0)]['utilization'].min():.3f}; final recon {vq[('hard', K0)]['recon'][-1]:.3f}. "
                   "Paper: hard < soft; pass = hard <= soft",
              passed=u_hard <= u_soft),
        check("stability_ablation", ratio_min, None,
              note="final S(P) = min pairwise prototype distance, averaged over seeds and eps <= 0.1, "
                   "divided by the same over eps >= 0.5 (digits). Paper predicts > 1. "
                   f"Same ratio with the mean pairwise distance: {ratio_mean:.3f}",
              passed=lambda r: r > 1),
        check("stability_ablation_mean_distance", ratio_mean, None,
              note="as stability_ablation with S(P) = mean pairwise distance; predicted > 1",
              passed=lambda r: r > 1),
        check("stability_accuracy_ratio", acc_stable / acc_unstable, None,
              note=f"best-epoch ACC averaged over eps <= 0.1 ({acc_stable:.3f}) over eps >= 0.5 "
                   f"({acc_unstable:.3f}); paper: stable regime clusters better (> 1)",
              passed=lambda r: r > 1),
        check("variance_nonnegative", v_min, None,
              note="min of V over every epoch of every run (both hierarchy levels included); V >= 0",
              passed=lambda v: v >= 0),
        check("digits_clustering_accuracy", acc_ref, None,
              note=f"Hungarian ACC of argmax_k q at eps = {eps[e_ref]:g}, best epoch, mean over seeds; "
                   f"chance 0.1, k-means on raw pixels {km['acc']:.3f}; pass = ACC > 0.5",
              passed=lambda a: a > 0.5),
        check("digits_nmi", nmi_ref, None,
              note=f"NMI at the same epoch; k-means {km['nmi']:.3f}; pass = NMI > 0.3", passed=lambda a: a > 0.3),
        check("digits_ari", ari_ref, None,
              note=f"ARI at the same epoch; k-means {km['ari']:.3f}; pass = ARI > 0.2", passed=lambda a: a > 0.2),
        check("hierarchical_decomposition", max(err_h1, err_h2), 0.0, tol32,
              f"two-level readout, max over epochs of the relative violation at level 1 ({err_h1:.2e}) "
              f"and level 2 ({err_h2:.2e})"),
        check("hierarchical_level2_accuracy", float(hier["acc"][-1]), None,
              note=f"level-2 assignment of whole sequences vs their class ({cfg['hier_K2']} classes, "
                   f"chance {1 / cfg['hier_K2']:.2f}); final epoch; NMI {hier['nmi'][-1]:.3f}",
              passed=lambda a: a > 1.5 / cfg["hier_K2"]),
    ]

    figures = []
    with Timer(timings, "figures_s"):
        for fname, fn, args in (
            ("decomposition.png", _fig_decomposition, (dig, vq, hier, e_ref)),
            ("utilization.png", _fig_utilization, (vq,)),
            ("ablation.png", _fig_ablation, (dig,)),
            ("phase_portrait.png", _fig_phase, (dig,)),
            ("pca.png", _fig_pca, (dig,)),
        ):
            fn(out / fname, *args)
            figures.append(fname)

    np.savez_compressed(
        out / "data.npz",
        eps=eps, **{f"digits_{k}": v for k, v in h.items()},
        **{f"vq_{kind}_{K}_{k}": v for (kind, K), hh in vq.items() for k, v in hh.items()},
        **{f"hier_{k}": v for k, v in hier.items()},
        digits_tokens=dig["z"], digits_prototypes=dig["p"], digits_labels=dig["y"],
    )
    timings["total_s"] = round(time.perf_counter() - t0, 3)
    settings = dict(cfg)
    settings.update(
        digits_temperature=dig["temperature"],
        digits_kmeans=km,
        dtype="float32",
        digits_model="MLP autoencoder 64-64-m (gelu), decoder m-64-64; pre-trained on reconstruction, "
                     "prototypes initialised at the tokens of K random images",
        vq_model="linear encoder d->m, linear decoder m->d; soft decodes zhat, hard decodes the "
                 "straight-through code; prototypes ~ N(0, I/m), same init for both",
        hier_model="linear projection d->m, level-1 K1 prototypes, level-2 on the K1-dim sequence "
                   "summaries, loss = recon + lam (L_q1 + L_q2)",
    )
    return write_summary(out, _NAME, quick=quick, settings=settings, checks=checks, timings=timings,
                         figures=figures)
