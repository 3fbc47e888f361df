"""Writes ``sgemm_avx512.c``: an AVX-512 single-precision GEMM micro-kernel over OpenBLAS's packed layouts.

The kernel has the signature and the semantics of OpenBLAS's ``sgemm_kernel_<core>``, which onnxpy's packed products
call (see ``onnxpy/ops/_packed.py``)::

    void sgemm_kernel(long m, long n, long k, float alpha, const float *A, const float *B, float *C, long ldc)

C (column-major, ``ldc`` apart) += alpha * A @ B, where
- ``A`` holds m features x k depth packed as OpenBLAS's ``sgemm_itcopy``/``incopy`` pack them: panels of 16 features
  (for each depth step, 16 consecutive floats), then one panel each of 8, 4, 2 and 1 for what is left (by m's bits);
- ``B`` holds n rows x k depth packed as ``sgemm_oncopy`` packs them: panels of 4 rows, then one each of 2 and 1.

Every output element is accumulated in depth order by fused multiply-adds from zero, then added to C as
fma(sum, alpha, C) -- the order of OpenBLAS's SkylakeX kernel, so both give the same bits (the tests check that).

Tiles: 3 panels of 16 features x 2 panels of 4 rows (24 accumulators in zmm registers, 3 loads of A and 8 broadcasts
of B per 24 multiply-adds), with smaller tiles for the edges (feature panels of 8 and 4 in 256- and 128-bit
registers, of 2 and 1 as scalar multiply-adds).  Measured on the AMD EPYC (Zen 4) benchmark machine: 111-112
GFLOP/s on one core with both operands in L2 against OpenBLAS's 104 (the core's peak measured with independent
multiply-adds: 116-117), 105-107 against 99-102 with the weights streamed from memory.

Run ``python tools/native/build.py`` to regenerate the C file and the machine code embedded in
``onnxpy/ops/_native_code.py`` (needs gcc with AVX-512 support).
"""

from __future__ import annotations

import sys

MA = 3  # feature panels (of 16) per tile
NP = 2  # row panels (of 4) per tile
UNROLL = 4  # depth steps per loop iteration
OUTER = "rows"  # the outer loop: "rows" (row tiles) or "features" (feature tiles)


# vector kinds by feature-panel width: (C type, zero, load, broadcast, fused multiply-add)
_VEC = {
    16: ("__m512", "_mm512_setzero_ps()", "_mm512_loadu_ps", "_mm512_set1_ps", "_mm512_fmadd_ps",
         "_mm512_storeu_ps"),
    8: ("__m256", "_mm256_setzero_ps()", "_mm256_loadu_ps", "_mm256_set1_ps", "_mm256_fmadd_ps", "_mm256_storeu_ps"),
    4: ("__m128", "_mm_setzero_ps()", "_mm_loadu_ps", "_mm_set1_ps", "_mm_fmadd_ps", "_mm_storeu_ps"),
}


def _tile(ma: int, np_: int, h: int, w: int = 16) -> str:
    """One tile: ``ma`` feature panels of ``w`` (16; or one panel of 8, 4, 2 or 1 at the edge) against ``np_`` row
    panels of height ``h``.  Panels of 2 and 1 features run as scalar multiply-adds."""
    nr = np_ * h
    out = [f"static __attribute__((noinline)) void t{w}_{ma}_{np_}_{h}(long k, float alpha, const float *pa, "
           "const float *pb, float *cc, long ldc)", "{"]
    if w in _VEC:
        vt, zero, load, bcast, fma, store = _VEC[w]
        lanes = [("", 0)]
    else:  # (2 or 1 features: one scalar accumulator per feature)
        vt, zero = "float", "0.0f"
        lanes = [(f"_{f}", f) for f in range(w)]
    out += [f"    {vt} c{a}_{r}{ln} = {zero};" for a in range(ma) for r in range(nr) for ln, _ in lanes]
    out += [f"    const float *a{a} = pa + {a} * {w} * k;" for a in range(ma)]
    out += [f"    const float *b{q} = pb + {q} * {h} * k;" for q in range(np_)]
    out.append(f'    _Pragma("GCC unroll {UNROLL}")')
    out.append("    for (long p = 0; p < k; p++) {")
    if w in _VEC:
        out += [f"        {vt} x{a} = {load}(a{a} + {w} * p);" for a in range(ma)]
    else:
        out += [f"        float x{a}{ln} = a{a}[{w} * p + {f}];" for a in range(ma) for ln, f in lanes]
    for r in range(nr):
        q, i = divmod(r, h)
        if w in _VEC:
            out.append(f"        {{ {vt} b = {bcast}(b{q}[{h} * p + {i}]);")
            out += [f"          c{a}_{r} = {fma}(x{a}, b, c{a}_{r});" for a in range(ma)]
        else:
            out.append(f"        {{ float b = b{q}[{h} * p + {i}];")
            out += [f"          c{a}_{r}{ln} = __builtin_fmaf(x{a}{ln}, b, c{a}_{r}{ln});"
                    for a in range(ma) for ln, _ in lanes]
        out.append("        }")
    out.append("    }")
    if w in _VEC:
        out.append(f"    {vt} al = {bcast}(alpha);")
    for r in range(nr):
        for a in range(ma):
            if w in _VEC:
                out.append(f"    {{ float *o = cc + {r} * ldc + {w * a}; "
                           f"{store}(o, {fma}(c{a}_{r}, al, {load}(o))); }}")
            else:
                out += [f"    cc[{r} * ldc + {w * a + f}] = "
                        f"__builtin_fmaf(c{a}_{r}{ln}, alpha, cc[{r} * ldc + {w * a + f}]);" for ln, f in lanes]
    out.append("}")
    return "\n".join(out)


def _tile_a(ma: int, np_: int, h: int, masked: bool = False) -> str:
    """A tile of :func:`_kernel_a`: ``ma`` panels of 16 features read straight from an unpacked A (features
    contiguous, depth steps ``lda`` apart; ``masked``: one panel, its lanes outside ``tm`` neither read nor written)
    against ``np_`` packed row panels of height ``h``."""
    nr = np_ * h
    name = f"u_{ma}_{np_}_{h}" + ("_m" if masked else "")
    out = [f"static __attribute__((noinline)) void {name}(long k, float alpha, const float *pa, long lda, "
           "const float *pb, float *cc, long ldc, __mmask16 tm)", "{"]
    load = "_mm512_maskz_loadu_ps(tm, {})" if masked else "_mm512_loadu_ps({})"
    out += [f"    __m512 c{a}_{r} = _mm512_setzero_ps();" for a in range(ma) for r in range(nr)]
    out += [f"    const float *a{a} = pa + {16 * a};" for a in range(ma)]
    out += [f"    const float *b{q} = pb + {q} * {h} * k;" for q in range(np_)]
    out.append(f'    _Pragma("GCC unroll {UNROLL}")')
    out.append("    for (long p = 0; p < k; p++) {")
    out += [f"        __m512 x{a} = {load.format(f'a{a} + p * lda')};" for a in range(ma)]
    for r in range(nr):
        q, i = divmod(r, h)
        out.append(f"        {{ __m512 b = _mm512_set1_ps(b{q}[{h} * p + {i}]);")
        out += [f"          c{a}_{r} = _mm512_fmadd_ps(x{a}, b, c{a}_{r});" for a in range(ma)]
        out.append("        }")
    out.append("    }")
    out.append("    __m512 al = _mm512_set1_ps(alpha);")
    for r in range(nr):
        for a in range(ma):
            o = f"cc + {r} * ldc + {16 * a}"
            if masked:
                out.append(f"    _mm512_mask_storeu_ps({o}, tm, _mm512_fmadd_ps(c{a}_{r}, al, "
                           f"_mm512_maskz_loadu_ps(tm, {o})));")
            else:
                out.append(f"    _mm512_storeu_ps({o}, _mm512_fmadd_ps(c{a}_{r}, al, _mm512_loadu_ps({o})));")
    out.append("}")
    return "\n".join(out)


def _kernel_a() -> list:
    """``sgemm_kernel_a``: the packed kernel's products with A unpacked -- feature f at depth p is A[f + p * lda] (a
    convolution's image: positions contiguous, channels a plane apart), so a product needs no packing of A; the same
    sums in the same order as the packed kernel on the packed copy of A."""
    out = []
    for np_, h in _row_kinds():
        for ma in range(1, MA + 1):
            out += [_tile_a(ma, np_, h), ""]
        out += [_tile_a(1, np_, h, True), ""]
        out.append(f"static void rows_a_{np_}_{h}(long m, long k, float alpha, const float *A, long lda, "
                   "const float *pb, float *cc, long ldc)")
        out.append("{")
        out.append("    long m16 = m >> 4, i = 0;")
        out.append(f"    for (; i + {MA} <= m16; i += {MA}) "
                   f"u_{MA}_{np_}_{h}(k, alpha, A + i * 16, lda, pb, cc + i * 16, ldc, 0);")
        for ma in range(MA - 1, 0, -1):
            out.append(f"    if (m16 - i == {ma}) "
                       f"u_{ma}_{np_}_{h}(k, alpha, A + i * 16, lda, pb, cc + i * 16, ldc, 0);")
        out.append(f"    if (m & 15) u_1_{np_}_{h}_m(k, alpha, A + m16 * 16, lda, pb, cc + m16 * 16, ldc, "
                   "(__mmask16)((1u << (m & 15)) - 1u));")
        out += ["}", ""]
    out.append("void sgemm_kernel_a(long m, long n, long k, float alpha, const float *A, long lda, const float *B, "
               "float *C, long ldc)")
    out += _row_dispatch("rows_a", "A, lda")
    return out


def _row_dispatch(rows: str, a: str) -> list:
    """The body of a kernel entry: its n rows as tiles of ``NP`` panels of 4, the panels left, then 2 and 1 rows,
    each through ``<rows>_<panels>_<height>(m, k, alpha, <a>, B panel, C rows, ldc)``."""
    out = ["{", "    long n4 = n >> 2, j = 0;",
           f"    for (; j + {NP} <= n4; j += {NP}) "
           f"{rows}_{NP}_4(m, k, alpha, {a}, B + j * 4 * k, C + j * 4 * ldc, ldc);"]
    for np_ in range(NP - 1, 0, -1):
        out.append(f"    if (n4 - j == {np_}) {{ {rows}_{np_}_4(m, k, alpha, {a}, B + j * 4 * k, C + j * 4 * ldc, "
                   f"ldc); j += {np_}; }}")
    out += ["    long r0 = j * 4;", "    const float *pb = B + r0 * k;",
            f"    if (n & 2) {{ {rows}_1_2(m, k, alpha, {a}, pb, C + r0 * ldc, ldc); pb += 2 * k; r0 += 2; }}",
            f"    if (n & 1) {rows}_1_1(m, k, alpha, {a}, pb, C + r0 * ldc, ldc);", "}"]
    return out


def _row_kinds():
    """(row panels per tile, panel height) of every row tile."""
    return [(np_, 4) for np_ in range(1, NP + 1)] + [(1, 2), (1, 1)]


def source() -> str:
    out = ["/* Generated by tools/native/gen_sgemm.py -- edit that file, then run tools/native/build.py. */",
           "#include <immintrin.h>", ""]
    for np_, h in _row_kinds():
        for ma in range(1, MA + 1):
            out += [_tile(ma, np_, h), ""]
        for w in (8, 4, 2, 1):
            out += [_tile(1, np_, h, w), ""]
    if OUTER == "features":
        out += _features_outer()
    else:
        out += _rows_outer()
    out += ["", ""] + _kernel_a()
    return "\n".join(out) + "\n"


_SIGNATURE = ("void sgemm_kernel(long m, long n, long k, float alpha, const float *A, const float *B, float *C, "
              "long ldc)")


def _features_outer() -> list:
    """Each feature tile (its packed A, ``k`` deep, stays in L1) against every row panel in turn."""
    out = []
    for w, mas in ((16, range(1, MA + 1)), (8, (1,)), (4, (1,)), (2, (1,)), (1, (1,))):
        for ma in mas:
            out.append(f"static void feat{w}_{ma}(long n, long k, float alpha, const float *pa, const float *B, "
                       "float *cc, long ldc)")
            out.append("{")
            out.append("    long n4 = n >> 2, j = 0;")
            out.append(f"    for (; j + {NP} <= n4; j += {NP}) "
                       f"t{w}_{ma}_{NP}_4(k, alpha, pa, B + j * 4 * k, cc + j * 4 * ldc, ldc);")
            for np_ in range(NP - 1, 0, -1):
                out.append(f"    if (n4 - j == {np_}) {{ t{w}_{ma}_{np_}_4(k, alpha, pa, B + j * 4 * k, "
                           f"cc + j * 4 * ldc, ldc); j += {np_}; }}")
            out.append("    long r0 = j * 4;")
            out.append("    const float *pb = B + r0 * k;")
            out.append(f"    if (n & 2) {{ t{w}_{ma}_1_2(k, alpha, pa, pb, cc + r0 * ldc, ldc); "
                       "pb += 2 * k; r0 += 2; }")
            out.append(f"    if (n & 1) t{w}_{ma}_1_1(k, alpha, pa, pb, cc + r0 * ldc, ldc);")
            out += ["}", ""]
    out.append(_SIGNATURE)
    out.append("{")
    out.append("    long m16 = m >> 4, i = 0;")
    out.append(f"    for (; i + {MA} <= m16; i += {MA}) feat16_{MA}(n, k, alpha, A + i * 16 * k, B, C + i * 16, ldc);")
    for ma in range(MA - 1, 0, -1):
        out.append(f"    if (m16 - i == {ma}) feat16_{ma}(n, k, alpha, A + i * 16 * k, B, C + i * 16, ldc);")
    out.append("    long f0 = m16 * 16;")
    for w in (8, 4, 2, 1):
        out.append(f"    if (m & {w}) {{ feat{w}_1(n, k, alpha, A + f0 * k, B, C + f0, ldc); f0 += {w}; }}")
    out.append("}")
    return out


def _rows_outer() -> list:
    """Each row tile (its packed B, ``k`` deep, stays in L1) against every feature panel in turn."""
    out = []
    for np_, h in _row_kinds():
        out.append(f"static void rows_{np_}_{h}(long m, long k, float alpha, const float *A, const float *pb, "
                   "float *cc, long ldc)")
        out.append("{")
        out.append("    long m16 = m >> 4, i = 0;")
        out.append(f"    for (; i + {MA} <= m16; i += {MA}) "
                   f"t16_{MA}_{np_}_{h}(k, alpha, A + i * 16 * k, pb, cc + i * 16, ldc);")
        for ma in range(MA - 1, 0, -1):
            out.append(f"    if (m16 - i == {ma}) t16_{ma}_{np_}_{h}(k, alpha, A + i * 16 * k, pb, cc + i * 16, ldc);")
        out.append("    long f0 = m16 * 16;")
        for w in (8, 4, 2, 1):
            out.append(f"    if (m & {w}) {{ t{w}_1_{np_}_{h}(k, alpha, A + f0 * k, pb, cc + f0, ldc); f0 += {w}; }}")
        out += ["}", ""]
    out.append(_SIGNATURE)
    out += _row_dispatch("rows", "A")
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1:
        OUTER = sys.argv[1]
    sys.stdout.write(source())
