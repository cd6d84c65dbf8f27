"""Vectorizable elementwise math for generated numba kernels.

numba lowers `math.exp`, `math.sin`, ... to scalar libm calls, so a fused loop that calls
them does not vectorize and runs several times slower per element than NumPy's SIMD
ufuncs. The functions here are branch-free arithmetic (selects, bitcasts, no calls) and
carry LLVM's `alwaysinline`: a loop calling them vectorizes (ymm by default; zmm with
`NUMBA_CPU_FEATURES=<host features>,-prefer-256-bit` on AVX-512 hosts).

    float64: exp64 log64 tanh64 sigmoid64 sin64_fast cos64_fast (sin64 cos64)
    float32: exp32 log32 tanh32 sigmoid32 sin32_fast cos32_fast (sin32 cos32)
    generic: exp log tanh sigmoid sin_fast cos_fast sin cos (dispatch on the argument
             type inside numba code); tables FLOAT64, FLOAT32, FLOAT32_VIA64

float64: fdlibm/Cephes-style range reductions and polynomials with compensated final
sums. float32 is native float32 arithmetic (16 lanes per zmm; Cephes single-precision
polynomials, same reductions; sin/cos reduce in float64). FLOAT32_VIA64 computes float32
in float64 and rounds once (more accurate, about half the speed).

Max error measured (tests/backends/numba/test_vecmath.py, benchmarks/bench_vecmath.py;
float64 against long double, float32 against float64, and exhaustively over all 2**32
float32 inputs):
float64 exp 0.78, log 0.85, tanh 1.31, sigmoid 1.43, sin/cos 0.77 ulp (random, 1e6 per
range); float32 native over all 2**32 inputs: exp 0.77, log 0.83, tanh 1.34, sigmoid 1.48,
sin 0.93, cos 0.92 ulp; via-float64 0.50 ulp.
Special values follow NumPy: NaN -> NaN, exp overflow -> inf, underflow -> gradual
subnormals then 0, exp(-inf) = 0, log(+-0) = -inf, log(x < 0) = nan, log(inf) = inf,
subnormal inputs exact, tanh(+-inf) = +-1, sigmoid(+-inf) = 1/0, sin/cos(+-inf) = nan,
-0.0 kept by tanh and sin.

sin/cos range. The vector path reduces with fdlibm's three-part pi/2 split and error-free
sums (~150 bits of pi/2), exact for |x| <= TRIG_MAX (about 2**20 * pi/2 = 1.6e6;
<= 0.5 ulp even next to multiples of pi/2). For finite |x| > TRIG_MAX the `_fast`
functions return NaN (a flag, never a wrong number). `sin64`/`cos64`/`sin32`/`cos32` fall
back to libm for such an element: correct everywhere, but LLVM then evaluates the libm
call for every lane (it treats llvm.sin as speculatable), so their loops run at libm
speed. Generated kernels should use the `_fast` variants and OR `trig_out_of_range(arg)`
over the block, re-running the block with libm when it is set (`sin_block_guarded`).

Rules kept on purpose:
- No fastmath flags that assume no NaN/inf ('nnan', 'ninf', 'fast'), and no 'reassoc':
  the magic-number rounding (x + 1.5*2**52 - 1.5*2**52) and the error-free sums rely on
  IEEE evaluation order. Only 'contract' (FMA) is on (all products it could fuse in the
  error-free parts are exact). The flags are the callee's own and survive LLVM inlining
  into a caller compiled with {'reassoc', 'contract'} (tested). Do NOT use numba's
  inline='always' (numba-IR inlining would give this code the caller's flags); the
  `_always_inline()` intrinsic sets LLVM's attribute instead, since LLVM's cost model
  otherwise declines to inline e.g. tanh64 and the loop stays scalar.
- error_model='numpy': a division never raises (which would add a branch).
- Integers come from float bits (bitcast), never from fptosi of an unclamped value
  (poison in LLVM for out-of-range values).
"""
import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

# cache=True: numba keeps these compiled on disk, so a process building a new kernel
# that calls them compiles only the kernel (measured: 0.62 s instead of 1.2 s). The
# cached code still inlines into the kernel and vectorizes (same run time).
_OPTS = dict(fastmath={"contract"}, error_model="numpy", nogil=True, cache=True)
_jit = njit(**_OPTS)


# --- bitcasts ------------------------------------------------------------------------

def _bitcast(src, dst, lltype):
    @intrinsic
    def cast(typingctx, x):
        if x != src:
            return None
        sig = dst(src)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], lltype)
        return sig, codegen
    return cast


f64_as_i64 = _bitcast(types.float64, types.int64, ir.IntType(64))
i64_as_f64 = _bitcast(types.int64, types.float64, ir.DoubleType())
f32_as_i32 = _bitcast(types.float32, types.int32, ir.IntType(32))


@intrinsic
def i32_as_f32(typingctx, x):
    """The float32 whose bits are the low 32 bits of integer x (numba promotes int32
    arithmetic to int64; LLVM narrows it back)."""
    if not isinstance(x, types.Integer):
        return None
    sig = types.float32(x)

    def codegen(context, builder, signature, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif v.type.width < 32:
            v = builder.zext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())
    return sig, codegen


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c with one rounding, float32 or float64 (llvm.fma: vfmadd on FMA
    hardware; without FMA LLVM calls libm fma, which is correct but slow)."""
    if not (a == b == c and a in (types.float32, types.float64)):
        return None
    sig = a(a, a, a)

    def codegen(context, builder, signature, args):
        t = context.get_value_type(signature.return_type)
        fn = builder.module.declare_intrinsic("llvm.fma", [t], ir.FunctionType(t, [t, t, t]))
        return builder.call(fn, args)
    return sig, codegen


@intrinsic
def _always_inline(typingctx):
    """Mark the calling function `alwaysinline` for LLVM. LLVM's cost model otherwise
    declines to inline e.g. tanh64 into a loop, and a loop with a call does not
    vectorize. (numba's own inline='always' inlines at numba-IR level, where the code
    would take the caller's fastmath flags: not wanted, see the module docstring.)"""
    sig = types.none()

    def codegen(context, builder, signature, args):
        builder.function.attributes.add("alwaysinline")
        return context.get_dummy_value()
    return sig, codegen


@njit(fastmath={"reassoc"}, error_model="numpy", nogil=True, cache=True)
def acc_add(s, v):
    """s + v that LLVM may reorder: a generated kernel's sum accumulator update. The
    kernel itself has no fastmath (its elementwise ops are NumPy's, op by op); this
    add's flag survives inlining, which is all the loop vectorizer needs."""
    _always_inline()
    return s + v


# --- constants -----------------------------------------------------------------------

_SHIFT = 6755399441055744.0              # 1.5 * 2**52: x + _SHIFT - _SHIFT rounds x
_SHIFT_BITS = 0x4338000000000000         # bits of _SHIFT; bits(x + _SHIFT) - this = n
_INF = math.inf
_NAN = math.nan

# exp: x = n ln2 + r, |r| <= ln2/2; exp(r) = 1 + r + r^2 q(r), q near-minimax (mpmath
# chebyfit, |error| 1.0e-16 on q, i.e. ~1e-17 relative on exp(r)).
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01     # 32 significant bits: n * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
_E0, _E1, _E2, _E3, _E4, _E5, _E6, _E7, _E8, _E9 = (
    0.5000000000000001, 0.16666666666666669, 0.041666666666624164, 0.008333333333330065,
    0.0013888888917196719, 0.00019841269863040545, 2.4801521322368692e-05,
    2.7557268480310024e-06, 2.7620075879983367e-07, 2.5100375832561234e-08)
# degree-5 q for float32 results (|error| 1.4e-9 on q, ~2e-10 relative on exp(r))
_F0, _F1, _F2, _F3, _F4, _F5 = (
    0.5000000013457727, 0.16666666681614256, 0.04166646500604005, 0.008333310934448869,
    0.0013933641031986701, 0.00019890980869750327)

# log (fdlibm e_log.c): log(1+f) = f - f^2/2 + s (f^2/2 + R(s^2)), s = f / (2 + f)
_LG1, _LG2, _LG3, _LG4, _LG5, _LG6, _LG7 = (
    6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01,
    2.222219843214978396e-01, 1.818357216161805012e-01, 1.531383769920937332e-01,
    1.479819860511658591e-01)
_SQRT2_HALF_BITS = 0x3FE6A09E667F3BCD    # bits of sqrt(2)/2
_TINY = 2.2250738585072014e-308          # smallest normal float64
_TWO54 = 18014398509481984.0

# tanh (Cephes tanh.c): |x| <= 0.625: x + x z P(z)/Q(z), z = x^2; else 1 - 2/(exp(2|x|)+1)
_TP0, _TP1, _TP2 = -9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3
_TQ0, _TQ1, _TQ2 = 1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3

# sin/cos: fdlibm's pi/2 split (31, 32, 28 significant bits: n * P_i exact for n < 2^21)
_INVPIO2 = 6.36619772367581382433e-01
_PIO2_1 = 1.57079632673412561417e+00
_PIO2_2 = 6.07710050630396597660e-11
_PIO2_3 = 2.02226624871116645580e-21
_PIO2_3T = 8.47842766036889956997e-32
TRIG_MAX = 1647099.0                     # < 2**20 * pi/2: reduction exact below this
# fdlibm k_sin.c / k_cos.c kernels on |r| <= pi/4 (< 1 ulp)
_S1, _S2, _S3, _S4, _S5, _S6 = (
    -1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04,
    2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10)
_C1, _C2, _C3, _C4, _C5, _C6 = (
    4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05,
    -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11)


# --- exp -----------------------------------------------------------------------------

@_jit
def _exp_scale(p, ni):
    """p * 2**ni for ni in [-1082, 1040] with one rounding (two exact power-of-2 factors:
    subnormal results round once, overflow gives inf, deep underflow 0)."""
    _always_inline()
    n1 = ni >> 1
    n2 = ni - n1
    return (p * i64_as_f64((n1 + 1023) << 52)) * i64_as_f64((n2 + 1023) << 52)


@_jit
def exp64(x):
    _always_inline()
    # clamp so that n stays in [-1082, 1039]; written so NaN passes through unchanged
    xc = 720.0 if x > 720.0 else x
    xc = -750.0 if xc < -750.0 else xc
    t = xc * _LOG2E + _SHIFT
    n = t - _SHIFT
    ni = f64_as_i64(t) - _SHIFT_BITS
    hi = xc - n * _LN2_HI                   # exact
    lo = n * _LN2_LO
    r = hi - lo
    rlo = (hi - r) - lo                     # rounding error of r
    q = _E0 + r * (_E1 + r * (_E2 + r * (_E3 + r * (_E4 + r * (
        _E5 + r * (_E6 + r * (_E7 + r * (_E8 + r * _E9))))))))
    a = 1.0 + r
    aerr = (1.0 - a) + r                    # exact: |r| < 1
    p = a + (aerr + (rlo + (r * r) * q))    # one significant rounding: max ~0.52 ulp
    return _exp_scale(p, ni)


@_jit
def _exp_f32core(xd):
    """exp of a float64 argument to ~2e-10 relative (enough for a float32 result)."""
    _always_inline()
    xc = 200.0 if xd > 200.0 else xd
    xc = -200.0 if xc < -200.0 else xc
    t = xc * _LOG2E + _SHIFT
    n = t - _SHIFT
    ni = f64_as_i64(t) - _SHIFT_BITS
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    q = _F0 + r * (_F1 + r * (_F2 + r * (_F3 + r * (_F4 + r * _F5))))
    p = 1.0 + (r + (r * r) * q)
    return p * i64_as_f64((ni + 1023) << 52)   # |ni| <= 289: one normal factor


@_jit
def exp32_via64(x):
    _always_inline()
    return np.float32(_exp_f32core(np.float64(x)))


# --- log -----------------------------------------------------------------------------

@_jit
def log64(x):
    _always_inline()
    sub = x < _TINY                         # subnormal (or <= 0, fixed up below)
    xs = x * _TWO54 if sub else x
    kadj = -54 if sub else 0
    hx = f64_as_i64(xs) + (0x3FF0000000000000 - _SQRT2_HALF_BITS)
    k = (hx >> 52) - 1023 + kadj
    m = i64_as_f64((hx & 0x000FFFFFFFFFFFFF) + _SQRT2_HALF_BITS)   # in [sqrt2/2, sqrt2)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    R = t2 + t1
    hfsq = 0.5 * f * f
    dk = np.float64(k)
    y = dk * _LN2_HI - ((hfsq - (s * (hfsq + R) + dk * _LN2_LO)) - f)
    y = _INF if x == _INF else y
    y = -_INF if x == 0.0 else y
    y = _NAN if x < 0.0 else y
    return x if x != x else y


@_jit
def log32_via64(x):
    _always_inline()
    return np.float32(log64(np.float64(x)))


# --- tanh / sigmoid ------------------------------------------------------------------

@_jit
def _sign_of(v, x):
    """|v| with the sign bit of x (copysign)."""
    _always_inline()
    return i64_as_f64((f64_as_i64(v) & 0x7FFFFFFFFFFFFFFF)
                      | (f64_as_i64(x) & -0x8000000000000000))


@_jit
def tanh64(x):
    _always_inline()
    ax = abs(x)
    big = ax > 0.625
    z = ax * ax
    s = exp64(ax + ax)
    # one division for both branches
    num = 2.0 if big else (_TP0 * z + _TP1) * z + _TP2
    den = s + 1.0 if big else ((z + _TQ0) * z + _TQ1) * z + _TQ2
    d = num / den
    y = 1.0 - d if big else ax + ax * z * d
    return _sign_of(y, x)


@_jit
def tanh32_via64(x):
    _always_inline()
    return np.float32(tanh64(np.float64(x)))


@_jit
def sigmoid64(x):
    """1 / (1 + exp(-x)); e/(1+e) with e = exp(-|x|) for x < 0 (no overflow, accurate
    tiny results)."""
    _always_inline()
    e = exp64(-abs(x))
    d = 1.0 + e
    derr = (1.0 - d) + e                    # d + derr == 1 + e exactly
    pos = x >= 0.0
    num = 1.0 if pos else e
    s0 = num / d
    # one Newton-style correction for derr and the division's rounding; 1/d is
    # s0 (num = 1) or 1 - s0 (num = e), accurate enough for a correction term
    res = fma(-s0, d, num) - s0 * derr    # num - s0 (1 + e)
    rcp = s0 if pos else 1.0 - s0
    return s0 + res * rcp


@_jit
def sigmoid32_via64(x):
    _always_inline()
    xd = np.float64(x)
    e = _exp_f32core(-abs(xd))
    num = 1.0 if xd >= 0.0 else e
    return np.float32(num / (1.0 + e))


# --- sin / cos -----------------------------------------------------------------------

@_jit
def _two_diff(a, b):
    """(s, e) with s = fl(a - b), s + e = a - b exactly (Knuth TwoSum)."""
    _always_inline()
    s = a - b
    bb = s - a
    e = (a - (s - bb)) - (b + bb)
    return s, e


@_jit
def _trig_core(x, want_cos):
    """sin(x) (want_cos False) or cos(x) on the vector path, no fallback."""
    _always_inline()
    t = x * _INVPIO2 + _SHIFT
    fn = t - _SHIFT
    q = ((f64_as_i64(t) & 3) + (1 if want_cos else 0)) & 3   # _SHIFT_BITS & 3 == 0
    r = x - fn * _PIO2_1                      # exact (n * P1 exact, Sterbenz)
    r, e1 = _two_diff(r, fn * _PIO2_2)        # fn * P2, fn * P3 exact
    r, e2 = _two_diff(r, fn * _PIO2_3)
    tail = (e1 + e2) - fn * _PIO2_3T
    y0 = r + tail
    y1 = tail - (y0 - r)                      # y0 + y1 = x - fn pi/2 to ~2^-150 rel
    z = y0 * y0
    # sin kernel (k_sin.c, with tail)
    v = z * y0
    rs = _S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * _S6)))
    sk = y0 - ((z * (0.5 * y1 - v * rs) - y1) - v * _S1)
    # cos kernel (k_cos.c)
    w = z * z
    rc = z * (_C1 + z * (_C2 + z * _C3)) + w * w * (_C4 + z * (_C5 + z * _C6))
    hz = 0.5 * z
    w1 = 1.0 - hz
    ck = w1 + (((1.0 - w1) - hz) + (z * rc - y0 * y1))
    res = sk if (q & 1) == 0 else ck
    return -res if q >= 2 else res


@_jit
def trig_out_of_range(x):
    """True for finite x where the vector sin/cos path cannot reduce (|x| > TRIG_MAX)."""
    _always_inline()
    ax = abs(np.float64(x))
    return (ax > TRIG_MAX) & (ax < _INF)


@_jit
def sin64_fast(x):
    _always_inline()
    ax = abs(x)
    y = _trig_core(x, False)
    y = x if ax < 7.450580596923828e-09 else y     # |x| < 2^-27: sin x == x (keeps -0.0)
    return _NAN if ax > TRIG_MAX else y             # inf -> nan; finite huge -> nan flag


@_jit
def cos64_fast(x):
    _always_inline()
    ax = abs(x)
    y = _trig_core(x, True)
    return _NAN if ax > TRIG_MAX else y


@_jit
def sin64(x):
    _always_inline()
    y = sin64_fast(x)
    if trig_out_of_range(x):
        y = math.sin(x)
    return y


@_jit
def cos64(x):
    _always_inline()
    y = cos64_fast(x)
    if trig_out_of_range(x):
        y = math.cos(x)
    return y


@_jit
def sin32_via64_fast(x):
    _always_inline()
    return np.float32(sin64_fast(np.float64(x)))


@_jit
def cos32_via64_fast(x):
    _always_inline()
    return np.float32(cos64_fast(np.float64(x)))


# --- float32, native (float32 arithmetic, 16 lanes per zmm) --------------------------
# Cephes single-precision polynomials (expf, logf, tanhf, sinf, cosf) with the same
# range reductions and compensations as the float64 code; sin/cos reduce in float64
# (exact for |x| <= TRIG_MAX) and evaluate the kernels in float32 on (r, r_lo).

_H = np.float32
_H0, _H1, _H2, _HALF = _H(0.0), _H(1.0), _H(2.0), _H(0.5)
_HINF, _HNAN = _H(np.inf), _H(np.nan)
_H_SHIFT = _H(12582912.0)                 # 1.5 * 2**23
_H_SHIFT_BITS = 0x4B400000
_H_LOG2E = _H(1.4426950408889634)
_H_C1 = _H(0.693359375)                   # ln2 = _H_C1 + _H_C2, _H_C1 has 9 bits
_H_C2 = _H(-2.12194440054690583e-4)
_HE0, _HE1, _HE2, _HE3, _HE4, _HE5 = (_H(5.0000001201e-1), _H(1.6666665459e-1), _H(4.1665795894e-2),
                                      _H(8.3334519073e-3), _H(1.3981999507e-3), _H(1.9875691500e-4))
_H_TINY = _H(1.17549435e-38)              # smallest normal float32
_H_TWO23 = _H(8388608.0)
_HL = tuple(_H(c) for c in (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
                            1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
                            3.3333331174e-1))
_HL0, _HL1, _HL2, _HL3, _HL4, _HL5, _HL6, _HL7, _HL8 = _HL
_HT0, _HT1, _HT2, _HT3, _HT4 = (_H(-5.70498872745e-3), _H(2.06390887954e-2), _H(-5.37397155531e-2),
                                _H(1.33314422036e-1), _H(-3.33332819422e-1))
_H_TANH_SMALL = _H(0.625)
_PIO2_1T = 6.07710050650619224932e-11     # pi/2 - _PIO2_1
_HS1, _HS2, _HS3 = _H(-1.6666654611e-1), _H(8.3321608736e-3), _H(-1.9515295891e-4)
_HC1, _HC2, _HC3 = _H(4.166664568298827e-2), _H(-1.388731625493765e-3), _H(2.443315711809948e-5)
_H_SIN_TINY = _H(2.44140625e-4)           # 2^-12: sin(x) rounds to x below this


@_jit
def _exp32_scale(p, ni):
    _always_inline()
    n1 = ni >> 1
    n2 = ni - n1
    return (p * i32_as_f32((n1 + 127) << 23)) * i32_as_f32((n2 + 127) << 23)


@_jit
def exp32(x):
    _always_inline()
    xc = _H(90.0) if x > _H(90.0) else x            # NaN passes through
    xc = _H(-110.0) if xc < _H(-110.0) else xc
    t = xc * _H_LOG2E + _H_SHIFT
    n = t - _H_SHIFT
    ni = f32_as_i32(t) - _H_SHIFT_BITS
    hi = xc - n * _H_C1                              # exact
    lo = n * _H_C2
    r = hi - lo
    rlo = (hi - r) - lo
    q = _HE0 + r * (_HE1 + r * (_HE2 + r * (_HE3 + r * (_HE4 + r * _HE5))))
    a = _H1 + r
    aerr = (_H1 - a) + r
    p = a + (aerr + (rlo + (r * r) * q))
    return _exp32_scale(p, ni)


@_jit
def log32(x):
    _always_inline()
    sub = x < _H_TINY
    xs = x * _H_TWO23 if sub else x
    kadj = -23 if sub else 0
    hx = f32_as_i32(xs) + (0x3F800000 - 0x3F3504F3)
    k = (hx >> 23) - 127 + kadj
    m = i32_as_f32((hx & 0x007FFFFF) + 0x3F3504F3)     # [sqrt(.5), sqrt(2))
    f = m - _H1
    z = f * f
    y = (((((((( _HL0 * f + _HL1) * f + _HL2) * f + _HL3) * f + _HL4) * f + _HL5) * f
            + _HL6) * f + _HL7) * f + _HL8) * f * z
    fe = _H(k)
    y = y + fe * _H_C2
    y = y - _HALF * z
    y = (f + y) + fe * _H_C1
    y = _HINF if x == _HINF else y
    y = -_HINF if x == _H0 else y
    y = _HNAN if x < _H0 else y
    return x if x != x else y


@_jit
def _sign_of32(v, x):
    _always_inline()
    return i32_as_f32((f32_as_i32(v) & 0x7FFFFFFF) | (f32_as_i32(x) & -0x80000000))


@_jit
def tanh32(x):
    _always_inline()
    ax = abs(x)
    z = ax * ax
    big = _H2 / (exp32(ax + ax) + _H1)
    small = ((((_HT0 * z + _HT1) * z + _HT2) * z + _HT3) * z + _HT4) * z * ax + ax
    y = _H1 - big if ax > _H_TANH_SMALL else small
    return _sign_of32(y, x)


@_jit
def sigmoid32(x):
    _always_inline()
    e = exp32(-abs(x))
    d = _H1 + e
    derr = (_H1 - d) + e
    pos = x >= _H0
    num = _H1 if pos else e
    s0 = num / d
    res = fma(-s0, d, num) - s0 * derr
    rcp = s0 if pos else _H1 - s0
    return s0 + res * rcp


@_jit
def _trig32_core(x, want_cos):
    _always_inline()
    xd = np.float64(x)
    t = xd * _INVPIO2 + _SHIFT
    fn = t - _SHIFT
    q = ((f64_as_i64(t) & 3) + (1 if want_cos else 0)) & 3
    rd = (xd - fn * _PIO2_1) - fn * _PIO2_1T          # first product exact (fn < 2^21)
    r = np.float32(rd)
    rlo = np.float32(rd - np.float64(r))
    z = r * r
    sk = r + (rlo + ((_HS3 * z + _HS2) * z + _HS1) * z * r)
    hz = _HALF * z
    w = _H1 - hz
    ck = w + (((_H1 - w) - hz) + (z * z * ((_HC3 * z + _HC2) * z + _HC1) - r * rlo))
    res = sk if (q & 1) == 0 else ck
    return -res if q >= 2 else res


@_jit
def sin32_fast(x):
    _always_inline()
    ax = abs(x)
    y = _trig32_core(x, False)
    y = x if ax < _H_SIN_TINY else y
    return _HNAN if ax > _H(TRIG_MAX) else y


@_jit
def cos32_fast(x):
    _always_inline()
    y = _trig32_core(x, True)
    return _HNAN if abs(x) > _H(TRIG_MAX) else y


@_jit
def sin32(x):
    _always_inline()
    y = sin32_fast(x)
    if trig_out_of_range(x):
        y = np.float32(math.sin(np.float64(x)))
    return y


@_jit
def cos32(x):
    _always_inline()
    y = cos32_fast(x)
    if trig_out_of_range(x):
        y = np.float32(math.cos(np.float64(x)))
    return y


@njit(**_OPTS)
def sin_block_guarded(a, out):
    """The pattern for a fused kernel using sin: a vectorized pass with the fast path that
    also ORs the out-of-range flag, then (rarely) a libm pass over the same block."""
    bad = False
    for i in range(a.shape[0]):
        out[i] = sin_fast(a[i])
        bad |= trig_out_of_range(a[i])
    if bad:
        for i in range(a.shape[0]):
            out[i] = math.sin(a[i])


# --- generic names (dispatch on float32/float64 inside numba code) -------------------

def _generic(name, f64, f32):
    def stub(x):
        """Python-level call: runs the compiled function of x's dtype."""
        if isinstance(x, np.float32):
            return f32(x)
        return f64(float(x))
    stub.__name__ = stub.__qualname__ = name

    @overload(stub, jit_options=_OPTS)
    def _ol(x):
        if x == types.float32:
            def impl32(x):
                _always_inline()
                return f32(x)
            return impl32
        if x == types.float64:
            def impl64(x):
                _always_inline()
                return f64(x)
            return impl64
        return None
    return stub


exp = _generic("exp", exp64, exp32)
log = _generic("log", log64, log32)
tanh = _generic("tanh", tanh64, tanh32)
sigmoid = _generic("sigmoid", sigmoid64, sigmoid32)
sin = _generic("sin", sin64, sin32)
cos = _generic("cos", cos64, cos32)
sin_fast = _generic("sin_fast", sin64_fast, sin32_fast)
cos_fast = _generic("cos_fast", cos64_fast, cos32_fast)

FLOAT64 = dict(exp=exp64, log=log64, tanh=tanh64, sin=sin64, cos=cos64, sigmoid=sigmoid64,
               sin_fast=sin64_fast, cos_fast=cos64_fast)
FLOAT32 = dict(exp=exp32, log=log32, tanh=tanh32, sin=sin32, cos=cos32, sigmoid=sigmoid32,
               sin_fast=sin32_fast, cos_fast=cos32_fast)
# float32 computed in float64 and rounded once (<= ~0.5 ulp; half the lanes per vector)
FLOAT32_VIA64 = dict(exp=exp32_via64, log=log32_via64, tanh=tanh32_via64, sigmoid=sigmoid32_via64,
                     sin_fast=sin32_via64_fast, cos_fast=cos32_via64_fast)


# --- measurement helper (NumPy, for tests and benchmarks) ----------------------------

def ulp_error(y, ref):
    """Elementwise error of `y` (float32/float64 array) in units in the last place of
    y's dtype, against a more precise reference `ref` (float64 or long double).
    0 where y equals ref rounded to y's dtype (including matching inf and NaN), inf where
    exactly one is non-finite or NaN."""
    y = np.asarray(y)
    dt = y.dtype
    ref = np.asarray(ref)
    with np.errstate(all="ignore"):
        ref_d = ref.astype(dt)
        same = (y == ref_d) | (np.isnan(y) & np.isnan(ref_d))
        spacing = np.spacing(np.abs(ref_d)).astype(np.longdouble)
        err = np.abs(y.astype(np.longdouble) - ref.astype(np.longdouble)) / spacing
    bad = ~np.isfinite(y) | ~np.isfinite(ref_d)
    err = np.where(bad, np.inf, err)
    return np.where(same, 0.0, err).astype(np.float64)
