/* Element-wise and row kernels for float32 (AVX-512F), compiled with the GEMM kernel by tools/native/build.py.

   Constraints of the embedding (checked by build.py): no data sections and no relocations, so every floating-point
   constant comes in through a table argument (K below), never from a literal the compiler would keep in .rodata;
   no calls out (no libm).  Compiled with -ffp-contract=off: every multiply and add rounds on its own, as the numpy
   passes they replace do (the same formulas in the same order: only exp2 and the row statistics' summation order
   differ from numpy's). */
#include <immintrin.h>

/* exp2's table in registers: 8 coefficients of 2^f on [-0.5, 0.5] (constant term first), then the clamp bound. */
typedef struct { __m512 c[8], lo, hi; } exp2_k;

static inline exp2_k exp2_table(const float *restrict kx)
{
    exp2_k t;
    for (int i = 0; i < 8; i++) t.c[i] = _mm512_set1_ps(kx[i]);
    t.hi = _mm512_set1_ps(kx[8]);
    t.lo = _mm512_sub_ps(_mm512_setzero_ps(), t.hi);
    return t;
}

/* 2^x for every lane (NaN stays NaN; overflow gives +inf, underflow 0, as numpy's exp2 does). */
static inline __m512 exp2_ps(__m512 x, const exp2_k *t)
{
    /* (max/min return their second operand when either is NaN: NaN passes through) */
    x = _mm512_min_ps(t->hi, _mm512_max_ps(t->lo, x));
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = t->c[7];
    for (int i = 6; i >= 0; i--) p = _mm512_fmadd_ps(p, f, t->c[i]);
    return _mm512_scalef_ps(p, n);
}

static inline __mmask16 tail_mask(long left)
{
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* Exact GELU as x / (1 + 2^(x P(x^2))), P of degree 6 (K[0..6], constant term first, already scaled by -log2 e),
   exp2's table at K + 8.  y may be x.  (Constants are held in registers: the stores to y could otherwise alias K
   and force reloads.) */
void gelu_erf_f32(long n, const float *x, float *y, const float *restrict K)
{
    exp2_k t = exp2_table(K + 8);
    __m512 g[7];
    for (int j = 0; j < 7; j++) g[j] = _mm512_set1_ps(K[j]);
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 u = _mm512_mul_ps(v, v);
        __m512 p = _mm512_mul_ps(u, g[6]);
        for (int j = 5; j >= 1; j--) {
            p = _mm512_add_ps(p, g[j]);
            p = _mm512_mul_ps(p, u);
        }
        p = _mm512_add_ps(p, g[0]);
        p = _mm512_mul_ps(p, v);
        p = _mm512_add_ps(exp2_ps(p, &t), t.c[0]);  /* (1 + 2^..., c[0] being 1) */
        _mm512_mask_storeu_ps(y + i, m, _mm512_div_ps(v, p));
    }
}

/* tanh-approximated GELU as x / (1 + 2^(x (A + B x^2))): K[0] = A, K[1] = B; exp2's table at K + 8.  y may be x. */
void gelu_tanh_f32(long n, const float *x, float *y, const float *restrict K)
{
    exp2_k t = exp2_table(K + 8);
    __m512 a = _mm512_set1_ps(K[0]), b = _mm512_set1_ps(K[1]);
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 u = _mm512_mul_ps(v, v);
        u = _mm512_mul_ps(u, b);
        u = _mm512_add_ps(u, a);
        u = _mm512_mul_ps(u, v);
        u = _mm512_add_ps(exp2_ps(u, &t), t.c[0]);
        _mm512_mask_storeu_ps(y + i, m, _mm512_div_ps(v, u));
    }
}

/* The sum of a row's d floats in double precision. */
static inline double row_sum(const float *r, long d)
{
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (long i = 0; i < d; i += 16) {
        __m512 v = _mm512_maskz_loadu_ps(tail_mask(d - i), r + i);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

/* The sum of (r[i] - c)^2 (the differences rounded to float, as numpy's pass writes them) in double precision. */
static inline double row_sq_dev(const float *r, long d, float c)
{
    __m512 cv = _mm512_set1_ps(c);
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (long i = 0; i < d; i += 16) {
        __mmask16 m = tail_mask(d - i);
        __m512 v = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, r + i), cv);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        s0 = _mm512_fmadd_pd(lo, lo, s0);
        s1 = _mm512_fmadd_pd(hi, hi, s1);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

/* Layer normalization of `rows` rows of d floats: t = x (+ skip) (+ bias), written to y (y may be x); then
   y = (t - mean) * inv * gamma (+ beta), inv = 1 / sqrt(var + eps), mean and var over the row (in double, rounded to
   float); simplified (RMS): y = t * inv * gamma with var the mean of t^2.  skip row r is skip[r % skip_rows]
   (a skip shared by every batch item).  Any of skip, bias, beta may be null; with `stats`, mean and inv are stored
   per row at stats[2r], stats[2r + 1].  K: epsilon, then 1.  Shapes are the caller's to check. */
void layer_norm_f32(long rows, long d, const float *x, const float *skip, long skip_rows, const float *bias,
                    const float *gamma, const float *beta, const double *K, long simplified, float *y, float *stats)
{
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        const float *t = xr;
        if (skip || bias) {
            const float *sr = skip ? skip + (r % skip_rows) * d : 0;
            for (long i = 0; i < d; i += 16) {
                __mmask16 m = tail_mask(d - i);
                __m512 v = _mm512_maskz_loadu_ps(m, xr + i);
                if (sr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, sr + i));
                if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + i));
                _mm512_mask_storeu_ps(yr + i, m, v);
            }
            t = yr;
        }
        float mean = 0.0f;
        double var;
        if (simplified) {
            var = row_sq_dev(t, d, 0.0f) / (double)d;
        } else {
            mean = (float)(row_sum(t, d) / (double)d);
            var = row_sq_dev(t, d, mean) / (double)d;
        }
        /* (sqrt in double: one instruction with -fno-math-errno, no call) */
        float inv = (float)(K[1] / __builtin_sqrt(var + K[0]));
        if (stats) {
            stats[2 * r] = mean;
            stats[2 * r + 1] = inv;
        }
        __m512 mv = _mm512_set1_ps(mean), iv = _mm512_set1_ps(inv);
        for (long i = 0; i < d; i += 16) {
            __mmask16 m = tail_mask(d - i);
            __m512 v = _mm512_maskz_loadu_ps(m, t + i);
            if (!simplified) v = _mm512_sub_ps(v, mv);
            v = _mm512_mul_ps(v, iv);
            v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, gamma + i));
            if (beta) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, beta + i));
            _mm512_mask_storeu_ps(yr + i, m, v);
        }
    }
}

/* The lanes i of a 16-wide load at column c0 with 0 <= c0 + i < W. */
static inline __mmask16 bounds_mask(long c0, long W)
{
    long lo = c0 < 0 ? -c0 : 0, hi = W - c0 < 16 ? W - c0 : 16;
    if (hi <= lo) return 0;
    return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

/* A sliding-window pass over 2-D planes (depthwise convolution, max and sum pooling).  Each plane is first copied
   into `pad` (Hp x Wp floats: the padded plane, `fill` around the image and to the right of it), so the taps' loads
   are plain unaligned loads with no masks or bounds tests; then up to four output rows are built together, 16
   columns at a time, every tap one multiply-add (max, add) per row (stride 2: two loads and an even-lane permute). */
#define WIN_FMA 0
#define WIN_MAX 1
#define WIN_SUM 2
typedef struct {
    long H, W, KH, KW, sh, sw, dh, dw, pt, pl, Ho, Wo, Hp, Wp;
    __m512i even;
    __m512 fill;
    float *pad;
} win_geom;

/* The rows and columns of the padded copy: every row any output reads, and the columns of every 16-wide load. */
static inline long win_rows(long KH, long sh, long dh, long Ho)
{
    return (Ho - 1) * sh + (KH - 1) * dh + 1;
}

static inline long win_pitch(long KW, long sw, long dw, long Wo)
{
    long last = (Wo - 1) / 16 * 16;  /* (the last block's first column) */
    return ((last + 16) * sw + (KW - 1) * dw + 16 + 15) / 16 * 16;
}

static inline win_geom win_geometry(long H, long W, long KH, long KW, long sh, long sw, long dh, long dw, long pt,
                                    long pl, long Ho, long Wo, const int *even, __m512 fill, float *pad)
{
    win_geom g = {H, W, KH, KW, sh, sw, dh, dw, pt, pl, Ho, Wo, win_rows(KH, sh, dh, Ho), win_pitch(KW, sw, dw, Wo),
                  _mm512_loadu_si512((const void *)even), fill, pad};
    return g;
}

static inline void win_pad(const win_geom *g, const float *xp)
{
    for (long r = 0; r < g->Hp; r++) {
        long iy = r - g->pt;
        float *d = g->pad + r * g->Wp;
        if (iy < 0 || iy >= g->H) {
            for (long c = 0; c < g->Wp; c += 16) _mm512_store_ps(d + c, g->fill);
            continue;
        }
        const float *row = xp + iy * g->W - g->pl;
        long c = 0, inner = g->pl + g->W - 16;  /* (loads from c to c + 15 inside the row while c <= inner) */
        for (; c < g->Wp && c < g->pl; c += 16)
            _mm512_store_ps(d + c, _mm512_mask_loadu_ps(g->fill, bounds_mask(c - g->pl, g->W), row + c));
        for (; c <= inner && c < g->Wp; c += 16) _mm512_store_ps(d + c, _mm512_loadu_ps(row + c));
        for (; c < g->Wp; c += 16)
            _mm512_store_ps(d + c, _mm512_mask_loadu_ps(g->fill, bounds_mask(c - g->pl, g->W), row + c));
    }
}

static inline __m512 win_load(const win_geom *g, const float *p)
{
    if (g->sw == 1) return _mm512_loadu_ps(p);
    return _mm512_permutex2var_ps(_mm512_loadu_ps(p), g->even, _mm512_loadu_ps(p + 16));
}

/* Output rows oy .. oy + NR - 1, columns ox0 .. ox0 + 15 of the padded plane: acc over every tap (op: multiply-add
   with the tap's weight in wk, max, or sum); `nan` collects, for max, the lanes that saw a NaN. */
static inline __attribute__((always_inline)) void win_block(const win_geom *g, const float *wk, long oy, long ox0,
                                                            const int NR, const int op, __m512 *acc, __mmask16 *nan)
{
    /* (the accumulators in locals: through `acc` they would round-trip memory on every multiply-add) */
    __m512 a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    __mmask16 n0 = 0, n1 = 0, n2 = 0, n3 = 0;
    const long rs = g->sh * g->Wp;  /* (from one output row's input row to the next's) */
    for (long ky = 0; ky < g->KH; ky++) {
        const float *r0 = g->pad + (oy * g->sh + ky * g->dh) * g->Wp + ox0 * g->sw;
        for (long kx = 0; kx < g->KW; kx++) {
            const float *q = r0 + kx * g->dw;
            if (op == WIN_FMA) {
                __m512 wv = _mm512_set1_ps(wk[ky * g->KW + kx]);
                a0 = _mm512_fmadd_ps(win_load(g, q), wv, a0);
                if (NR > 1) a1 = _mm512_fmadd_ps(win_load(g, q + rs), wv, a1);
                if (NR > 2) a2 = _mm512_fmadd_ps(win_load(g, q + 2 * rs), wv, a2);
                if (NR > 3) a3 = _mm512_fmadd_ps(win_load(g, q + 3 * rs), wv, a3);
            } else {
#define WIN_REDUCE(p, a, n) { __m512 v = win_load(g, p); \
                              if (op == WIN_MAX) { n |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); \
                                                   a = _mm512_max_ps(v, a); } \
                              else a = _mm512_add_ps(a, v); }
                WIN_REDUCE(q, a0, n0)
                if (NR > 1) WIN_REDUCE(q + rs, a1, n1)
                if (NR > 2) WIN_REDUCE(q + 2 * rs, a2, n2)
                if (NR > 3) WIN_REDUCE(q + 3 * rs, a3, n3)
            }
        }
    }
    acc[0] = a0; acc[1] = a1; acc[2] = a2; acc[3] = a3;
    nan[0] = n0; nan[1] = n1; nan[2] = n2; nan[3] = n3;
}

/* One plane: its padded copy, then every output block: acc from `start` (the bias, or fill for pooling), then the
   taps, then y = acc (+ y with `accumulate`) (/ div for sums with div) (NaN where a max saw one). */
static inline __attribute__((always_inline)) void win_plane(const win_geom *g, const float *xp, const float *wk,
                                                            __m512 start, float *yp, long accumulate,
                                                            const float *div, const int op)
{
    __m512 nanv = _mm512_sub_ps(g->fill, g->fill);  /* (-inf - -inf: NaN, for max) */
    win_pad(g, xp);
    for (long oy = 0; oy < g->Ho; oy += 4) {
        long nr = g->Ho - oy < 4 ? g->Ho - oy : 4;
        for (long ox0 = 0; ox0 < g->Wo; ox0 += 16) {
            __m512 acc[4] = {start, start, start, start};
            __mmask16 nan[4] = {0, 0, 0, 0};
            switch (nr) {  /* (a constant row count for each copy of the block: no dead rows) */
            case 4: win_block(g, wk, oy, ox0, 4, op, acc, nan); break;
            case 3: win_block(g, wk, oy, ox0, 3, op, acc, nan); break;
            case 2: win_block(g, wk, oy, ox0, 2, op, acc, nan); break;
            default: win_block(g, wk, oy, ox0, 1, op, acc, nan); break;
            }
            __mmask16 om = tail_mask(g->Wo - ox0);
            for (int r = 0; r < nr; r++) {
                long at = (oy + r) * g->Wo + ox0;
                __m512 v = acc[r];
                if (op == WIN_MAX) v = _mm512_mask_mov_ps(v, nan[r], nanv);
                if (div) v = _mm512_div_ps(v, _mm512_maskz_loadu_ps(om, div + at));
                if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(om, yp + at), v);
                _mm512_mask_storeu_ps(yp + at, om, v);
            }
        }
    }
}

/* Depthwise 2-D convolution (one filter per channel) of `planes` planes (batch x channels) of H x W floats, filter
   w (C, KH, KW), channel = plane % C, strides sh and sw (sw 1 or 2), dilations dh and dw, top/left pads pt and pl
   (rows and columns outside the image read as zero; the bottom/right pads follow from Ho and Wo), into y (planes,
   Ho, Wo): y = conv + bias, or y += conv + bias with `accumulate`.  bias may be null.  even: the int32 lane indices
   0, 2, ..., 30; pad: scratch of win_pad_floats(...) floats, 64-byte aligned. */
void dwconv2d_f32(long planes, long C, long H, long W, const float *x, const float *w, const float *bias, long KH,
                  long KW, long sh, long sw, long dh, long dw, long pt, long pl, long Ho, long Wo, float *y,
                  long accumulate, const int *restrict even, float *pad)
{
    win_geom g = win_geometry(H, W, KH, KW, sh, sw, dh, dw, pt, pl, Ho, Wo, even, _mm512_setzero_ps(), pad);
    for (long p = 0; p < planes; p++) {
        long c = p % C;
        __m512 b = bias ? _mm512_set1_ps(bias[c]) : _mm512_setzero_ps();
        win_plane(&g, x + p * H * W, w + c * KH * KW, b, y + p * Ho * Wo, accumulate, 0, WIN_FMA);
    }
}

/* 2-D max or sum pooling (mode 0: max, NaN propagating as numpy's maximum; 1: sum, divided by div[oy * Wo + ox]
   when div is not null) of `planes` planes of H x W floats into y (planes, Ho, Wo): kernel KH x KW, strides sh and
   sw (sw 1 or 2), dilations dh and dw, top/left pads pt and pl (padding reads as -inf for max, 0 for sum; the
   bottom/right pads and ceil_mode follow from Ho and Wo).  K: -inf.  The traversal is the depthwise kernel's. */
void pool2d_f32(long planes, long H, long W, const float *x, long KH, long KW, long sh, long sw, long dh, long dw,
                long pt, long pl, long Ho, long Wo, float *y, long mode, const float *div, const float *restrict K,
                const int *restrict even, float *pad)
{
    __m512 fill = mode == 0 ? _mm512_set1_ps(K[0]) : _mm512_setzero_ps();
    win_geom g = win_geometry(H, W, KH, KW, sh, sw, dh, dw, pt, pl, Ho, Wo, even, fill, pad);
    for (long p = 0; p < planes; p++) {
        if (mode == 0)
            win_plane(&g, x + p * H * W, 0, fill, y + p * Ho * Wo, 0, 0, WIN_MAX);
        else
            win_plane(&g, x + p * H * W, 0, fill, y + p * Ho * Wo, 0, div, WIN_SUM);
    }
}

/* The scratch floats the two kernels above need for one plane (win_geometry's Hp x Wp). */
long win_pad_floats(long KH, long KW, long sh, long sw, long dh, long dw, long Ho, long Wo)
{
    return win_rows(KH, sh, dh, Ho) * win_pitch(KW, sw, dw, Wo);
}

/* Output rows oy .. oy + NR - 1, columns ox0 .. ox0 + 15, output channels m .. m + MB - 1 of a convolution whose
   group's Cg input planes are padded at g->pad, plane after plane (`pstride` floats apart): acc[r * 8 + j] over
   every input channel and tap, each tap's input vector loaded once per row and multiplied by MB weights. */
static inline __attribute__((always_inline)) void conv_block(const win_geom *g, long Cg, long pstride,
                                                             const float *wm, long wstride, long oy, long ox0,
                                                             const int NR, const int MB, __m512 *acc)
{
    __m512 a[16];
    for (int i = 0; i < NR * MB; i++) a[i] = acc[(i / MB) * 8 + i % MB];
    const long rs = g->sh * g->Wp;
    for (long c = 0; c < Cg; c++) {
        const float *pc = g->pad + c * pstride;
        for (long ky = 0; ky < g->KH; ky++) {
            const float *r0 = pc + (oy * g->sh + ky * g->dh) * g->Wp + ox0 * g->sw;
            for (long kx = 0; kx < g->KW; kx++) {
                const float *q = r0 + kx * g->dw, *wt = wm + (c * g->KH + ky) * g->KW + kx;
                __m512 v0 = win_load(g, q), v1 = NR > 1 ? win_load(g, q + rs) : v0;
                for (int j = 0; j < MB; j++) {
                    __m512 wv = _mm512_set1_ps(wt[j * wstride]);
                    a[j] = _mm512_fmadd_ps(v0, wv, a[j]);
                    if (NR > 1) a[MB + j] = _mm512_fmadd_ps(v1, wv, a[MB + j]);
                }
            }
        }
    }
    for (int i = 0; i < NR * MB; i++) acc[(i / MB) * 8 + i % MB] = a[i];
}

/* A grouped 2-D convolution with few input channels per group (a network's first layer: 3 channels): x (N, C, H, W),
   w (M, Cg, KH, KW), groups (Cg = C / groups, Mg = M / groups outputs each), strides sh and sw (sw 1 or 2),
   dilations dh and dw, top/left pads pt and pl, into y (N, M, Ho, Wo): y = conv + bias (+ y with `accumulate`).
   Per image and group the Cg input planes are copied once, padded, into `pad` (Cg x win_pad_floats(...) floats,
   64-byte aligned); then two output rows x 16 columns x up to 8 output channels at a time (16 accumulators), every
   tap's input vector loaded once for its 8 channels.  bias may be null; even: the lane indices 0, 2, ..., 30. */
void conv2d_small_f32(long N, long C, long H, long W, const float *x, long M, long groups, const float *w,
                      const float *bias, long KH, long KW, long sh, long sw, long dh, long dw, long pt, long pl,
                      long Ho, long Wo, float *y, long accumulate, const int *restrict even, float *pad)
{
    long Cg = C / groups, Mg = M / groups;
    win_geom g = win_geometry(H, W, KH, KW, sh, sw, dh, dw, pt, pl, Ho, Wo, even, _mm512_setzero_ps(), pad);
    long pstride = g.Hp * g.Wp, wstride = Cg * KH * KW;
    for (long n = 0; n < N; n++)
        for (long gr = 0; gr < groups; gr++) {
            for (long c = 0; c < Cg; c++) {
                win_geom gc = g;
                gc.pad = pad + c * pstride;
                win_pad(&gc, x + ((n * C) + gr * Cg + c) * H * W);
            }
            for (long m0 = 0; m0 < Mg; m0 += 8) {
                long mb = Mg - m0 < 8 ? Mg - m0 : 8, m = gr * Mg + m0;
                const float *wm = w + m * wstride;
                float *ym = y + (n * M + m) * Ho * Wo;
                for (long oy = 0; oy < Ho; oy += 2) {
                    long nr = Ho - oy < 2 ? Ho - oy : 2;
                    for (long ox0 = 0; ox0 < Wo; ox0 += 16) {
                        __m512 acc[16];
                        for (int i = 0; i < 16; i++)
                            acc[i] = bias && i % 8 < mb ? _mm512_set1_ps(bias[m + i % 8]) : _mm512_setzero_ps();
                        if (nr == 2 && mb == 8) {
                            conv_block(&g, Cg, pstride, wm, wstride, oy, ox0, 2, 8, acc);
                        } else {  /* (the last rows or channels: one channel at a time) */
                            for (long j = 0; j < mb; j++) {
                                __m512 t[16];
                                t[0] = acc[j];
                                t[8] = acc[8 + j];
                                if (nr == 2)
                                    conv_block(&g, Cg, pstride, wm + j * wstride, wstride, oy, ox0, 2, 1, t);
                                else
                                    conv_block(&g, Cg, pstride, wm + j * wstride, wstride, oy, ox0, 1, 1, t);
                                acc[j] = t[0];
                                acc[8 + j] = t[8];
                            }
                        }
                        __mmask16 om = tail_mask(Wo - ox0);
                        for (long r = 0; r < nr; r++)
                            for (long j = 0; j < mb; j++) {
                                float *o = ym + j * Ho * Wo + (oy + r) * Wo + ox0;
                                __m512 v = acc[r * 8 + j];
                                if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(om, o), v);
                                _mm512_mask_storeu_ps(o, om, v);
                            }
                    }
                }
            }
        }
}

/* Attention's softmax over the keys of transposed scores: st holds `heads` blocks of T x S (keys x queries, queries
   contiguous) raw products k q^T; each becomes exp(scale * st + a - max) with the max over the query's keys, and
   den (heads x S) gets the sums (1 where a query has no finite score: its weights are all 0, as the numpy path
   gives).  a: the additive term as [heads, T, S] with strides ah, at, as (as 0 or 1; a null: none); causal_past >= 0:
   query s sees keys t <= s + causal_past only (the others' scores become the lowest float, as the numpy path masks
   them: they weigh 0 unless every key the query may see is -inf).  16 queries per vector, two passes over each
   block (scaled scores and their maxima, then exp and sums).  K: exp2's table at K + 8, K[0] = log2 e, K[1] = -inf,
   K[2] = the lowest float. */
void softmax_keys_f32(long heads, long T, long S, float *st, float scale, const float *a, long ah, long at, long as,
                      long causal_past, float *den, const float *restrict K)
{
    exp2_k t2 = exp2_table(K + 8);
    __m512 log2e = _mm512_set1_ps(K[0]), ninf = _mm512_set1_ps(K[1]), sc = _mm512_set1_ps(scale);
    __m512 zero = _mm512_setzero_ps(), one = t2.c[0], lowest = _mm512_set1_ps(K[2]);
    __m512 lanes = _mm512_setzero_ps();
    for (int i = 1; i < 16; i++) lanes = _mm512_mask_add_ps(lanes, (__mmask16)(0xFFFF << i), lanes, one);
    for (long h = 0; h < heads; h++) {
        float *sh = st + h * T * S;
        const float *ahp = a ? a + h * ah : 0;
        for (long s0 = 0; s0 < S; s0 += 16) {
            __mmask16 m = tail_mask(S - s0);
            /* (the last key each lane may see: s + causal_past) */
            __m512 last = _mm512_add_ps(lanes, _mm512_set1_ps((float)(s0 + causal_past)));
            __m512 mx = ninf;
            /* (keys past every lane's causal window: masked for all 16 queries, not read) */
            long tv = causal_past >= 0 && s0 + 15 + causal_past + 1 < T ? s0 + 15 + causal_past + 1 : T;
            if (tv < T) mx = lowest;
            for (long t = 0; t < tv; t++) {
                float *p = sh + t * S + s0;
                __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p), sc);
                if (ahp) {
                    const float *ap = ahp + t * at + s0 * as;
                    x = _mm512_add_ps(x, as ? _mm512_maskz_loadu_ps(m, ap) : _mm512_set1_ps(*ap));
                }
                if (causal_past >= 0)
                    x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(_mm512_set1_ps((float)t), last, _CMP_GT_OQ), lowest);
                mx = _mm512_max_ps(x, mx);
                _mm512_mask_storeu_ps(p, m, x);
            }
            /* (a query with no finite maximum: shifted by 0, as the numpy path does) */
            mx = _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(mx, ninf, _CMP_EQ_OQ), zero);
            __m512 sum = zero;
            for (long t = 0; t < tv; t++) {
                float *p = sh + t * S + s0;
                __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, p), mx);
                __m512 e = exp2_ps(_mm512_mul_ps(x, log2e), &t2);  /* (-inf: exp2 clamps it to 2^-160, 0) */
                sum = _mm512_add_ps(sum, e);
                _mm512_mask_storeu_ps(p, m, e);
            }
            if (tv < T) {  /* (the masked keys' weight: 0, or 1 where the window's keys were all -inf) */
                __m512 e = exp2_ps(_mm512_mul_ps(_mm512_sub_ps(lowest, mx), log2e), &t2);
                for (long t = tv; t < T; t++) {
                    sum = _mm512_add_ps(sum, e);
                    _mm512_mask_storeu_ps(sh + t * S + s0, m, e);
                }
            }
            sum = _mm512_mask_mov_ps(sum, _mm512_cmp_ps_mask(sum, zero, _CMP_EQ_OQ), one);
            _mm512_mask_storeu_ps(den + h * S + s0, m, sum);
        }
    }
}
