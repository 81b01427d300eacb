/* Fused CPU kernel of the phase-diagram sweep (meanfield.phase_diagram, backend "native").
 *
 * Projected Euler steps of the SA / USA particle flow on the sphere for a batch of
 * seeds, in double (or float, with -DMF_FLOAT32), with the clustering count at
 * checkpoint steps:
 *
 *     g_ij = <x_i, x_j>,  w_ij = exp(beta g_ij - shift),
 *     F_i  = sum_j w_ij x_j / sum_j w_ij   (normalized)   or   (1/n) sum_j w_ij x_j,
 *     x_i <- normalize(x_i + h (F_i - <F_i, x_i> x_i)),
 *     count = #{(i, j): i != j, g_ij > threshold}   (before the step; at nsteps: final state).
 *
 * What XLA:CPU does not generate for this shape (n = 32, d = 2): one pass over the
 * pairs that forms g, the weight, the row sums, the field and the count together, with
 * only the n (n + 1) / 2 exponentials of the pairs i <= j (w is symmetric before the
 * row normalisation), and the whole time loop of a block of seeds in L1 cache.
 *
 * Layout: seeds are processed in blocks of LANES; inside a block the state is stored
 * as x[i][a] of vectors of LANES seeds (a GCC/Clang vector type), so that every operation
 * is a SIMD operation over the seeds; the exponentials of one row of pairs are evaluated
 * in one vectorised loop (glibc's libmvec under -ffast-math: about 60% of the time at
 * n = 32, d = 2). Memory per block: O(n d) vectors (the n x n weights are never stored).
 * Blocks are independent: OpenMP threads over blocks, each block run by one thread from start
 * to end, so the results are the same bits for any thread count and schedule (no sum crosses
 * blocks; tests/test_phase_diagram.py compares 1 and 2 threads).
 *
 * Built at first use by meanfield/_native/__init__.py with the system C compiler;
 * meanfield falls back to the XLA kernel when no compiler is available.
 */
#include <math.h>
#include <stdlib.h>

/* the float type: double (default; entry point mf_phase_run) or, compiled with
 * -DMF_FLOAT32, float (mf_phase_run_f32); LANES seeds fill one 64-byte vector */
#ifdef MF_FLOAT32
typedef float real;
typedef int ireal; /* the type of a lane of a comparison */
#define LANES 16
#define EXP expf
#define SQRT sqrtf
#define ENTRY mf_phase_run_f32
#else
typedef double real;
typedef long long ireal;
#define LANES 8
#define EXP exp
#define SQRT sqrt
#define ENTRY mf_phase_run
#endif

typedef struct {
    int n, d;
    double beta, shift, step, thr;
    int normalized;
} params;

/* SIMD vector of LANES reals (GCC/Clang vector extension: one zmm register with AVX-512,
 * two ymm with AVX2); the buffers are 64-byte aligned */
typedef real vd __attribute__((vector_size(LANES * sizeof(real)), aligned(LANES * sizeof(real))));
typedef ireal vl __attribute__((vector_size(LANES * sizeof(ireal)), aligned(LANES * sizeof(ireal))));

/* exponential of every element of a (vectorised by the compiler: glibc's libmvec) */
static void exp_inplace(real *restrict a, size_t len) {
    for (size_t k = 0; k < len; k++) a[k] = EXP(a[k]);
}

/* one Euler step of a block (x updated in place); cnt: the count of the state before the step.
 * Work arrays: F (n d), Z (n), P (n) vectors; d <= 64. Inlined into step_d2, step_d3
 * (compile-time d: the loops over coordinates unroll) and step_dn. */
static inline __attribute__((always_inline)) void step_any(vd *restrict x, const params *p, vd *restrict cnt,
                                                      vd *restrict F, vd *restrict Z, vd *restrict P,
                                                      const int d) {
    const int n = p->n;
    const vd zero = {0.0};
    const vd beta = zero + (real)p->beta, shift = zero + (real)p->shift, thr = zero + (real)p->thr;
    vd c = zero;
    for (int i = 0; i < n; i++) {
        Z[i] = zero;
        for (int a = 0; a < d; a++) F[(size_t)i * d + a] = zero;
    }
    /* row i against the columns j >= i: arguments beta <x_i, x_j> - shift into P (the count
     * of j > i on the way), their exponentials in one vectorised call, then w_ij added to
     * row i (in registers) and to row j (scattered) */
    for (int i = 0; i < n; i++) {
        const vd *restrict xi = x + (size_t)i * d;
        const int m = n - i; /* columns j = i, ..., n - 1 */
        for (int k = 0; k < m; k++) {
            const vd *restrict xj = xi + (size_t)k * d;
            vd g = xi[0] * xj[0];
            for (int a = 1; a < d; a++) g += xi[a] * xj[a];
            if (k > 0) c -= __builtin_convertvector((vl)(g > thr), vd); /* true is -1 */
            P[k] = beta * g - shift;
        }
        exp_inplace((real *)P, (size_t)m * LANES);
        vd zi = Z[i] + P[0];
        vd fi[64];
        for (int a = 0; a < d; a++) fi[a] = F[(size_t)i * d + a] + P[0] * xi[a];
        for (int k = 1; k < m; k++) {
            const vd *restrict xj = xi + (size_t)k * d;
            const vd w = P[k];
            zi += w;
            Z[i + k] += w;
            for (int a = 0; a < d; a++) {
                fi[a] += w * xj[a];
                F[(size_t)(i + k) * d + a] += w * xi[a];
            }
        }
        Z[i] = zi;
        for (int a = 0; a < d; a++) F[(size_t)i * d + a] = fi[a];
    }
    *cnt = (real)2 * c;
    /* field, tangent projection, Euler step, renormalisation */
    const vd step = zero + (real)p->step, inv_n = zero + (real)(1.0 / n);
    for (int i = 0; i < n; i++) {
        vd *restrict xi = x + (size_t)i * d;
        vd *restrict Fi = F + (size_t)i * d;
        const vd s = p->normalized ? (real)1 / Z[i] : inv_n;
        vd dot = zero, nn = zero;
        for (int a = 0; a < d; a++) {
            Fi[a] *= s;
            dot += Fi[a] * xi[a];
        }
        for (int a = 0; a < d; a++) {
            xi[a] += step * (Fi[a] - dot * xi[a]);
            nn += xi[a] * xi[a];
        }
        for (int l = 0; l < LANES; l++) nn[l] = (real)1 / SQRT(nn[l]);
        for (int a = 0; a < d; a++) xi[a] *= nn;
    }
}

/* count of ordered pairs i != j with g_ij > thr (the final state: no step) */
static void count_only(const vd *restrict x, const params *p, vd *restrict cnt) {
    const int n = p->n, d = p->d;
    const vd zero = {0.0};
    const vd thr = zero + (real)p->thr;
    vd c = zero;
    for (int i = 0; i < n - 1; i++)
        for (int j = i + 1; j < n; j++) {
            vd g = x[(size_t)i * d] * x[(size_t)j * d];
            for (int a = 1; a < d; a++) g += x[(size_t)i * d + a] * x[(size_t)j * d + a];
            c -= __builtin_convertvector((vl)(g > thr), vd); /* true is -1 */
        }
    *cnt = (real)2 * c;
}

static void step_d2(vd *x, const params *p, vd *cnt, vd *F, vd *Z, vd *P) { step_any(x, p, cnt, F, Z, P, 2); }
static void step_d3(vd *x, const params *p, vd *cnt, vd *F, vd *Z, vd *P) { step_any(x, p, cnt, F, Z, P, 3); }
static void step_dn(vd *x, const params *p, vd *cnt, vd *F, vd *Z, vd *P) { step_any(x, p, cnt, F, Z, P, p->d); }

/* seeds per block of this build (8 for double, 16 for float) */
int mf_lanes(void) { return LANES; }

/* Run nsteps Euler steps for every seed of x0 ((S, n, d) reals, row-major, S a multiple of LANES).
 * ckpt: the distinct checkpoint step indices, sorted ascending (nckpt of them, each in
 * [0, nsteps]); frac: (S, nckpt) fractions count / (n (n - 1)); xout: (S, n, d) final states.
 * Returns 0, or -1 on bad arguments / allocation failure. d <= 64. */
int ENTRY(const real *x0, int S, int n, int d, double beta, double shift, double step, int nsteps,
          const int *ckpt, int nckpt, double thr, int normalized, double *frac, real *xout, int nthreads) {
    if (S % LANES || n < 2 || d < 1 || d > 64 || nsteps < 0 || nckpt < 0) return -1;
    const params p = {n, d, beta, shift, step, thr, normalized};
    const int blocks = S / LANES;
    const double denom = (double)n * (double)(n - 1);
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads > 0 ? nthreads : 1) reduction(| : failed)
    for (int b = 0; b < blocks; b++) {
        const size_t vbytes = sizeof(vd);
        vd *x = aligned_alloc(64, (size_t)n * d * vbytes);
        vd *F = aligned_alloc(64, (size_t)n * d * vbytes);
        vd *Z = aligned_alloc(64, (size_t)n * vbytes);
        vd *P = aligned_alloc(64, (size_t)n * vbytes);
        if (!x || !F || !Z || !P) {
            free(x), free(F), free(Z), free(P);
            failed = 1;
            continue;
        }
        real *xs = (real *)x;
        const real *src = x0 + (size_t)b * LANES * n * d;
        for (int l = 0; l < LANES; l++)
            for (int i = 0; i < n; i++)
                for (int a = 0; a < d; a++) xs[((size_t)i * d + a) * LANES + l] = src[((size_t)l * n + i) * d + a];
        vd cnt;
        int next = 0;
        for (int k = 0; k <= nsteps; k++) {
            const int want = next < nckpt && ckpt[next] == k;
            if (k == nsteps) {
                if (want) count_only(x, &p, &cnt);
            } else if (d == 2) {
                step_d2(x, &p, &cnt, F, Z, P);
            } else if (d == 3) {
                step_d3(x, &p, &cnt, F, Z, P);
            } else {
                step_dn(x, &p, &cnt, F, Z, P);
            }
            if (want) {
                for (int l = 0; l < LANES; l++) frac[((size_t)b * LANES + l) * nckpt + next] = cnt[l] / denom;
                next++;
            }
        }
        real *dst = xout + (size_t)b * LANES * n * d;
        for (int l = 0; l < LANES; l++)
            for (int i = 0; i < n; i++)
                for (int a = 0; a < d; a++) dst[((size_t)l * n + i) * d + a] = xs[((size_t)i * d + a) * LANES + l];
        free(x), free(F), free(Z), free(P);
    }
    return failed ? -1 : 0;
}
