/* The online softmax's row passes for the CPU attention kernels, in vectors of FS_VEC_BYTES bytes (no include guard:
 * included once per width after common/cpu_tile.h, which names the vector types; functions get the width as a
 * suffix):
 *
 *   fs_max_row_f / _d(s, n, m)     max(m, s[0..n)), NaN if any is NaN (as torch's max)
 *   fs_exp_row_f / _d(s, n, mx)    s[c] = e^(s[c] - mx) for c < n, returning their sum
 *
 * The float exponential is a polynomial a vector at a time (Cephes' expf: e^x = 2^k p(r), r = x - k ln 2 in two
 * parts, degree 6; at most 1.5 ulp from e^x; 0 below e^-87 and for -inf, inf above e^88.72, NaN kept), about 7x
 * libm's expf with 8 lanes; the double one is libm's exp. */

/* max(m, s[0], ..., s[n - 1]) in float, NaN if any of them is NaN. */
static inline __attribute__((always_inline)) float FS_V(fs_max_row_f)(const float *s, int n, float m)
{
    typedef FS_V(fs_vf) vf;
    typedef FS_V(fs_vi) vi;
    enum { L = FS_VEC_BYTES / 4 };
    vf best = (vf){0} + m;
    int c = 0;
    for (; c + L <= n; c += L) {
        const vf x = *(const vf *)(s + c);
        const vi take = (x > best) | (x != x);
        best = (vf)(((vi)x & take) | ((vi)best & ~take));
    }
    for (int i = 0; i < L; i++) m = best[i] > m || best[i] != best[i] ? best[i] : m;
    for (; c < n; c++) m = s[c] > m || s[c] != s[c] ? s[c] : m;
    return m;
}

/* The same in double. */
static inline __attribute__((always_inline)) double FS_V(fs_max_row_d)(const double *s, int n, double m)
{
    for (int c = 0; c < n; c++) m = s[c] > m || s[c] != s[c] ? s[c] : m;
    return m;
}

/* s[c] = e^(s[c] - mx) for c < n in float, returning their sum. */
static inline __attribute__((always_inline)) float FS_V(fs_exp_row_f)(float *s, int n, float mx)
{
    typedef FS_V(fs_vf) vf;
    typedef FS_V(fs_vi) vi;
    enum { L = FS_VEC_BYTES / 4 };
    const vf lo = (vf){0} - 87.0f, hi = (vf){0} + 88.72f, magic = (vf){0} + 12582912.0f; /* 1.5 2^23: rounds */
    const vi inf = (vi){0} + 0x7f800000;
    vf total = {0};
    int c = 0;
    for (; c + L <= n; c += L) {
        vf x = *(const vf *)(s + c) - mx;
        const vi small = x < lo;                                           /* e^x < 2^-125 (and -inf): 0 */
        x = (vf)(((vi)x & ~small) | ((vi)lo & small));
        const vf t = x * 1.44269504088896341f + magic, k = t - magic;      /* k = round(x log2 e) */
        const vf r = (x - k * 0.693359375f) - k * -2.12194440e-4f;         /* x - k ln 2 */
        vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
        p = p * r + 8.3334519073e-3f;
        p = p * r + 4.1665795894e-2f;
        p = p * r + 1.6666665459e-1f;
        p = p * r + 5.0000001201e-1f;
        p = p * r * r + r + 1.0f;
        const vi two_k = ((vi)t - (vi)magic + 127) << 23;                  /* 2^k as a float's bits */
        const vi big = x > hi;                                             /* e^x past FLT_MAX: inf */
        const vf e = (vf)((((vi)(p * (vf)two_k) & ~big) | (inf & big)) & ~small);
        *(vf *)(s + c) = e;
        total += e;
    }
    float sum = 0;
    for (int i = 0; i < L; i++) sum += total[i];
    for (; c < n; c++) {
        s[c] = expf(s[c] - mx);
        sum += s[c];
    }
    return sum;
}

/* The same in double, by libm's exp. */
static inline __attribute__((always_inline)) double FS_V(fs_exp_row_d)(double *s, int n, double mx)
{
    double sum = 0;
    for (int c = 0; c < n; c++) {
        s[c] = exp(s[c] - mx);
        sum += s[c];
    }
    return sum;
}
