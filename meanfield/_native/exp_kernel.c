/* Fused CPU kernel of the exp-kernel field (meanfield.kernels: USA and, in the gauge frame,
 * RoPE, PhaseField, Gauge, Prompt), called from XLA through the FFI (jax.ffi).
 *
 * For each system b of a batch (x: (..., n, d), beta: (...)):
 *
 *     w_ij = exp(beta_b (<x_i, x_j> - 1)),
 *     F_i  = (1/n) sum_j w_ij x_j,          S = sum_ij w_ij,
 *
 * the unscaled results of kernels._exp._tiled_exp_unit (the factor e^{beta - shift} is applied
 * in JAX). w is symmetric: only the pairs i <= j are evaluated (n (n + 1) / 2 exponentials),
 * each added to row i and to row j. The tangent of F along dy (mf_exp_tangent, FFI target
 * meanfield_exp_t_*, for derivatives) is evaluated the same way (see its comment).
 *
 * What XLA:CPU does not generate: the Gram entries, the exponentials, the row sums and both
 * products with x in one pass over a block of rows, with memory O(n d) per thread (the
 * n x n weights are never stored: no cache misses, no fresh pages for large temporaries).
 *
 * Layout: a system is stored transposed, xt[a][j] (coordinates a, particles j padded to a
 * multiple of LANES), so that the columns j of a row are SIMD lanes. Rows are taken RB = 4
 * at a time against all columns j >= i: (1) the arguments beta (<x_i, x_j> - 1) of the RB
 * rows into a buffer, (2) their exponentials in one vectorised loop (glibc's libmvec under
 * -ffast-math), (3) the pairs j <= i masked to zero, then the products: acc_ra += w_rj x_aj
 * (row sums in registers) and Ft_aj += w_rj x_ra (the symmetric half), coordinates AC = 4 at
 * a time so that the accumulators stay in registers. The diagonal w_ii is added once.
 * Accuracy: partial sums in the kernel's dtype cover at most VCH vectors of columns or FLUSH
 * rows, then continue in double (float32 results stay at float32 rounding for large n).
 * Parallel (OpenMP) over the systems of the batch; a batch smaller than the thread count with
 * n > 4 FLUSH runs each system's windows of FLUSH rows in parallel. The thread count of each
 * call adapts to the machine's load (threads_now: no more threads than the CPUs other processes
 * leave idle), so no sum depends on it: a system of n > 4 FLUSH rows, whichever branch runs it,
 * deals its windows to a fixed number of virtual workers (workers_of(n, d)), each with its own
 * double buffer and weight sum, added up in worker order (see large_system). The results are
 * the same bits for any thread count, schedule and call (tests/test_native_determinism.py).
 * Gauge matrices G (optional): the system is loaded as y_i = G_i x_i and the field stored as
 * G_i^T F_i.
 *
 * Built when meanfield.kernels is first imported on a machine (cached), by
 * meanfield/_native/__init__.py with the system C compiler and the
 * FFI headers that jaxlib ships (jax.ffi.include_dir()); without them, meanfield uses the
 * XLA formulation, which stays the reference this kernel is tested against.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "xla/ffi/api/c_api.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef MF_FLOAT32
typedef float real;
typedef int ireal;
#define LANES 16
#define EXP expf
#define SUFFIX(name) name##_f32
#define FFI_DTYPE XLA_FFI_DataType_F32
#else
typedef double real;
typedef long long ireal;
#define LANES 8
#define EXP exp
#define SUFFIX(name) name##_f64
#define FFI_DTYPE XLA_FFI_DataType_F64
#endif

#define RB 4 /* rows per block */
#define AC 4 /* coordinates per pass of the products */
#define VCH 64 /* vectors per partial sum in the kernel's dtype (then double) */
#define FLUSH 128 /* rows per partial sum of the symmetric half in the kernel's dtype (multiple of RB) */
#define MAX_D 64

typedef real vr __attribute__((vector_size(LANES * sizeof(real)), aligned(LANES * sizeof(real))));
typedef ireal vi __attribute__((vector_size(LANES * sizeof(ireal)), aligned(LANES * sizeof(ireal))));

static int n_threads = 1;
static int adaptive = 1;

/* ---- threads of a call on a loaded machine -------------------------------------------------
 * On a machine whose CPUs other processes keep busy, a team of threads waits at the end of a
 * call for its member that waits for a CPU (a scheduler time slice, milliseconds): 2 threads
 * took 8-11 ms where 1 thread took 1.7 ms (n = 2048, 2 cores, 2 busy processes). So each call
 * takes no more threads than the CPUs of this process that other processes left idle: measured
 * over the last >= 100 ms as the non-idle time of those CPUs (/proc/stat) minus this process's
 * own CPU time (its threads, spinning OpenMP workers and XLA's included), at least 1.
 * A long call (more than LONG_CALL units of work, pairs x (2 d + 4): about 8 ms of one CPU) takes
 * all its threads whatever the load: dynamic scheduling keeps them busy, a late thread delays
 * the end by one system or one virtual worker (its windows of 128 rows; a large system has at
 * most 32 workers), and on a loaded machine each thread is a share of the CPUs
 * (n = 4096, d = 16 on 2 loaded cores: 2 threads 98 ms, 1 thread 139 ms). */
#define LONG_CALL 1.2e8

static int load_estimate = -1;    /* CPUs left idle for this process, -1: unknown */
static int sampling = 0;          /* a sample is being taken (try-lock) */
static long long prev_wall = 0; /* ns, CLOCK_MONOTONIC; 0: no sample yet */
static double prev_busy = 0, prev_own = 0;
static int prev_cpus = 0;

static long long nanoseconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#ifdef __linux__
/* non-idle seconds of the CPUs of this process since boot (/proc/stat), and how many CPUs; -1 if unknown */
static double busy_seconds(int *cpus) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
    *cpus = CPU_COUNT(&set);
    const int fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (ssize_t r; buf; len += (size_t)r) {
        if (len == cap) {
            char *more = cap < (1 << 24) ? realloc(buf, 2 * cap + 1) : NULL;
            if (!more) break;
            buf = more, cap *= 2;
        }
        r = read(fd, buf + len, cap - len);
        if (r <= 0) break;
    }
    close(fd);
    if (!buf) return -1;
    buf[len] = 0;
    const long hz = sysconf(_SC_CLK_TCK);
    double busy = 0;
    int seen = 0;
    for (char *line = buf; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, "cpu", 3) != 0 || line[3] < '0' || line[3] > '9') continue;
        char *p = line + 3;
        const long id = strtol(p, &p, 10);
        if (id < 0 || id >= CPU_SETSIZE || !CPU_ISSET(id, &set)) continue;
        /* user nice system idle iowait irq softirq steal */
        unsigned long long v[8] = {0};
        for (int k = 0; k < 8; k++) v[k] = strtoull(p, &p, 10);
        busy += (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
        seen++;
    }
    free(buf);
    return seen == *cpus && hz > 0 ? busy / (double)hz : -1;
}
#else
static double busy_seconds(int *cpus) {
    *cpus = 0;
    return -1;
}
#endif

/* a new sample if the last one is at least 100 ms old (one thread at a time; the others keep the estimate) */
static void sample_load(void) {
    const long long now = nanoseconds(CLOCK_MONOTONIC);
    const long long last = __atomic_load_n(&prev_wall, __ATOMIC_RELAXED);
    if (last > 0 && now - last < 100000000LL) return;
    if (__atomic_exchange_n(&sampling, 1, __ATOMIC_ACQUIRE)) return;
    int cpus = 0;
    const double busy = busy_seconds(&cpus), own = 1e-9 * (double)nanoseconds(CLOCK_PROCESS_CPUTIME_ID);
    if (busy < 0) {
        __atomic_store_n(&load_estimate, -1, __ATOMIC_RELAXED);
    } else if (prev_wall > 0 && cpus == prev_cpus && now > prev_wall) {
        double others = (busy - prev_busy - (own - prev_own)) / (1e-9 * (double)(now - prev_wall));
        if (others < 0) others = 0;
        const int idle = (int)((double)cpus - others + 0.5);
        __atomic_store_n(&load_estimate, idle < 1 ? 1 : idle, __ATOMIC_RELAXED);
    }
    prev_busy = busy, prev_own = own, prev_cpus = cpus;
    __atomic_store_n(&prev_wall, now, __ATOMIC_RELAXED);
    __atomic_store_n(&sampling, 0, __ATOMIC_RELEASE);
}

/* most threads of later calls (the loader passes OMP_NUM_THREADS, or the CPUs of the process
 * divided by its CPU devices); takes a first sample of the load */
void SUFFIX(mf_exp_set_threads)(int t) {
    __atomic_store_n(&n_threads, t > 0 ? t : 1, __ATOMIC_RELAXED);
    sample_load();
}

/* adapt the threads of each call to the machine's load (1, the default) or use them all (0) */
void SUFFIX(mf_exp_set_adaptive)(int on) { __atomic_store_n(&adaptive, on != 0, __ATOMIC_RELAXED); }

/* the threads of a call of `work` units: n_threads, or fewer while adaptive (see above) */
static int threads_now(double work) {
    const int most = __atomic_load_n(&n_threads, __ATOMIC_RELAXED);
    if (most <= 1 || !__atomic_load_n(&adaptive, __ATOMIC_RELAXED) || work > LONG_CALL) return most;
    sample_load();
    const int idle = __atomic_load_n(&load_estimate, __ATOMIC_RELAXED);
    return idle < 1 || idle >= most ? most : idle;
}

/* the threads a call of `work` units (pairs x (2 d + 4)) would use now (meanfield.info, tests) */
int SUFFIX(mf_exp_threads_now)(double work) { return threads_now(work); }

int SUFFIX(mf_exp_lanes)(void) { return LANES; }

static inline real hsum(vr v) {
    real s = 0;
    for (int l = 0; l < LANES; l++) s += v[l];
    return s;
}

/* Rows i0 .. i0 + RB - 1 (those >= hi are absent) of one system against the columns j >= i0:
 * adds the strict upper pairs w_ij x_i to the columns' Ft (transposed layout, d rows of nv
 * vectors; the caller flushes it into FD every FLUSH rows), the rows' sums sum_j w_ij x_j to
 * FD (double, d rows of nv * LANES) and returns the weight sum of the pairs. Sums run in the
 * kernel's dtype over at most VCH vectors (and Ft over at most FLUSH rows), then in double:
 * float32 keeps its accuracy at n = 2^17. P: RB * nv work vectors. d is a compile-time
 * constant in the specialisations below. */
static inline __attribute__((always_inline)) double row_block(const vr *restrict xt, const int n, const int nv,
                                                              const int d, const real beta, const int i0,
                                                              const int hi, const int field, vr *restrict Ft,
                                                              double *restrict FD, vr *restrict P) {
    const real *xs = (const real *)xt;
    const size_t np = (size_t)nv * LANES;
    const vr zero = {0};
    const vr vb = zero + beta;
    const int v0 = i0 / LANES;
    const int m = nv - v0;
    real xi[RB][MAX_D];
    for (int r = 0; r < RB; r++)
        for (int a = 0; a < d; a++) xi[r][a] = i0 + r < hi ? xs[(size_t)a * np + i0 + r] : 0;
    /* (1) arguments of the exponentials */
    for (int v = v0; v < nv; v++) {
        vr dot[RB];
        for (int r = 0; r < RB; r++) dot[r] = zero;
        for (int a = 0; a < d; a++) {
            const vr xa = xt[(size_t)a * nv + v];
            for (int r = 0; r < RB; r++) dot[r] += xi[r][a] * xa;
        }
        for (int r = 0; r < RB; r++) P[(size_t)r * nv + v] = vb * dot[r] - vb;
    }
    /* (2) exponentials (libmvec) */
    for (int r = 0; r < RB; r++) {
        real *restrict p = (real *)(P + (size_t)r * nv + v0);
        for (int k = 0; k < m * LANES; k++) p[k] = EXP(p[k]);
    }
    /* (3) zero the pairs j <= i (first vectors), the padding j >= n (last vector) and absent rows */
    vi lane;
    for (int l = 0; l < LANES; l++) lane[l] = l;
    const int vlast = (i0 + RB - 1) / LANES < nv ? (i0 + RB - 1) / LANES : nv - 1;
    for (int r = 0; r < RB; r++) {
        const vi i = (vi){0} + (ireal)(i0 + r < hi ? i0 + r : n);
        for (int v = v0; v <= vlast; v++) {
            const vi j = lane + (ireal)(v * LANES);
            P[(size_t)r * nv + v] = (vr)((vi)P[(size_t)r * nv + v] & (j > i));
        }
        const vi j = lane + (ireal)((nv - 1) * LANES);
        P[(size_t)r * nv + nv - 1] = (vr)((vi)P[(size_t)r * nv + nv - 1] & (j < (vi){0} + (ireal)n));
    }
    double sum = 0;
    for (int c = v0; c < nv; c += VCH) {
        const int ce = c + VCH < nv ? c + VCH : nv;
        vr sv = zero;
        for (int r = 0; r < RB; r++)
            for (int v = c; v < ce; v++) sv += P[(size_t)r * nv + v];
        sum += hsum(sv);
    }
    if (!field) return sum;
    /* (4) products: row sums acc[r][k] in registers, the symmetric half into Ft */
    for (int a0 = 0; a0 < d; a0 += AC) {
        double accd[RB][AC] = {{0}};
        for (int c = v0; c < nv; c += VCH) {
            const int ce = c + VCH < nv ? c + VCH : nv;
            vr acc[RB][AC];
            for (int r = 0; r < RB; r++)
                for (int k = 0; k < AC; k++) acc[r][k] = zero;
            for (int v = c; v < ce; v++) {
                vr w[RB];
                for (int r = 0; r < RB; r++) w[r] = P[(size_t)r * nv + v];
                for (int k = 0; k < AC; k++) {
                    if (a0 + k >= d) break;
                    const vr xa = xt[(size_t)(a0 + k) * nv + v];
                    vr f = Ft[(size_t)(a0 + k) * nv + v];
                    for (int r = 0; r < RB; r++) {
                        acc[r][k] += w[r] * xa;
                        f += w[r] * xi[r][a0 + k];
                    }
                    Ft[(size_t)(a0 + k) * nv + v] = f;
                }
            }
            for (int r = 0; r < RB; r++)
                for (int k = 0; k < AC; k++) accd[r][k] += hsum(acc[r][k]);
        }
        for (int r = 0; r < RB && i0 + r < hi; r++)
            for (int k = 0; k < AC && a0 + k < d; k++) FD[(size_t)(a0 + k) * np + i0 + r] += accd[r][k];
    }
    return sum;
}

typedef double (*row_block_fn)(const vr *, int, int, int, real, int, int, int, vr *, double *, vr *);

#define SPECIALISE(D)                                                                                        \
    static double row_block_##D(const vr *xt, int n, int nv, int d, real beta, int i0, int hi, int field,   \
                                vr *Ft, double *FD, vr *P) {                                                \
        (void)d;                                                                                            \
        return row_block(xt, n, nv, D, beta, i0, hi, field, Ft, FD, P);                                     \
    }
SPECIALISE(2)
SPECIALISE(3)
SPECIALISE(4)
SPECIALISE(8)
SPECIALISE(16)
static double row_block_any(const vr *xt, int n, int nv, int d, real beta, int i0, int hi, int field, vr *Ft,
                            double *FD, vr *P) {
    return row_block(xt, n, nv, d, beta, i0, hi, field, Ft, FD, P);
}

static row_block_fn pick(int d) {
    switch (d) {
        case 2: return row_block_2;
        case 3: return row_block_3;
        case 4: return row_block_4;
        case 8: return row_block_8;
        case 16: return row_block_16;
        default: return row_block_any;
    }
}

/* FD += Ft over the vectors v0 .. nv - 1 (Ft is zero below v0), and Ft = 0 there */
static void flush(vr *restrict Ft, double *restrict FD, int nv, int d, int v0) {
    const size_t np = (size_t)nv * LANES;
    for (int a = 0; a < d; a++) {
        real *restrict f = (real *)(Ft + (size_t)a * nv);
        double *restrict g = FD + (size_t)a * np;
        for (size_t j = (size_t)v0 * LANES; j < np; j++) {
            g[j] += f[j];
            f[j] = 0;
        }
    }
}

/* the diagonal terms w_ii of rows lo .. hi - 1: added to FD and returned as a sum */
static double diagonal(const vr *xt, int nv, int d, real beta, int lo, int hi, int field, double *FD) {
    const real *xs = (const real *)xt;
    const size_t np = (size_t)nv * LANES;
    double s = 0;
    for (int i = lo; i < hi; i++) {
        real g = 0;
        for (int a = 0; a < d; a++) g += xs[(size_t)a * np + i] * xs[(size_t)a * np + i];
        const real w = EXP(beta * g - beta);
        s += w;
        if (field)
            for (int a = 0; a < d; a++) FD[(size_t)a * np + i] += (double)w * xs[(size_t)a * np + i];
    }
    return s;
}

/* xt = the system transposed, y_i = G_i x_i when gauge matrices G (n, d, d) are given */
static void load_transposed(const real *x, const real *G, int n, int nv, int d, vr *xt) {
    real *xs = (real *)xt;
    memset(xt, 0, sizeof(vr) * (size_t)d * nv);
    for (int i = 0; i < n; i++) {
        if (!G) {
            for (int a = 0; a < d; a++) xs[(size_t)a * nv * LANES + i] = x[(size_t)i * d + a];
            continue;
        }
        const real *Gi = G + (size_t)i * d * d;
        for (int a = 0; a < d; a++) {
            real y = 0;
            for (int c = 0; c < d; c++) y += Gi[(size_t)a * d + c] * x[(size_t)i * d + c];
            xs[(size_t)a * nv * LANES + i] = y;
        }
    }
}

/* F_i = FD_i / n, back in the original frame (G_i^T FD_i / n) when G is given */
static void store_field(const double *FD, const real *G, int n, int nv, int d, real *F) {
    const double inv = 1.0 / (double)n;
    const size_t np = (size_t)nv * LANES;
    for (int i = 0; i < n; i++) {
        if (!G) {
            for (int a = 0; a < d; a++) F[(size_t)i * d + a] = (real)(FD[(size_t)a * np + i] * inv);
            continue;
        }
        const real *Gi = G + (size_t)i * d * d;
        for (int c = 0; c < d; c++) {
            double f = 0;
            for (int a = 0; a < d; a++) f += (double)Gi[(size_t)a * d + c] * FD[(size_t)a * np + i];
            F[(size_t)i * d + c] = (real)(f * inv);
        }
    }
}

/* the rows of the row blocks b0, b0 + step, ... of one system (flushing Ft every FLUSH rows) */
static double run_rows(row_block_fn rows, const vr *xt, int n, int nv, int d, real beta, int field, vr *Ft,
                       double *FD, vr *P, int i_lo, int i_hi) {
    double t = 0;
    for (int f0 = i_lo; f0 < i_hi; f0 += FLUSH) {
        const int f1 = f0 + FLUSH < i_hi ? f0 + FLUSH : i_hi;
        for (int i0 = f0; i0 < f1; i0 += RB) t += rows(xt, n, nv, d, beta, i0, n, field, Ft, FD, P);
        if (field) flush(Ft, FD, nv, d, f0 / LANES);
    }
    return t;
}

/* ---- a large system (n > 4 FLUSH): a fixed set of virtual workers ---------------------------
 * Its windows of FLUSH rows are dealt to W = workers_of(n, d) virtual workers: worker k takes
 * the windows k, k + W, k + 2 W, ... in increasing order into its own double buffer FD_k (it
 * writes only the rows >= k FLUSH) and its own double weight sum t_k; then, element by element,
 *
 *     FD = ((diagonal + FD_0) + FD_1) + ... + FD_{W-1},   S = ((s_diagonal + 2 t_0) + 2 t_1) + ...
 *
 * W depends on n and d only, never on the threads or their schedule, so the result is the same
 * bits for any thread count and schedule (and for repeated calls). Several threads pick workers
 * dynamically, each worker into its own buffer; a thread that ends one adds every ended buffer
 * that is next in worker order to FD (a combiner: in order, no thread waits for another, one
 * barrier per system as before). One thread runs the workers one after the other (one buffer,
 * added as each ends). Each sum is done by one function (noinline: one compiled order,
 * whichever path calls it). Memory: W buffers of d x np doubles (one with one thread),
 * W <= WORKERS, fewer (down to 4) where W buffers would exceed WORKER_BYTES. */
#define WORKERS 32                       /* most virtual workers of one system */
#define WORKER_BYTES ((size_t)128 << 20) /* fewer (down to 4) when W buffers would exceed this */

static int workers_of(int n, int d) {
    const int windows = (n + FLUSH - 1) / FLUSH;
    const size_t buffer = sizeof(double) * (size_t)d * (size_t)((n + LANES - 1) / LANES) * LANES;
    size_t w = WORKER_BYTES / buffer;
    w = w > WORKERS ? WORKERS : (w < 4 ? 4 : w);
    return windows < (int)w ? windows : (int)w;
}

/* acc += src, element by element */
static __attribute__((noinline)) void add_into(double *restrict acc, const double *restrict src, size_t len) {
    for (size_t k = 0; k < len; k++) acc[k] += src[k];
}

/* s + 2 t_0 + 2 t_1 + ... + 2 t_{W-1}, in this order */
static __attribute__((noinline)) double add_totals(double s, const double *t, int W) {
    for (int k = 0; k < W; k++) s += 2 * t[k];
    return s;
}

/* zero the rows >= k FLUSH of each coordinate of FD (d x np doubles) */
static void zero_from(double *FD, int d, size_t np, int k) {
    const size_t from = (size_t)k * FLUSH < np ? (size_t)k * FLUSH : np;
    for (int a = 0; a < d; a++) memset(FD + (size_t)a * np + from, 0, sizeof(double) * (np - from));
}

/* the ended workers' buffers, added to FD in worker order (FD += FD_k over the rows >= k FLUSH) */
typedef struct {
    double *FD;
    double *const *buf; /* buf[k]: FD_k, valid once done[k] */
    size_t np;
    int d, W, next, busy;
    int done[WORKERS];
} combiner;

/* mark worker k ended, then add the buffers that are next in order, unless another thread is
 * adding (it looks again after it lets go, so no ended buffer is left behind) */
static void combine(combiner *c, int k) {
    __atomic_store_n(&c->done[k], 1, __ATOMIC_SEQ_CST);
    for (;;) {
        if (__atomic_exchange_n(&c->busy, 1, __ATOMIC_SEQ_CST)) return;
        int j = __atomic_load_n(&c->next, __ATOMIC_SEQ_CST);
        for (; j < c->W && __atomic_load_n(&c->done[j], __ATOMIC_SEQ_CST); j++) {
            const size_t from = (size_t)j * FLUSH;
            for (int a = 0; a < c->d; a++)
                add_into(c->FD + (size_t)a * c->np + from, c->buf[j] + (size_t)a * c->np + from, c->np - from);
            __atomic_store_n(&c->next, j + 1, __ATOMIC_SEQ_CST);
        }
        __atomic_store_n(&c->busy, 0, __ATOMIC_SEQ_CST);
        j = __atomic_load_n(&c->next, __ATOMIC_SEQ_CST);
        if (j >= c->W || !__atomic_load_n(&c->done[j], __ATOMIC_SEQ_CST)) return;
    }
}

/* the windows of virtual worker k of W into FD (zeroed here from row k FLUSH on; NULL without the
 * field); returns their weight sum */
static __attribute__((noinline)) double worker_rows(row_block_fn rows, const vr *xt, int n, int nv, int d, real beta,
                                                    int field, vr *Ft, double *FD, vr *P, int k, int W) {
    if (FD) zero_from(FD, d, (size_t)nv * LANES, k);
    double t = 0;
    for (int64_t f0 = (int64_t)k * FLUSH; f0 < n; f0 += (int64_t)W * FLUSH)
        t += run_rows(rows, xt, n, nv, d, beta, field, Ft, FD, P, (int)f0, f0 + FLUSH < n ? (int)f0 + FLUSH : n);
    return t;
}

/* the diagonal of a large system (one compiled copy, see above) */
static __attribute__((noinline)) double large_diagonal(const vr *xt, int nv, int d, real beta, int n, int field,
                                                       double *FD) {
    return diagonal(xt, nv, d, beta, 0, n, field, FD);
}

/* FD (d x np doubles, when field) and *S of one system of n > 4 FLUSH rows (xt loaded) on T threads.
 * Returns 0, or -2 when memory runs out. */
static int large_system(row_block_fn rows, const vr *xt, int n, int nv, int d, real beta, int field, int T,
                        double *FD, double *S) {
    const size_t np = (size_t)nv * LANES, len = (size_t)d * np;
    const int W = workers_of(n, d);
    if (T > W) T = W;
    const int buffers = field ? (T > 1 ? W : 1) : 0;
    const size_t thr = sizeof(vr) * (size_t)(d + RB) * nv; /* Ft and P of a thread */
    char *work = aligned_alloc(64, thr * T + sizeof(double) * len * buffers);
    if (!work) return -2;
    memset(work, 0, thr * T); /* Ft: zero on entry (and after every window) */
    double *buf[WORKERS];
    for (int k = 0; k < W; k++) buf[k] = field ? (double *)(work + thr * T) + (T > 1 ? len * k : 0) : NULL;
    double t[WORKERS];
    combiner c = {FD, buf, np, d, W, 0, 0, {0}};
    if (field) memset(FD, 0, sizeof(double) * len);
    const double s = large_diagonal(xt, nv, d, beta, n, field, FD);
#pragma omp parallel num_threads(T) if (T > 1)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        vr *Ft = (vr *)(work + thr * tid), *P = Ft + (size_t)d * nv;
#pragma omp for schedule(dynamic, 1) nowait
        for (int k = 0; k < W; k++) {
            t[k] = worker_rows(rows, xt, n, nv, d, beta, field, Ft, buf[k], P, k, W);
            if (field) combine(&c, k);
        }
    }
    if (field) combine(&c, W - 1); /* every worker has ended: adds any buffer still pending (none) */
    *S = add_totals(s, t, W);
    free(work);
    return 0;
}

/* F (B, n, d) and S (B) of the module comment for x (B, n, d), beta (B); F may be NULL (S only).
 * G: NULL, or orthogonal gauge matrices Psi_i, (n, d, d) shared by the batch (gshared) or
 * (B, n, d, d): then the weights are those of y_i = Psi_i x_i and F_i = Psi_i^T (1/n) sum_j w_ij y_j
 * (the exp-gauge kernels in their gauge frame).
 * Returns 0, -1 on bad arguments, -2 when memory runs out. */
int SUFFIX(mf_exp_field)(const real *x, const real *beta, const real *G, int gshared, int64_t B, int n, int d,
                         real *F, real *S) {
    if (B < 0 || n < 1 || d < 1 || d > MAX_D) return -1;
    const int nv = (n + LANES - 1) / LANES;
    const size_t np = (size_t)nv * LANES;
    const int field = F != NULL;
    const row_block_fn rows = pick(d);
    /* per system or thread: xt, Ft, P (vectors) and FD (doubles) */
    const size_t per = sizeof(vr) * (size_t)(2 * d + RB) * nv + sizeof(double) * (size_t)d * np;
    /* one thread for one small system: no need to look at the load */
    const int threads = B > 1 || n > 4 * FLUSH ? threads_now((double)B * n * (n + 1) / 2 * (2 * d + 4)) : 1;
    int failed = 0;
    if (B >= threads || n <= 4 * FLUSH) {
        const int team = B < threads ? (B > 1 ? (int)B : 1) : threads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(team) reduction(| : failed) if (B > 1)
        for (int64_t b = 0; b < B; b++) {
            vr *xt = aligned_alloc(64, per);
            if (!xt) {
                failed = 1;
                continue;
            }
            vr *Ft = xt + (size_t)d * nv, *P = Ft + (size_t)d * nv;
            double *FD = (double *)(P + (size_t)RB * nv);
            const real *Gb = G ? G + (gshared ? 0 : (size_t)b * n * d * d) : NULL;
            load_transposed(x + (size_t)b * n * d, Gb, n, nv, d, xt);
            double total;
            if (n > 4 * FLUSH) { /* the virtual workers of a large system, one after the other */
                if (large_system(rows, xt, n, nv, d, beta[b], field, 1, FD, &total)) {
                    free(xt);
                    failed = 1;
                    continue;
                }
            } else {
                memset(Ft, 0, sizeof(vr) * (size_t)d * nv);
                memset(FD, 0, sizeof(double) * (size_t)d * np);
                const double s = diagonal(xt, nv, d, beta[b], 0, n, field, FD);
                const double t = run_rows(rows, xt, n, nv, d, beta[b], field, Ft, FD, P, 0, n);
                total = s + 2 * t;
            }
            S[b] = (real)total;
            if (field) store_field(FD, Gb, n, nv, d, F + (size_t)b * n * d);
            free(xt);
        }
        return failed ? -2 : 0;
    }
    /* few large systems: the virtual workers of each system in parallel */
    vr *xt = aligned_alloc(64, sizeof(vr) * (size_t)d * nv + sizeof(double) * (size_t)d * np);
    if (!xt) return -2;
    double *FD = (double *)(xt + (size_t)d * nv);
    for (int64_t b = 0; b < B; b++) {
        const real *Gb = G ? G + (gshared ? 0 : (size_t)b * n * d * d) : NULL;
        load_transposed(x + (size_t)b * n * d, Gb, n, nv, d, xt);
        double total;
        if (large_system(rows, xt, n, nv, d, beta[b], field, threads, FD, &total)) {
            free(xt);
            return -2;
        }
        S[b] = (real)total;
        if (field) store_field(FD, Gb, n, nv, d, F + (size_t)b * n * d);
    }
    free(xt);
    return 0;
}

/* ---- the tangent of the field ----------------------------------------------------------------
 * For y (B, n, d), a tangent dy (B, n, d) and beta (B):
 *
 *     dF_i = (1/n) sum_j [c_ij y_j + w_ij dy_j],   c_ij = beta w_ij (<dy_i, y_j> + <y_i, dy_j>),
 *
 * the derivative of F_i = (1/n) sum_j w_ij y_j along dy (unscaled, as mf_exp_field). Both w and
 * c are symmetric in (i, j): one pass over the pairs i <= j, each added to row i (c y_j + w dy_j)
 * and to row j (c y_i + w dy_i), with the layout, blocks and partial sums of row_block (two
 * weights and two transposed arrays instead of one). The map dy -> dF is the Hessian of
 * S / (2 beta n): symmetric, so it is its own transpose (reverse mode runs the same kernel). */
static inline __attribute__((always_inline)) void tangent_block(const vr *restrict yt, const vr *restrict dyt,
                                                                const int n, const int nv, const int d,
                                                                const real beta, const int i0, const int hi,
                                                                vr *restrict Ft, double *restrict FD,
                                                                vr *restrict P, vr *restrict Q) {
    const real *ys = (const real *)yt, *dys = (const real *)dyt;
    const size_t np = (size_t)nv * LANES;
    const vr zero = {0};
    const vr vb = zero + beta;
    const int v0 = i0 / LANES;
    const int m = nv - v0;
    real yi[RB][MAX_D], dyi[RB][MAX_D];
    for (int r = 0; r < RB; r++)
        for (int a = 0; a < d; a++) {
            yi[r][a] = i0 + r < hi ? ys[(size_t)a * np + i0 + r] : 0;
            dyi[r][a] = i0 + r < hi ? dys[(size_t)a * np + i0 + r] : 0;
        }
    /* (1) arguments of the exponentials and the brackets <dy_i, y_j> + <y_i, dy_j> */
    for (int v = v0; v < nv; v++) {
        vr dot[RB], br[RB];
        for (int r = 0; r < RB; r++) dot[r] = br[r] = zero;
        for (int a = 0; a < d; a++) {
            const vr ya = yt[(size_t)a * nv + v], dya = dyt[(size_t)a * nv + v];
            for (int r = 0; r < RB; r++) {
                dot[r] += yi[r][a] * ya;
                br[r] += dyi[r][a] * ya + yi[r][a] * dya;
            }
        }
        for (int r = 0; r < RB; r++) {
            P[(size_t)r * nv + v] = vb * dot[r] - vb;
            Q[(size_t)r * nv + v] = vb * br[r];
        }
    }
    /* (2) exponentials (libmvec) */
    for (int r = 0; r < RB; r++) {
        real *restrict p = (real *)(P + (size_t)r * nv + v0);
        for (int k = 0; k < m * LANES; k++) p[k] = EXP(p[k]);
    }
    /* (3) zero the pairs j <= i, the padding j >= n and absent rows; c = w * beta * bracket */
    vi lane;
    for (int l = 0; l < LANES; l++) lane[l] = l;
    const int vlast = (i0 + RB - 1) / LANES < nv ? (i0 + RB - 1) / LANES : nv - 1;
    for (int r = 0; r < RB; r++) {
        const vi i = (vi){0} + (ireal)(i0 + r < hi ? i0 + r : n);
        for (int v = v0; v <= vlast; v++) {
            const vi j = lane + (ireal)(v * LANES);
            P[(size_t)r * nv + v] = (vr)((vi)P[(size_t)r * nv + v] & (j > i));
        }
        const vi j = lane + (ireal)((nv - 1) * LANES);
        P[(size_t)r * nv + nv - 1] = (vr)((vi)P[(size_t)r * nv + nv - 1] & (j < (vi){0} + (ireal)n));
        for (int v = v0; v < nv; v++) Q[(size_t)r * nv + v] *= P[(size_t)r * nv + v];
    }
    /* (4) products: row sums in registers, the symmetric half into Ft */
    for (int a0 = 0; a0 < d; a0 += AC) {
        double accd[RB][AC] = {{0}};
        for (int c = v0; c < nv; c += VCH) {
            const int ce = c + VCH < nv ? c + VCH : nv;
            vr acc[RB][AC];
            for (int r = 0; r < RB; r++)
                for (int k = 0; k < AC; k++) acc[r][k] = zero;
            for (int v = c; v < ce; v++) {
                vr w[RB], cc[RB];
                for (int r = 0; r < RB; r++) w[r] = P[(size_t)r * nv + v], cc[r] = Q[(size_t)r * nv + v];
                for (int k = 0; k < AC; k++) {
                    if (a0 + k >= d) break;
                    const vr ya = yt[(size_t)(a0 + k) * nv + v], dya = dyt[(size_t)(a0 + k) * nv + v];
                    vr f = Ft[(size_t)(a0 + k) * nv + v];
                    for (int r = 0; r < RB; r++) {
                        acc[r][k] += cc[r] * ya + w[r] * dya;
                        f += cc[r] * yi[r][a0 + k] + w[r] * dyi[r][a0 + k];
                    }
                    Ft[(size_t)(a0 + k) * nv + v] = f;
                }
            }
            for (int r = 0; r < RB; r++)
                for (int k = 0; k < AC; k++) accd[r][k] += hsum(acc[r][k]);
        }
        for (int r = 0; r < RB && i0 + r < hi; r++)
            for (int k = 0; k < AC && a0 + k < d; k++) FD[(size_t)(a0 + k) * np + i0 + r] += accd[r][k];
    }
}

typedef void (*tangent_block_fn)(const vr *, const vr *, int, int, int, real, int, int, vr *, double *, vr *, vr *);

#define SPECIALISE_T(D)                                                                                      \
    static void tangent_block_##D(const vr *yt, const vr *dyt, int n, int nv, int d, real beta, int i0, int hi, \
                                  vr *Ft, double *FD, vr *P, vr *Q) {                                       \
        (void)d;                                                                                            \
        tangent_block(yt, dyt, n, nv, D, beta, i0, hi, Ft, FD, P, Q);                                       \
    }
SPECIALISE_T(2)
SPECIALISE_T(3)
SPECIALISE_T(4)
SPECIALISE_T(8)
static void tangent_block_any(const vr *yt, const vr *dyt, int n, int nv, int d, real beta, int i0, int hi,
                              vr *Ft, double *FD, vr *P, vr *Q) {
    tangent_block(yt, dyt, n, nv, d, beta, i0, hi, Ft, FD, P, Q);
}

static tangent_block_fn pick_tangent(int d) {
    switch (d) {
        case 2: return tangent_block_2;
        case 3: return tangent_block_3;
        case 4: return tangent_block_4;
        case 8: return tangent_block_8;
        default: return tangent_block_any;
    }
}

/* the diagonal terms of rows lo .. hi - 1: c_ii y_i + w_ii dy_i added to FD */
static void tangent_diagonal(const vr *yt, const vr *dyt, int nv, int d, real beta, int lo, int hi, double *FD) {
    const real *ys = (const real *)yt, *dys = (const real *)dyt;
    const size_t np = (size_t)nv * LANES;
    for (int i = lo; i < hi; i++) {
        real g = 0, h = 0;
        for (int a = 0; a < d; a++) {
            g += ys[(size_t)a * np + i] * ys[(size_t)a * np + i];
            h += dys[(size_t)a * np + i] * ys[(size_t)a * np + i];
        }
        const real w = EXP(beta * g - beta), c = 2 * beta * w * h;
        for (int a = 0; a < d; a++)
            FD[(size_t)a * np + i] += (double)c * ys[(size_t)a * np + i] + (double)w * dys[(size_t)a * np + i];
    }
}

/* the rows f0 .. f1 - 1 of one system, flushing Ft every FLUSH rows */
static void tangent_rows(tangent_block_fn rows, const vr *yt, const vr *dyt, int n, int nv, int d, real beta,
                         vr *Ft, double *FD, vr *P, vr *Q, int i_lo, int i_hi) {
    for (int f0 = i_lo; f0 < i_hi; f0 += FLUSH) {
        const int f1 = f0 + FLUSH < i_hi ? f0 + FLUSH : i_hi;
        for (int i0 = f0; i0 < f1; i0 += RB) rows(yt, dyt, n, nv, d, beta, i0, n, Ft, FD, P, Q);
        flush(Ft, FD, nv, d, f0 / LANES);
    }
}

/* the windows of virtual worker k of W (as worker_rows) into FD (zeroed here from row k FLUSH on) */
static __attribute__((noinline)) void tangent_worker(tangent_block_fn rows, const vr *yt, const vr *dyt, int n,
                                                     int nv, int d, real beta, vr *Ft, double *FD, vr *P, vr *Q,
                                                     int k, int W) {
    zero_from(FD, d, (size_t)nv * LANES, k);
    for (int64_t f0 = (int64_t)k * FLUSH; f0 < n; f0 += (int64_t)W * FLUSH)
        tangent_rows(rows, yt, dyt, n, nv, d, beta, Ft, FD, P, Q, (int)f0, f0 + FLUSH < n ? (int)f0 + FLUSH : n);
}

/* the diagonal of a large system (one compiled copy) */
static __attribute__((noinline)) void large_tangent_diagonal(const vr *yt, const vr *dyt, int nv, int d, real beta,
                                                             int n, double *FD) {
    tangent_diagonal(yt, dyt, nv, d, beta, 0, n, FD);
}

/* FD (d x np doubles) of one system of n > 4 FLUSH rows (yt, dyt loaded) on T threads, with the
 * virtual workers and the combiner of large_system: the same bits for any T. Returns 0, or -2
 * when memory runs out. */
static int large_tangent(tangent_block_fn rows, const vr *yt, const vr *dyt, int n, int nv, int d, real beta, int T,
                         double *FD) {
    const size_t np = (size_t)nv * LANES, len = (size_t)d * np;
    const int W = workers_of(n, d);
    if (T > W) T = W;
    const int buffers = T > 1 ? W : 1;
    const size_t thr = sizeof(vr) * (size_t)(d + 2 * RB) * nv; /* Ft, P and Q of a thread */
    char *work = aligned_alloc(64, thr * T + sizeof(double) * len * buffers);
    if (!work) return -2;
    memset(work, 0, thr * T); /* Ft: zero on entry (and after every window) */
    double *buf[WORKERS];
    for (int k = 0; k < W; k++) buf[k] = (double *)(work + thr * T) + (T > 1 ? len * k : 0);
    combiner c = {FD, buf, np, d, W, 0, 0, {0}};
    memset(FD, 0, sizeof(double) * len);
    large_tangent_diagonal(yt, dyt, nv, d, beta, n, FD);
#pragma omp parallel num_threads(T) if (T > 1)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        vr *Ft = (vr *)(work + thr * tid), *P = Ft + (size_t)d * nv, *Q = P + (size_t)RB * nv;
#pragma omp for schedule(dynamic, 1) nowait
        for (int k = 0; k < W; k++) {
            tangent_worker(rows, yt, dyt, n, nv, d, beta, Ft, buf[k], P, Q, k, W);
            combine(&c, k);
        }
    }
    combine(&c, W - 1); /* every worker has ended: adds any buffer still pending (none) */
    free(work);
    return 0;
}

/* dF (B, n, d) of the comment above for y, dy (B, n, d) and beta (B): threads over the systems of
 * the batch, or over the virtual workers of each system when the batch is smaller than the
 * thread count (as mf_exp_field: the same bits for any thread count). Returns 0, -1 on bad
 * arguments, -2 when memory runs out. */
int SUFFIX(mf_exp_tangent)(const real *y, const real *dy, const real *beta, int64_t B, int n, int d, real *dF) {
    if (B < 0 || n < 1 || d < 1 || d > MAX_D) return -1;
    const int nv = (n + LANES - 1) / LANES;
    const size_t np = (size_t)nv * LANES;
    const tangent_block_fn rows = pick_tangent(d);
    /* per thread: Ft, P, Q (vectors) and FD (doubles); per system: yt and dyt */
    const size_t thr = sizeof(vr) * (size_t)(d + 2 * RB) * nv + sizeof(double) * (size_t)d * np;
    const size_t sys = sizeof(vr) * (size_t)(2 * d) * nv;
    const int threads = B > 1 || n > 4 * FLUSH ? threads_now((double)B * n * (n + 1) / 2 * (4 * d + 6)) : 1;
    int failed = 0;
    if (B >= threads || n <= 4 * FLUSH) {
        const int team = B < threads ? (B > 1 ? (int)B : 1) : threads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(team) reduction(| : failed) if (B > 1)
        for (int64_t b = 0; b < B; b++) {
            vr *yt = aligned_alloc(64, sys + thr);
            if (!yt) {
                failed = 1;
                continue;
            }
            vr *dyt = yt + (size_t)d * nv, *Ft = dyt + (size_t)d * nv, *P = Ft + (size_t)d * nv;
            vr *Q = P + (size_t)RB * nv;
            double *FD = (double *)(Q + (size_t)RB * nv);
            load_transposed(y + (size_t)b * n * d, NULL, n, nv, d, yt);
            load_transposed(dy + (size_t)b * n * d, NULL, n, nv, d, dyt);
            if (n > 4 * FLUSH) { /* the virtual workers of a large system, one after the other */
                if (large_tangent(rows, yt, dyt, n, nv, d, beta[b], 1, FD)) {
                    free(yt);
                    failed = 1;
                    continue;
                }
            } else {
                memset(Ft, 0, sizeof(vr) * (size_t)d * nv);
                memset(FD, 0, sizeof(double) * (size_t)d * np);
                tangent_diagonal(yt, dyt, nv, d, beta[b], 0, n, FD);
                tangent_rows(rows, yt, dyt, n, nv, d, beta[b], Ft, FD, P, Q, 0, n);
            }
            store_field(FD, NULL, n, nv, d, dF + (size_t)b * n * d);
            free(yt);
        }
        return failed ? -2 : 0;
    }
    /* few large systems: the virtual workers of each system in parallel */
    vr *yt = aligned_alloc(64, sys + sizeof(double) * (size_t)d * np);
    if (!yt) return -2;
    vr *dyt = yt + (size_t)d * nv;
    double *FD = (double *)(dyt + (size_t)d * nv);
    for (int64_t b = 0; b < B; b++) {
        load_transposed(y + (size_t)b * n * d, NULL, n, nv, d, yt);
        load_transposed(dy + (size_t)b * n * d, NULL, n, nv, d, dyt);
        if (large_tangent(rows, yt, dyt, n, nv, d, beta[b], threads, FD)) {
            free(yt);
            return -2;
        }
        store_field(FD, NULL, n, nv, d, dF + (size_t)b * n * d);
    }
    free(yt);
    return 0;
}

/* ---- XLA FFI handlers: meanfield_exp_{fs,s}_{f32,f64} ----------------------------------
 * Arguments: x (..., n, d), beta (...) of the build's dtype, and optionally gauge matrices
 * G (n, d, d) (shared) or (..., n, d, d). Results: F (..., n, d) and S (...) ("fs"), or S
 * alone ("s"). Written against the FFI's C API (c_api.h). */

static XLA_FFI_Error *ffi_error(const XLA_FFI_Api *api, const char *msg, XLA_FFI_Error_Code code) {
    XLA_FFI_Error_Create_Args args;
    memset(&args, 0, sizeof(args));
    args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    args.message = msg;
    args.errc = code;
    return api->XLA_FFI_Error_Create(&args);
}

static XLA_FFI_Error *ffi_metadata(XLA_FFI_CallFrame *call_frame) {
    XLA_FFI_Metadata_Extension *ext = (XLA_FFI_Metadata_Extension *)call_frame->extension_start;
    ext->metadata->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    ext->metadata->api_version.extension_start = NULL;
    ext->metadata->api_version.major_version = XLA_FFI_API_MAJOR;
    ext->metadata->api_version.minor_version = XLA_FFI_API_MINOR;
    ext->metadata->traits = 0;
    return NULL;
}

static XLA_FFI_Error *ffi_run(XLA_FFI_CallFrame *call_frame, int field) {
    if (call_frame->extension_start && call_frame->extension_start->type == XLA_FFI_Extension_Metadata)
        return ffi_metadata(call_frame);
    const XLA_FFI_Api *api = call_frame->api;
    if (call_frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
    const int nrets = field ? 2 : 1;
    const int nargs = (int)call_frame->args.size;
    if ((nargs != 2 && nargs != 3) || call_frame->rets.size != nrets)
        return ffi_error(api, "meanfield exp kernel: expected arguments (x, beta[, G]) and 1 or 2 results",
                         XLA_FFI_Error_Code_INVALID_ARGUMENT);
    for (int k = 0; k < nargs; k++)
        if (call_frame->args.types[k] != XLA_FFI_ArgType_BUFFER)
            return ffi_error(api, "meanfield exp kernel: arguments must be buffers", XLA_FFI_Error_Code_INVALID_ARGUMENT);
    const XLA_FFI_Buffer *xb = (const XLA_FFI_Buffer *)call_frame->args.args[0];
    const XLA_FFI_Buffer *bb = (const XLA_FFI_Buffer *)call_frame->args.args[1];
    if (xb->dtype != FFI_DTYPE || bb->dtype != FFI_DTYPE || xb->rank < 2 || bb->rank != xb->rank - 2)
        return ffi_error(api, "meanfield exp kernel: x must be (..., n, d) and beta (...) of the kernel's dtype",
                         XLA_FFI_Error_Code_INVALID_ARGUMENT);
    int64_t B = 1;
    for (int64_t k = 0; k < bb->rank; k++) {
        if (bb->dims[k] != xb->dims[k])
            return ffi_error(api, "meanfield exp kernel: batch shapes of x and beta differ",
                             XLA_FFI_Error_Code_INVALID_ARGUMENT);
        B *= bb->dims[k];
    }
    const int64_t n = xb->dims[xb->rank - 2], d = xb->dims[xb->rank - 1];
    if (n < 1 || n > (1 << 30) || d < 1 || d > MAX_D)
        return ffi_error(api, "meanfield exp kernel: needs n >= 1 and 1 <= d <= 64", XLA_FFI_Error_Code_INVALID_ARGUMENT);
    const real *G = NULL;
    int gshared = 0;
    if (nargs == 3) {
        const XLA_FFI_Buffer *gb = (const XLA_FFI_Buffer *)call_frame->args.args[2];
        int ok = gb->dtype == FFI_DTYPE && (gb->rank == 3 || gb->rank == xb->rank + 1);
        gshared = gb->rank == 3;
        for (int64_t k = 0; ok && k < gb->rank; k++) {
            const int64_t want = k >= gb->rank - 2 ? d : (gshared ? n : xb->dims[k]);
            ok = gb->dims[k] == want;
        }
        if (!ok)
            return ffi_error(api, "meanfield exp kernel: G must be (n, d, d) or (..., n, d, d)",
                             XLA_FFI_Error_Code_INVALID_ARGUMENT);
        G = (const real *)gb->data;
    }
    real *F = NULL, *S;
    if (field) {
        F = (real *)((XLA_FFI_Buffer *)call_frame->rets.rets[0])->data;
        S = (real *)((XLA_FFI_Buffer *)call_frame->rets.rets[1])->data;
    } else {
        S = (real *)((XLA_FFI_Buffer *)call_frame->rets.rets[0])->data;
    }
    const int rc = SUFFIX(mf_exp_field)((const real *)xb->data, (const real *)bb->data, G, gshared, B, (int)n, (int)d,
                                        F, S);
    if (rc == -2) return ffi_error(api, "meanfield exp kernel: out of memory", XLA_FFI_Error_Code_RESOURCE_EXHAUSTED);
    if (rc != 0) return ffi_error(api, "meanfield exp kernel: bad arguments", XLA_FFI_Error_Code_INVALID_ARGUMENT);
    return NULL;
}

XLA_FFI_Error *SUFFIX(meanfield_exp_fs)(XLA_FFI_CallFrame *call_frame) { return ffi_run(call_frame, 1); }
XLA_FFI_Error *SUFFIX(meanfield_exp_s)(XLA_FFI_CallFrame *call_frame) { return ffi_run(call_frame, 0); }

/* meanfield_exp_t_{f32,f64}: arguments y (..., n, d), dy (..., n, d), beta (...); result dF (..., n, d)
 * (mf_exp_tangent) */
XLA_FFI_Error *SUFFIX(meanfield_exp_t)(XLA_FFI_CallFrame *call_frame) {
    if (call_frame->extension_start && call_frame->extension_start->type == XLA_FFI_Extension_Metadata)
        return ffi_metadata(call_frame);
    const XLA_FFI_Api *api = call_frame->api;
    if (call_frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
    if (call_frame->args.size != 3 || call_frame->rets.size != 1)
        return ffi_error(api, "meanfield exp tangent: expected arguments (y, dy, beta) and 1 result",
                         XLA_FFI_Error_Code_INVALID_ARGUMENT);
    for (int k = 0; k < 3; k++)
        if (call_frame->args.types[k] != XLA_FFI_ArgType_BUFFER)
            return ffi_error(api, "meanfield exp tangent: arguments must be buffers", XLA_FFI_Error_Code_INVALID_ARGUMENT);
    const XLA_FFI_Buffer *yb = (const XLA_FFI_Buffer *)call_frame->args.args[0];
    const XLA_FFI_Buffer *db = (const XLA_FFI_Buffer *)call_frame->args.args[1];
    const XLA_FFI_Buffer *bb = (const XLA_FFI_Buffer *)call_frame->args.args[2];
    int ok = yb->dtype == FFI_DTYPE && db->dtype == FFI_DTYPE && bb->dtype == FFI_DTYPE && yb->rank >= 2 &&
             db->rank == yb->rank && bb->rank == yb->rank - 2;
    int64_t B = 1;
    for (int64_t k = 0; ok && k < yb->rank; k++) ok = db->dims[k] == yb->dims[k];
    for (int64_t k = 0; ok && k < bb->rank; k++) {
        ok = bb->dims[k] == yb->dims[k];
        B *= bb->dims[k];
    }
    if (!ok)
        return ffi_error(api, "meanfield exp tangent: y and dy must be (..., n, d) and beta (...) of the kernel's dtype",
                         XLA_FFI_Error_Code_INVALID_ARGUMENT);
    const int64_t n = yb->dims[yb->rank - 2], d = yb->dims[yb->rank - 1];
    if (n < 1 || n > (1 << 30) || d < 1 || d > MAX_D)
        return ffi_error(api, "meanfield exp tangent: needs n >= 1 and 1 <= d <= 64", XLA_FFI_Error_Code_INVALID_ARGUMENT);
    real *dF = (real *)((XLA_FFI_Buffer *)call_frame->rets.rets[0])->data;
    const int rc = SUFFIX(mf_exp_tangent)((const real *)yb->data, (const real *)db->data, (const real *)bb->data, B,
                                          (int)n, (int)d, dF);
    if (rc == -2) return ffi_error(api, "meanfield exp tangent: out of memory", XLA_FFI_Error_Code_RESOURCE_EXHAUSTED);
    if (rc != 0) return ffi_error(api, "meanfield exp tangent: bad arguments", XLA_FFI_Error_Code_INVALID_ARGUMENT);
    return NULL;
}
