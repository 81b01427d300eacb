r"""``meanfield reproduce depth``: rank collapse in Post-Norm versus Pre-Norm transformers.

Reproduces papers/post-norm-rank-collapse.txt (MATH.md Sec. 3) at laptop scale:

1. Forward amplification (paper Fig. 1): one-step token-similarity increments
   of the attention and FFN sublayers across depth, Post-Norm and Pre-Norm, for
   a sweep of ``sigma_w``; seeds are a vmapped axis of keys.
2. Prefix-averaging ablation (Fig. 2): similarity through depth when every
   attention matrix $P$ is replaced by $P - \alpha C_n$, $\alpha \in \{0, .25, .5, .75, 1\}$.
3. Training (Figs. 3-6): a small decoder LM trained with AdamW (0.9, 0.95, wd
   0.1, warmup + cosine decay, clip 1.0) on a seeded synthetic Zipf-Markov
   corpus, Post-Norm and Pre-Norm at matched settings over a learning-rate
   sweep (rates vmapped: one compilation per placement). Per layer and step:
   token similarity, RMSNorm factor $\sqrt{d} / \|y\|$, gradient contribution
   factors $\alpha_k$, contraction $c = \alpha \sqrt{d} / \|y\|$, gradient norms.

Sizes (found by a search on 2 CPU cores; see ``settings`` in the summary):

* quick (``--quick``; 45 s of CPU time, 70-100 s wall on 2 cores shared with
  other jobs): init stacks of depth 24, n = 64, d = 64, d_ff = 192, 4 heads,
  8 seeds; LM with depth 8, d = 32, d_ff = 96, 4 heads, vocab 64, sequence
  length 32, batch 8, 300 steps (30 warmup), sigma_w = 0.1, peak rates
  {2e-2, 3e-2, 5e-2}. Post-Norm trains at 2e-2 (and 1e-2, checked during the
  search) and collapses at 3e-2 after first learning (loss 3.1 -> 4.0, the
  frequency loss; transition near step 100-130 for seeds 0, 1, 2) and at 5e-2;
  Pre-Norm trains at every rate (final loss ~2.67, source entropy rate 2.59).
* default (neither flag): as quick with 48-layer init stacks, 16 seeds, 600 steps and
  rates {1e-2, 2e-2, 3e-2, 5e-2} (73 s of CPU time, ~5 min wall on a busy 2-core machine);
  Post-Norm collapses at 3e-2 (transition near step 186), not at 1e-2 or 2e-2.
* ``full=True`` (``--full``): paper-depth init stacks (depth 48, n = 128,
  d = 128, d_ff = 384, 32 seeds) and the same LM trained 5x longer (1500 steps,
  150 warmup) over a denser rate sweep {5e-3, 1e-2, 1.5e-2, 2e-2, 2.5e-2, 3e-2,
  4e-2, 5e-2}, locating the Post-Norm collapse threshold. Measured: 1296 s wall
  (about 22 min) at the lowest scheduling priority on a 2-core machine shared with
  other jobs, 4.7 min of CPU time (init experiments 855 s wall, training 435 s).
  Result: Post-Norm collapses at 3e-2, 4e-2, 5e-2 (transition near step 257 at
  3e-2, loss 4.018 vs frequency loss 4.015) and trains at <= 2.5e-2 (2.5e-2 is a
  degraded near-threshold run, loss ~3.1, no collapse); Pre-Norm trains at every rate.

Every size can be overridden through ``**options`` (keys of the settings dict).
"""

from __future__ import annotations

import math
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from tqdm.auto import tqdm

from .. import depth as D
from ._common import Timer, check, write_summary

__all__ = ["run"]

_NAME = "depth"

_QUICK = {
    "seed": 0,
    "init_depth": 24, "init_n": 64, "init_d": 64, "init_d_ff": 192, "init_heads": 4,
    "init_seeds": 8, "sigma_scales": [0.5, 1.0, 1.5], "alphas": [0.0, 0.25, 0.5, 0.75, 1.0],
    "vocab": 64, "zipf_exponent": 1.5, "zipf_mix": 0.9,
    "lm_depth": 8, "lm_d": 32, "lm_d_ff": 96, "lm_heads": 4, "seq_len": 32, "batch": 8,
    "steps": 300, "warmup": 30, "lm_sigma_w": 0.1, "lrs": [2e-2, 3e-2, 5e-2],
    "collapse_tsim": 0.9,
}
_DEFAULT = {**_QUICK, "init_depth": 48, "init_seeds": 16, "steps": 600, "warmup": 60,
           "lrs": [1e-2, 2e-2, 3e-2, 5e-2]}
_FULL = {
    **_QUICK, "init_depth": 48, "init_n": 128, "init_d": 128, "init_d_ff": 384, "init_seeds": 32,
    "steps": 1500, "warmup": 150, "lrs": [5e-3, 1e-2, 1.5e-2, 2e-2, 2.5e-2, 3e-2, 4e-2, 5e-2],
}


def run(out_dir, *, quick: bool = False, quiet: bool = False, full: bool = False, **options) -> dict:
    """Run the three experiments, write figures, data and ``summary.json`` under ``out_dir/depth``."""
    if quick and full:
        raise ValueError("choose at most one of quick=True and full=True")
    base = _QUICK if quick else _FULL if full else _DEFAULT
    unknown = set(options) - set(base)
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)}; accepted: {sorted(base)}")
    cfg = {**base, **options}
    out = Path(out_dir) / _NAME
    out.mkdir(parents=True, exist_ok=True)
    timings: dict = {}
    t_start = time.perf_counter()
    bar = tqdm(total=4, desc="depth", disable=quiet)
    key = jax.random.key(cfg["seed"])
    k_init, k_data, k_model = jax.random.split(key, 3)

    with Timer(timings, "init_experiments"):  # forward amplification and prefix ablation
        fwd, abl = _init_sweep(k_init, cfg)
    bar.update()
    with Timer(timings, "training"):
        tr = _training(k_data, k_model, cfg, bar)
    with Timer(timings, "figures"):
        figures = _figures(out, cfg, fwd, abl, tr)
    bar.update()
    bar.close()

    np.savez_compressed(out / "init.npz", **{f"forward_{k}": v for k, v in fwd.items()},
                        **{f"ablation_{k}": v for k, v in abl.items()})
    np.savez_compressed(out / "training.npz", **{
        f"{norm}_{k}": v for norm, h in tr["hist"].items() for k, v in h.items()},
        lrs=np.asarray(cfg["lrs"]))
    checks = _checks(cfg, fwd, abl, tr)
    timings["total"] = round(time.perf_counter() - t_start, 3)
    settings = {**cfg, "mode": "quick" if quick else "full" if full else "default",
                "init_sigma_w": [s / math.sqrt(cfg["init_d"]) for s in cfg["sigma_scales"]],
                "frequency_loss_labels": "all training labels aggregated (paper Sec. 4.3, approach 1)",
                "conditional_entropy_rate": tr["entropy_rate"],
                "positional_encoding": "none (causal mask only)",
                "collapsed_run": tr["collapsed"], "matched_runs": tr["matched"],
                "full_setting": "run(out, full=True) / --full: see module docstring; wall time in timings.total"}
    return write_summary(out, _NAME, quick=quick, settings=settings, checks=checks,
                         timings=timings, figures=figures)


# ----------------------------------------------------------------------------- experiments


def _init_kwargs(cfg):
    return {"depth": cfg["init_depth"], "n": cfg["init_n"], "d": cfg["init_d"],
            "d_ff": cfg["init_d_ff"], "heads": cfg["init_heads"]}


def _init_sweep(key, cfg):
    """Per-layer init statistics for the sigma_w sweep (alpha = 0) and the alpha sweep
    (sigma_w = 1/sqrt(d)) in ONE vmapped, jitted call per norm (traced sigma_w, alpha).

    Returns ``(fwd, abl)``: ``fwd`` arrays ``(norm, sigma, seed, depth)`` of the attention,
    FFN and RMSNorm increments and block-output similarity; ``abl`` ``t_out`` of shape
    ``(norm, alpha, seed, depth)`` and ``t_input`` ``(norm, alpha, seed)``.
    """
    kw = _init_kwargs(cfg)
    keys = jax.random.split(key, cfg["init_seeds"])
    ns, na = len(cfg["sigma_scales"]), len(cfg["alphas"])
    sig = np.concatenate([np.asarray(cfg["sigma_scales"], float), np.ones(na)]) / math.sqrt(cfg["init_d"])
    alp = np.concatenate([np.zeros(ns), np.asarray(cfg["alphas"], float)])
    fwd = {"attn": [], "ffn": [], "rms": [], "t_out": []}
    abl = {"t_out": [], "t_input": []}
    for norm in D.NORMS:
        one = partial(D.init_trace, norm=norm, **kw)
        f = jax.jit(jax.vmap(jax.vmap(lambda k, s, a, one=one: one(k, sigma_w=s, alpha_prefix=a),
                                      in_axes=(0, None, None)), in_axes=(None, 0, 0)))
        r = jax.tree_util.tree_map(np.asarray, f(keys, jnp.asarray(sig, jnp.float32),
                                                  jnp.asarray(alp, jnp.float32)))
        attn = r["t_y1"] - r["t_x1"]
        ffn = r["t_y2"] - r["t_x2"]
        inc = {"attn": attn, "ffn": ffn, "rms": r["t_out"] - r["t_x1"] - attn - ffn, "t_out": r["t_out"]}
        for k in fwd:
            fwd[k].append(inc[k][:ns])
        abl["t_out"].append(r["t_out"][ns:])
        abl["t_input"].append(r["t_input"][ns:])
    fwd = {k: np.stack(v) for k, v in fwd.items()}
    abl = {k: np.stack(v) for k, v in abl.items()}
    abl["alphas"] = np.asarray(cfg["alphas"])
    return fwd, abl


def _entropy_rate(T):
    T = np.asarray(T, dtype=np.float64)
    w, v = np.linalg.eig(T.T)
    pi = np.real(v[:, np.argmax(np.real(w))])
    pi = pi / pi.sum()
    return float(-pi @ np.sum(T * np.log(T), axis=1))


def _training(k_data, k_model, cfg, bar):
    V, steps, B, n = cfg["vocab"], cfg["steps"], cfg["batch"], cfg["seq_len"]
    k_src, k_tok = jax.random.split(k_data)
    T, p0 = D.zipf_markov_source(k_src, vocab=V, exponent=cfg["zipf_exponent"], mix=cfg["zipf_mix"])
    data = D.sample_tokens(k_tok, T, p0, batch=steps * B, length=n + 1).reshape(steps, B, n + 1)
    freq = float(D.frequency_loss(data[:, :, 1:], V))
    params = D.init_lm(k_model, vocab=V, depth=cfg["lm_depth"], d=cfg["lm_d"], d_ff=cfg["lm_d_ff"],
                       heads=cfg["lm_heads"], sigma_w=cfg["lm_sigma_w"])
    lrs = jnp.asarray(cfg["lrs"], jnp.float32)
    hist = {}
    for norm in D.NORMS:
        _, h = jax.vmap(lambda lr, norm=norm: D.train_lm(
            params, data, lr, norm=norm, heads=cfg["lm_heads"], warmup=cfg["warmup"]))(lrs)
        hist[norm] = jax.tree_util.tree_map(np.asarray, h)
        bar.update()
    # classify runs: collapsed = last-layer similarity above threshold over the final tenth
    tail = max(steps // 10, 1)
    status = {norm: [bool(np.mean(h["t_final"][i, -tail:]) > cfg["collapse_tsim"])
                     for i in range(len(cfg["lrs"]))] for norm, h in hist.items()}
    collapsed, matched = None, {}
    for i, lr in enumerate(cfg["lrs"]):
        if status["post"][i] and not status["pre"][i]:
            collapsed = {"norm": "post", "lr": lr, "index": i}
            matched["pre_same_lr"] = {"norm": "pre", "lr": lr, "index": i}
            lower = [j for j in range(i) if not status["post"][j]]
            if lower:
                matched["post_lower_lr"] = {"norm": "post", "lr": cfg["lrs"][lower[-1]], "index": lower[-1]}
            break
    if collapsed is not None:
        h = hist["post"]
        i = collapsed["index"]
        above = np.nonzero(h["t_final"][i] > cfg["collapse_tsim"])[0]
        collapsed["transition_step"] = int(above[0]) if above.size else None
        collapsed["min_loss_before"] = float(np.min(_smooth(h["loss"][i])[: max(int(above[0]), 1)]))
    return {"hist": hist, "freq_loss": freq, "entropy_rate": _entropy_rate(T), "status": status,
            "collapsed": collapsed, "matched": matched, "tail": tail}


def _smooth(x, k=10):
    x = np.asarray(x, dtype=np.float64)
    k = max(1, min(k, x.size))
    return np.convolve(x, np.ones(k) / k, mode="valid")


# ----------------------------------------------------------------------------- checks


def _checks(cfg, fwd, abl, tr):
    checks = []
    i1 = cfg["sigma_scales"].index(1.0) if 1.0 in cfg["sigma_scales"] else 0
    t_last = fwd["t_out"][:, i1, :, -1]  # (norm, seed)
    diff = float(np.mean(t_last[0]) - np.mean(t_last[1]))
    se = float(np.std(t_last[0] - t_last[1], ddof=1) / math.sqrt(t_last.shape[1]))
    checks.append(check(
        "post_vs_pre_similarity", diff, None, 0.0,
        f"last-layer t_sim at init, Post minus Pre (sigma_w = 1/sqrt(d), depth {cfg['init_depth']}, "
        f"{cfg['init_seeds']} seeds, std. error {se:.3g}); paper predicts > 0",
        passed=lambda m: m > 0))

    t_in = abl["t_input"][0]  # post, (alpha, seed)
    inc = np.mean(abl["t_out"][0, :, :, -1] - t_in, axis=1)  # per alpha
    a = list(cfg["alphas"])
    ratio = float(inc[a.index(1.0)] / inc[a.index(0.0)])
    checks.append(check(
        "prefix_ablation", ratio, None, 0.0,
        "Post-Norm last-layer similarity increase over the input, alpha = 1 divided by alpha = 0; "
        f"increases per alpha {np.round(inc, 4).tolist()}; paper predicts well below 1 (pass: < 0.5)",
        passed=lambda m: m < 0.5))
    checks.append(check(
        "prefix_ablation_monotone", float(np.max(np.diff(inc))), None, 0.0,
        "largest increase of the Post-Norm last-layer similarity between consecutive alphas "
        "(suppression is uniform in alpha: pass when <= 0)", passed=lambda m: m <= 0))

    att = fwd["attn"][:, i1]
    ffn = fwd["ffn"][:, i1]
    checks.append(check(
        "attention_increment_positive", float(np.mean(att[0])), None, 0.0,
        "mean over layers and seeds of the Post-Norm attention one-step increment "
        "t_sim(X + Attn) - t_sim(X) at sigma_w = 1/sqrt(d) (Thm 3.2: > 0)", passed=lambda m: m > 0))
    checks.append(check(
        "ffn_damping", float(np.mean(ffn[0]) / np.mean(att[0])), None, 0.0,
        "mean FFN increment over mean attention increment, Post-Norm (paper: FFN damps, "
        "ratio in (-1, 0); at this small d the damping is larger than in the paper)",
        passed=lambda m: -1 < m < 0))
    checks.append(check(
        "pre_first_layer_matches_post", float(np.mean(np.abs(att[0][:, 0] - att[1][:, 0]))), 0.0, 1e-5,
        "first-layer attention increment, |Post - Pre| (identical at layer 1: RMS-normalised input)"))

    freq = tr["freq_loss"]
    col = tr["collapsed"]
    tail = tr["tail"]
    found = col is not None
    checks.append(check(
        "collapse_found", float(found), None, 0.0,
        f"a Post-Norm run collapses (last-layer t_sim > {cfg['collapse_tsim']} over the last tenth) "
        f"while Pre-Norm at the same rate does not; status {tr['status']}, rates {cfg['lrs']}",
        passed=found))
    if found:
        hp = tr["hist"]["post"]
        i = col["index"]
        after = hp["loss"][i, -tail:]
        measured = float(np.mean(after))
        checks.append(check(
            "frequency_loss", measured, freq, 0.05,
            f"mean training loss of the collapsed Post-Norm run (lr {col['lr']}) over its last "
            f"{tail} steps (transition at step {col['transition_step']}); theory: entropy of the "
            f"label frequencies of all training labels (tolerance 0.05 nats)"))
        checks.append(check(
            "loss_jump", float(measured - col["min_loss_before"]), None, 0.0,
            "collapsed run: final loss minus its best (10-step smoothed) loss before the "
            "transition; the loss jumps up to the frequency loss (pass: > 0.2 nats)",
            passed=lambda m: m > 0.2))
        hpre = tr["hist"]["pre"]
        pre_loss = float(np.mean(hpre["loss"][i, -tail:]))
        checks.append(check(
            "matched_pre_beats_frequency_loss", pre_loss - freq, None, 0.0,
            f"Pre-Norm at the same rate: final loss minus frequency loss (pass: < -0.3; "
            f"entropy rate of the source {tr['entropy_rate']:.3f})", passed=lambda m: m < -0.3))
        # backward picture (Thm 3.6 / 3.8 ii): windows of `tail` steps before the transition
        # and at the end of the run
        t0 = col["transition_step"]
        before = slice(max(t0 - tail, 0), max(t0, 1))
        end = slice(-tail, None)

        def frac_below_one(win):
            c = np.stack([hp["c_attn"][i, win], hp["c_ffn"][i, win]], axis=-1)  # (steps, depth, 2)
            return float(np.mean(np.exp(np.mean(np.log(c), axis=0)) < 1))

        fb, fa = frac_below_one(before), frac_below_one(end)
        checks.append(check(
            "contraction_after_collapse", fa, None, 0.0,
            "collapsed run: fraction of (layer, sublayer) whose contraction c = alpha sqrt(d)/||y|| "
            f"(geometric mean over the window) is < 1 after collapse; before the transition {fb:.3f}. "
            "Paper: most sublayers cross below 1 (pass: larger than before)", passed=lambda m: m > fb))
        gs = hp["g_stream"][i]
        sb, sa = gs[before].mean(0), gs[end].mean(0)  # (depth,)
        checks.append(check(
            "backward_signal_after_collapse", float(sa[0] / sb[0]), None, 0.0,
            "collapsed run: ||dL/dX|| at the input of block 1 after collapse over before the "
            f"transition (per layer before {np.array2string(sb, precision=3)}, after "
            f"{np.array2string(sa, precision=3)}); the backward signal vanishes (pass: < 0.01)",
            passed=lambda m: m < 0.01))
        g = hp["grad_norm"][i]
        gb, ga = g[before].mean(0), g[end].mean(0)
        checks.append(check(
            "early_layer_gradient_after_collapse", float(ga[0] / gb[0]), None, 0.0,
            f"collapsed run: parameter-gradient norm of layer 1 after collapse ({ga[0]:.3g}) over before "
            f"the transition ({gb[0]:.3g}); gradients vanish in collapsed layers (pass: < 0.01)",
            passed=lambda m: m < 0.01))
        checks.append(check(
            "early_vs_last_layer_gradient", float(ga[0] / ga[-1]), None, 0.0,
            f"collapsed run after collapse: layer-1 over last-layer parameter-gradient norm "
            f"(before the transition {gb[0] / gb[-1]:.3g}); earlier layers get much weaker "
            "gradients (paper Fig. 5; pass: < 0.1)", passed=lambda m: m < 0.1))
    else:
        checks.append(check("frequency_loss", float("nan"), freq, 0.05,
                            "no collapsed Post-Norm run found at these settings"))
    return checks


# ----------------------------------------------------------------------------- figures


def _band(ax, y, x=None, label=None, color=None, ls="-"):
    y = np.asarray(y)
    m, s = y.mean(0), y.std(0)
    x = np.arange(1, y.shape[1] + 1) if x is None else x
    (line,) = ax.plot(x, m, ls, label=label, color=color)
    ax.fill_between(x, m - s, m + s, alpha=0.25, color=line.get_color())


def _figures(out, cfg, fwd, abl, tr):
    names = []
    # 1. forward amplification
    fig, axes = plt.subplots(2, 3, figsize=(13, 7), sharex=True)
    for r, norm in enumerate(D.NORMS):
        for j, s in enumerate(cfg["sigma_scales"]):
            lab = rf"$\sigma_w = {s:g}/\sqrt{{d}}$"
            _band(axes[r, 0], fwd["attn"][r, j], label=lab)
            _band(axes[r, 1], fwd["ffn"][r, j], label=lab)
            _band(axes[r, 2], fwd["t_out"][r, j], label=lab)
        axes[r, 0].set_ylabel(f"{norm}-norm")
    for c, title in enumerate(["attention increment", "FFN increment", "token similarity after block"]):
        axes[0, c].set_title(title)
        axes[1, c].set_xlabel("layer")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"Forward amplification at init (n={cfg['init_n']}, d={cfg['init_d']}, "
                 f"mean ± std over {cfg['init_seeds']} seeds)")
    fig.tight_layout()
    names.append(_save(fig, out, "forward_amplification.png"))

    # 2. prefix ablation
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for r, norm in enumerate(D.NORMS):
        for j, a in enumerate(cfg["alphas"]):
            _band(axes[r], abl["t_out"][r, j], label=rf"$\alpha = {a:g}$")
        axes[r].set_title(f"{norm}-norm: P -> P - alpha C_n")
        axes[r].set_xlabel("layer")
    axes[0].set_ylabel("token similarity")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    names.append(_save(fig, out, "prefix_ablation.png"))

    # 3. training curves
    hist, freq = tr["hist"], tr["freq_loss"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(cfg["lrs"])))
    for norm, ls in (("post", "-"), ("pre", "--")):
        for i, lr in enumerate(cfg["lrs"]):
            axes[0].plot(hist[norm]["loss"][i], ls, color=colors[i], lw=1, label=f"{norm} lr={lr:g}")
            axes[1].plot(hist[norm]["t_final"][i], ls, color=colors[i], lw=1)
    axes[0].axhline(freq, color="red", lw=1.5, ls=":", label=f"frequency loss {freq:.3f}")
    axes[0].axhline(tr["entropy_rate"], color="gray", lw=1, ls=":", label="source entropy rate")
    axes[0].set(xlabel="step", ylabel="training loss", title="loss (solid: Post-Norm, dashed: Pre-Norm)")
    axes[1].set(xlabel="step", ylabel="last-layer token similarity", title="last-layer t_sim")
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    names.append(_save(fig, out, "training_curves.png"))

    # 4. per-layer heatmaps over steps: collapsed run and its matched runs
    runs = []
    if tr["collapsed"] is not None:
        runs.append(("collapsed", tr["collapsed"]))
        runs += list(tr["matched"].items())
    else:
        runs = [(f"{norm} lr={cfg['lrs'][-1]:g}", {"norm": norm, "lr": cfg["lrs"][-1],
                                                  "index": len(cfg["lrs"]) - 1}) for norm in D.NORMS]
    qty = [("tsim", "token similarity", None),
           ("rms_attn", "RMS factor sqrt(d)/||y|| (attn)", None), ("c_attn", "c = alpha sqrt(d)/||y|| (attn)", "log"),
           ("rms_ffn", "RMS factor sqrt(d)/||y|| (FFN)", None), ("c_ffn", "c = alpha sqrt(d)/||y|| (FFN)", "log"),
           ("g_stream", "||dL/dX|| at block input", "log"), ("grad_norm", "parameter grad norm", "log")]
    fig, axes = plt.subplots(len(runs), len(qty), figsize=(3.6 * len(qty), 3 * len(runs)), squeeze=False)
    for r, (title, run) in enumerate(runs):
        h = hist[run["norm"]]
        for c, (k, lab, scale) in enumerate(qty):
            z = h[k][run["index"]].T  # (depth, steps)
            if scale == "log":
                z = np.log10(np.maximum(z, 1e-30))
            im = axes[r, c].imshow(z, aspect="auto", origin="lower", interpolation="nearest",
                                   extent=(0, z.shape[1], 0.5, z.shape[0] + 0.5))
            fig.colorbar(im, ax=axes[r, c])
            axes[r, c].set_title(f"{'log10 ' if scale == 'log' else ''}{lab}", fontsize=9)
            axes[r, c].set_xlabel("step")
        axes[r, 0].set_ylabel(f"{title}: {run['norm']} lr={run['lr']:g}\nlayer", fontsize=9)
    fig.tight_layout()
    names.append(_save(fig, out, "layer_heatmaps.png"))
    return names


def _save(fig, out, name):
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name
