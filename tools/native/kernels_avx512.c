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

/* Where a tap reads its 16 input columns: from column c0 (stride 1: one load; stride 2: 32 columns in two loads,
   the even lanes kept), with the masks of the columns inside the row. */
typedef struct { long c0, sw; __mmask16 m0, m1; } tap_cols;

static inline tap_cols tap_columns(long ox0, long pl, long off, long sw, long W)
{
    tap_cols t;
    t.sw = sw;
    t.c0 = sw * ox0 - pl + off;
    t.m0 = bounds_mask(t.c0, W);
    t.m1 = sw == 1 ? 0 : bounds_mask(t.c0 + 16, W);
    return t;
}

/* For output rows oy .. oy + nr - 1 (of DW_ROWS), the input row each reads at row offset `off` (null where it
   falls in the padding or past nr). */
#define DW_ROWS 4
static inline void tap_rows(const float **rows, const float *xp, long oy, long nr, long off, long sh, long H, long W)
{
    _Pragma("GCC unroll 4")
    for (int r = 0; r < DW_ROWS; r++) {
        long iy = (oy + r) * sh + off;
        rows[r] = (r < nr && iy >= 0 && iy < H) ? xp + iy * W : 0;
    }
}

/* The tap's 16 values from `row` (columns outside the row read as `fill`). */
static inline __m512 load_tap(const float *row, const tap_cols *t, __m512i even, __m512 fill)
{
    if (t->sw == 1)
        return t->m0 == 0xFFFF ? _mm512_loadu_ps(row + t->c0) : _mm512_mask_loadu_ps(fill, t->m0, row + t->c0);
    __m512 lo = _mm512_mask_loadu_ps(fill, t->m0, row + t->c0);
    __m512 hi = _mm512_mask_loadu_ps(fill, t->m1, row + t->c0 + 16);
    return _mm512_permutex2var_ps(lo, even, hi);
}

/* Depthwise 2-D convolution (one filter per channel) of `planes` planes (batch x channels) of H x W floats, filter
   w (C, KH, KW), channel = plane % C, strides sh and sw (sw 1 or 2), dilations dh and dw, top/left pads pt and pl
   (rows and columns outside the image read as zero; the bottom/right pads follow from Ho and Wo), into y (planes,
   Ho, Wo): y = conv + bias, or y += conv + bias with `accumulate`.  Four output rows are built together, 16 columns
   at a time (four independent multiply-add chains), every tap one multiply-add per row on a masked load of its
   input columns (stride 2: two loads and an even-lane permute with `even`, the int32 lane indices 0, 2, ..., 30);
   no padded copy.  bias may be null. */
void dwconv2d_f32(long planes, long C, long H, long W, const float *x, const float *w, const float *bias, long KH,
                  long KW, long sh, long sw, long dh, long dw, long pt, long pl, long Ho, long Wo, float *y,
                  long accumulate, const int *restrict even)
{
    __m512i ev = _mm512_loadu_si512((const void *)even);
    __m512 zero = _mm512_setzero_ps();
    for (long p = 0; p < planes; p++) {
        long c = p % C;
        const float *xp = x + p * H * W, *wc = w + c * KH * KW;
        float *yp = y + p * Ho * Wo;
        __m512 b = bias ? _mm512_set1_ps(bias[c]) : _mm512_setzero_ps();
        for (long oy = 0; oy < Ho; oy += DW_ROWS) {
            long nr = Ho - oy < DW_ROWS ? Ho - oy : DW_ROWS;
            for (long ox0 = 0; ox0 < Wo; ox0 += 16) {
                __m512 acc[DW_ROWS];
                _Pragma("GCC unroll 4")
                for (int r = 0; r < DW_ROWS; r++) acc[r] = _mm512_setzero_ps();
                for (long ky = 0; ky < KH; ky++) {
                    const float *rows[DW_ROWS];
                    tap_rows(rows, xp, oy, nr, ky * dh - pt, sh, H, W);
                    const float *wk = wc + ky * KW;
                    for (long kx = 0; kx < KW; kx++) {
                        __m512 wv = _mm512_set1_ps(wk[kx]);
                        tap_cols tc = tap_columns(ox0, pl, kx * dw, sw, W);
                        _Pragma("GCC unroll 4")
                        for (int r = 0; r < DW_ROWS; r++)
                            if (rows[r]) acc[r] = _mm512_fmadd_ps(load_tap(rows[r], &tc, ev, zero), wv, acc[r]);
                    }
                }
                __mmask16 om = tail_mask(Wo - ox0);
                _Pragma("GCC unroll 4")
                for (int r = 0; r < DW_ROWS; r++) {
                    if (r >= nr) break;
                    float *o = yp + (oy + r) * Wo + ox0;
                    __m512 v = _mm512_add_ps(acc[r], b);
                    if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(om, o), v);
                    _mm512_mask_storeu_ps(o, om, v);
                }
            }
        }
    }
}

/* 2-D max or sum pooling (mode 0: max, NaN propagating as numpy's maximum; 1: sum, divided by div[oy * Wo + ox]
   when div is not null) of `planes` planes of H x W floats into y (planes, Ho, Wo): kernel KH x KW, strides sh and
   sw (sw 1 or 2), dilations dh and dw, top/left pads pt and pl (padding reads as -inf for max, 0 for sum; the
   bottom/right pads and ceil_mode follow from Ho and Wo).  K: -inf.  The traversal is the depthwise kernel's. */
void pool2d_f32(long planes, long H, long W, const float *x, long KH, long KW, long sh, long sw, long dh, long dw,
                long pt, long pl, long Ho, long Wo, float *y, long mode, const float *div, const float *restrict K,
                const int *restrict even)
{
    __m512i ev = _mm512_loadu_si512((const void *)even);
    __m512 fill = mode == 0 ? _mm512_set1_ps(K[0]) : _mm512_setzero_ps();
    for (long p = 0; p < planes; p++) {
        const float *xp = x + p * H * W;
        float *yp = y + p * Ho * Wo;
        for (long oy = 0; oy < Ho; oy += DW_ROWS) {
            long nr = Ho - oy < DW_ROWS ? Ho - oy : DW_ROWS;
            for (long ox0 = 0; ox0 < Wo; ox0 += 16) {
                __m512 acc[DW_ROWS];
                _Pragma("GCC unroll 4")
                for (int r = 0; r < DW_ROWS; r++) acc[r] = fill;
                for (long ky = 0; ky < KH; ky++) {
                    const float *rows[DW_ROWS];
                    tap_rows(rows, xp, oy, nr, ky * dh - pt, sh, H, W);
                    for (long kx = 0; kx < KW; kx++) {
                        tap_cols tc = tap_columns(ox0, pl, kx * dw, sw, W);
                        _Pragma("GCC unroll 4")
                        for (int r = 0; r < DW_ROWS; r++) {
                            if (!rows[r]) continue;
                            __m512 v = load_tap(rows[r], &tc, ev, fill);
                            if (mode == 0) {  /* (a NaN tap makes the lane NaN; max keeps it: it returns its second
                                                  operand, acc, when either is NaN) */
                                __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
                                acc[r] = _mm512_mask_blend_ps(nan, _mm512_max_ps(v, acc[r]), v);
                            } else {
                                acc[r] = _mm512_add_ps(acc[r], v);
                            }
                        }
                    }
                }
                __mmask16 om = tail_mask(Wo - ox0);
                _Pragma("GCC unroll 4")
                for (int r = 0; r < DW_ROWS; r++) {
                    if (r >= nr) break;
                    long at = (oy + r) * Wo + ox0;
                    __m512 v = acc[r];
                    if (div) v = _mm512_div_ps(v, _mm512_maskz_loadu_ps(om, div + at));
                    _mm512_mask_storeu_ps(yp + at, om, v);
                }
            }
        }
    }
}
