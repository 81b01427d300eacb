/* Fused CPU kernel of the phase-diagram sweep (meanfield.phase_diagram, backend "native").
 *
 * Projected Euler steps of the SA / USA particle flow on the sphere for a batch of
 * seeds, float64, with the clustering count at checkpoint steps:
 *
 *     g_ij = <x_i, x_j>,  w_ij = exp(beta g_ij - shift),
 *     F_i  = sum_j w_ij x_j / sum_j w_ij   (normalized)   or   (1/n) sum_j w_ij x_j,
 *     x_i <- normalize(x_i + h (F_i - <F_i, x_i> x_i)),
 *     count = #{(i, j): i != j, g_ij > threshold}   (before the step; at nsteps: final state).
 *
 * What XLA:CPU does not generate for this shape (n = 32, d = 2): one pass over the
 * pairs that forms g, the weight, the row sums, the field and the count together, with
 * only the n (n - 1) / 2 exponentials of the pairs i < j (w is symmetric before the
 * row normalisation), and the whole time loop of a block of seeds in L1 cache.
 *
 * Layout: seeds are processed in blocks of LANES; inside a block the state is stored
 * as x[i][a][lane] so that every operation is a SIMD operation over the lanes (seeds);
 * the exponentials of one row of pairs are evaluated in one vectorisable loop (glibc's
 * libmvec under -ffast-math). Blocks are independent: OpenMP threads over blocks.
 *
 * Built at first use by meanfield/_native/__init__.py with the system C compiler;
 * meanfield falls back to the XLA kernel when no compiler is available.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef LANES
#define LANES 8
#endif

typedef struct {
    int n, d;
    double beta, shift, step, thr;
    int normalized;
} params;

/* count of ordered pairs i != j with g_ij > thr, per lane (no step) */
static void count_only(const double *restrict x, const params *p, double *restrict cnt) {
    const int n = p->n, d = p->d;
    for (int l = 0; l < LANES; l++) cnt[l] = 0.0;
    for (int i = 0; i < n - 1; i++) {
        const double *restrict xi = x + (size_t)i * d * LANES;
        for (int j = i + 1; j < n; j++) {
            const double *restrict xj = x + (size_t)j * d * LANES;
            double g[LANES];
            for (int l = 0; l < LANES; l++) g[l] = xi[l] * xj[l];
            for (int a = 1; a < d; a++)
                for (int l = 0; l < LANES; l++) g[l] += xi[a * LANES + l] * xj[a * LANES + l];
            for (int l = 0; l < LANES; l++) cnt[l] += g[l] > p->thr ? 2.0 : 0.0;
        }
    }
}

/* one Euler step of a block (x updated in place); cnt: the count of the state before the step.
 * Work arrays: F (n d LANES), Z (n LANES), W (n LANES). D: compile-time d (0: runtime p->d). */
#define DEFINE_STEP(NAME, DCONST)                                                                \
    static void NAME(double *restrict x, const params *p, double *restrict cnt,                  \
                     double *restrict F, double *restrict Z, double *restrict W) {                \
        const int n = p->n;                                                                      \
        const int d = (DCONST) > 0 ? (DCONST) : p->d;                                            \
        const double beta = p->beta, shift = p->shift, thr = p->thr;                             \
        for (int l = 0; l < LANES; l++) cnt[l] = 0.0;                                            \
        /* diagonal terms w_ii = exp(beta |x_i|^2 - shift) */                                    \
        for (int i = 0; i < n; i++) {                                                            \
            const double *restrict xi = x + (size_t)i * d * LANES;                               \
            for (int l = 0; l < LANES; l++) {                                                    \
                double s = 0.0;                                                                  \
                for (int a = 0; a < d; a++) s += xi[a * LANES + l] * xi[a * LANES + l];          \
                W[i * LANES + l] = beta * s - shift;                                             \
            }                                                                                    \
        }                                                                                        \
        for (int k = 0; k < n * LANES; k++) W[k] = exp(W[k]);                                    \
        for (int i = 0; i < n; i++) {                                                            \
            const double *restrict xi = x + (size_t)i * d * LANES;                               \
            for (int l = 0; l < LANES; l++) {                                                    \
                const double w = W[i * LANES + l];                                               \
                Z[i * LANES + l] = w;                                                            \
                for (int a = 0; a < d; a++) F[(i * d + a) * LANES + l] = w * xi[a * LANES + l];  \
            }                                                                                    \
        }                                                                                        \
        /* pairs i < j: row i against the columns j > i */                                       \
        for (int i = 0; i < n - 1; i++) {                                                        \
            const int m = n - i - 1;                                                             \
            const double *restrict xi = x + (size_t)i * d * LANES;                               \
            const double *restrict xj = x + (size_t)(i + 1) * d * LANES;                         \
            for (int j = 0; j < m; j++) {                                                        \
                double g[LANES];                                                                 \
                for (int l = 0; l < LANES; l++) g[l] = xi[l] * xj[(j * d) * LANES + l];          \
                for (int a = 1; a < d; a++)                                                      \
                    for (int l = 0; l < LANES; l++)                                              \
                        g[l] += xi[a * LANES + l] * xj[(j * d + a) * LANES + l];                 \
                for (int l = 0; l < LANES; l++) {                                                \
                    cnt[l] += g[l] > thr ? 2.0 : 0.0;                                            \
                    W[j * LANES + l] = beta * g[l] - shift;                                      \
                }                                                                                \
            }                                                                                    \
            for (int k = 0; k < m * LANES; k++) W[k] = exp(W[k]);                                \
            double zi[LANES] = {0.0};                                                            \
            double fib[((DCONST) > 0 ? (DCONST) : 64) * LANES];                                  \
            for (int k = 0; k < d * LANES; k++) fib[k] = 0.0;                                    \
            double *restrict Zj = Z + (size_t)(i + 1) * LANES;                                   \
            double *restrict Fj = F + (size_t)(i + 1) * d * LANES;                               \
            for (int j = 0; j < m; j++) {                                                        \
                for (int l = 0; l < LANES; l++) {                                                \
                    zi[l] += W[j * LANES + l];                                                   \
                    Zj[j * LANES + l] += W[j * LANES + l];                                       \
                }                                                                                \
                for (int a = 0; a < d; a++)                                                      \
                    for (int l = 0; l < LANES; l++) {                                            \
                        fib[a * LANES + l] += W[j * LANES + l] * xj[(j * d + a) * LANES + l];    \
                        Fj[(j * d + a) * LANES + l] += W[j * LANES + l] * xi[a * LANES + l];     \
                    }                                                                            \
            }                                                                                    \
            for (int l = 0; l < LANES; l++) Z[i * LANES + l] += zi[l];                           \
            for (int k = 0; k < d * LANES; k++) F[(size_t)i * d * LANES + k] += fib[k];          \
        }                                                                                        \
        /* field, tangent projection, Euler step, renormalisation */                             \
        for (int i = 0; i < n; i++) {                                                            \
            double *restrict xi = x + (size_t)i * d * LANES;                                     \
            double *restrict Fi = F + (size_t)i * d * LANES;                                     \
            double s[LANES], dot[LANES], nn[LANES];                                              \
            for (int l = 0; l < LANES; l++) {                                                    \
                s[l] = p->normalized ? 1.0 / Z[i * LANES + l] : 1.0 / n;                         \
                dot[l] = 0.0;                                                                    \
                nn[l] = 0.0;                                                                     \
            }                                                                                    \
            for (int a = 0; a < d; a++)                                                          \
                for (int l = 0; l < LANES; l++) {                                                \
                    Fi[a * LANES + l] *= s[l];                                                   \
                    dot[l] += Fi[a * LANES + l] * xi[a * LANES + l];                             \
                }                                                                                \
            for (int a = 0; a < d; a++)                                                          \
                for (int l = 0; l < LANES; l++) {                                                \
                    const double y = xi[a * LANES + l] +                                         \
                                     p->step * (Fi[a * LANES + l] - dot[l] * xi[a * LANES + l]); \
                    xi[a * LANES + l] = y;                                                       \
                    nn[l] += y * y;                                                              \
                }                                                                                \
            for (int l = 0; l < LANES; l++) nn[l] = 1.0 / sqrt(nn[l]);                           \
            for (int a = 0; a < d; a++)                                                          \
                for (int l = 0; l < LANES; l++) xi[a * LANES + l] *= nn[l];                      \
        }                                                                                        \
    }

DEFINE_STEP(step_d2, 2)
DEFINE_STEP(step_d3, 3)
DEFINE_STEP(step_dn, 0)

/* Run nsteps Euler steps for every seed of x0 ((S, n, d), row-major, S a multiple of LANES).
 * ckpt: the distinct checkpoint step indices, sorted ascending (nckpt of them, each in
 * [0, nsteps]); frac: (nckpt, S) fractions count / (n (n - 1)); xout: (S, n, d) final states.
 * Returns 0, or -1 on bad arguments / allocation failure. d <= 64. */
int mf_phase_run(const double *x0, int S, int n, int d, double beta, double shift, double step,
                 int nsteps, const int *ckpt, int nckpt, double thr, int normalized, double *frac,
                 double *xout, int nthreads) {
    if (S % LANES || n < 2 || d < 1 || d > 64 || nsteps < 0 || nckpt < 0) return -1;
    const params p = {n, d, beta, shift, step, thr, normalized};
    const int blocks = S / LANES;
    const double denom = (double)n * (double)(n - 1);
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads > 0 ? nthreads : 1) reduction(| : failed)
    for (int b = 0; b < blocks; b++) {
        const size_t sz = (size_t)n * d * LANES;
        double *x = aligned_alloc(64, ((sz * 8 + 63) / 64) * 64);
        double *F = aligned_alloc(64, ((sz * 8 + 63) / 64) * 64);
        double *Z = aligned_alloc(64, (((size_t)n * LANES * 8 + 63) / 64) * 64);
        double *W = aligned_alloc(64, (((size_t)n * LANES * 8 + 63) / 64) * 64);
        if (!x || !F || !Z || !W) {
            free(x), free(F), free(Z), free(W);
            failed = 1;
            continue;
        }
        const double *src = x0 + (size_t)b * LANES * n * d;
        for (int l = 0; l < LANES; l++)
            for (int i = 0; i < n; i++)
                for (int a = 0; a < d; a++) x[((size_t)i * d + a) * LANES + l] = src[((size_t)l * n + i) * d + a];
        double cnt[LANES];
        int next = 0;
        for (int k = 0; k <= nsteps; k++) {
            const int want = next < nckpt && ckpt[next] == k;
            if (k == nsteps) {
                if (want) count_only(x, &p, cnt);
            } else if (d == 2) {
                step_d2(x, &p, cnt, F, Z, W);
            } else if (d == 3) {
                step_d3(x, &p, cnt, F, Z, W);
            } else {
                step_dn(x, &p, cnt, F, Z, W);
            }
            if (want) {
                for (int l = 0; l < LANES; l++) frac[(size_t)next * S + (size_t)b * LANES + l] = cnt[l] / denom;
                next++;
            }
        }
        double *dst = xout + (size_t)b * LANES * n * d;
        for (int l = 0; l < LANES; l++)
            for (int i = 0; i < n; i++)
                for (int a = 0; a < d; a++) dst[((size_t)l * n + i) * d + a] = x[((size_t)i * d + a) * LANES + l];
        free(x), free(F), free(Z), free(W);
    }
    return failed ? -1 : 0;
}
