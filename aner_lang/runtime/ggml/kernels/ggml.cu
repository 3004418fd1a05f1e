// GGML block formats (ggml-common.h layouts) on the GPU: dequantize, and the few-token forward and
// input-gradient matmuls with the weight dequantized in registers. Compiled by NVRTC once per block
// type, chosen by -DGGML_Q4_0 ... -DGGML_Q6_K (runtime/ggml/fused.py), so a run builds only the
// types its file holds.
//
// Layout of one weight W[N, K]: N rows of K / QK blocks, each block TS bytes, rows back to back
// (raw[N * K / QK * TS] uint8). Weights are handled in groups of 8 consecutive ones: a group never
// crosses a block or a sub-block, so `deq8` decodes it from its block alone.
//
// Every value is the same fp32 arithmetic, in the same order, as the torch dequantizers of
// runtime/io/ggml_blocks.py (themselves bit-equal to the gguf package's reference): products and sums
// are rounded one at a time (__fmul_rn, __fadd_rn: no FMA contraction), so the dense weight is
// bit-identical to host_tiled's and rounded to the compute dtype only when stored. No header is
// included: 16-bit floats are moved as raw words and converted with PTX.
//
// Kernels (extern "C" names are what the Python side looks up):
//   ggml_dequant_{f32,f16,bf16}      groups [first, first + n) of the flat weight -> out[0, 8n)
//   ggml_gemv_{f32,f16,bf16}_m{1,2,4,8,16}   y[M,N] = x[M,K] W^T in fp32, one warp per output row
//   ggml_bwd_{f32,f16,bf16}_m{1,2,4,8,16}    slabs of gx[M,K] = gy[M,N] W in fp32, one per warp

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

// ---- 16-bit words ------------------------------------------------------------------------------

struct F32 {};
struct F16 {};
struct BF16 {};

__device__ __forceinline__ float from16(F16, u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ float from16(BF16, u16 h) { return __uint_as_float(static_cast<u32>(h) << 16); }

__device__ __forceinline__ u32 pack2(F16, float lo, float hi) {
    u32 d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
__device__ __forceinline__ u32 pack2(BF16, float lo, float hi) {
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// A little-endian fp16 field of a block (blocks start on even bytes, but read bytewise anyway).
__device__ __forceinline__ float f16_at(const u8* p) {
    return from16(F16(), static_cast<u16>(p[0] | (p[1] << 8)));
}
__device__ __forceinline__ u32 u32_at(const u8* p) {
    return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<u32>(p[3]) << 24);
}

// The 8 values x[0..8) of one row of x as fp32 (16-byte aligned: K % 8 == 0, rows 16-byte aligned).
__device__ __forceinline__ void load8(F32, const float* x, float (&v)[8]) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(x));
    const float4 b = __ldg(reinterpret_cast<const float4*>(x) + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
template <typename T>
__device__ __forceinline__ void load8(T, const u16* x, float (&v)[8]) {
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(x));
    const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = from16(T(), static_cast<u16>(w[i] & 0xffffu));
        v[2 * i + 1] = from16(T(), static_cast<u16>(w[i] >> 16));
    }
}
__device__ __forceinline__ float load1(F32, const float* x) { return __ldg(x); }
template <typename T>
__device__ __forceinline__ float load1(T, const u16* x) { return from16(T(), __ldg(x)); }

__device__ __forceinline__ void store8(F32, float* o, const float (&v)[8]) {
    float4* q = reinterpret_cast<float4*>(o);
    q[0] = make_float4(v[0], v[1], v[2], v[3]);
    q[1] = make_float4(v[4], v[5], v[6], v[7]);
}
template <typename T>
__device__ __forceinline__ void store8(T, u16* o, const float (&v)[8]) {
    *reinterpret_cast<uint4*>(o) = make_uint4(pack2(T(), v[0], v[1]), pack2(T(), v[2], v[3]),
                                              pack2(T(), v[4], v[5]), pack2(T(), v[6], v[7]));
}

template <typename T> struct Elem { typedef u16 type; };
template <> struct Elem<F32> { typedef float type; };

// ---- block types: QK weights in TS bytes; deq8(block, p, v) decodes weights p..p+8 (p % 8 == 0) --

// Low nibble of byte j for weights j < half, the high nibble of byte j - half for the others.
__device__ __forceinline__ int nibble(const u8* qs, int j, int half) {
    return j < half ? (qs[j] & 15) : (qs[j - half] >> 4);
}

struct Q4_0 {
    static constexpr int QK = 32, TS = 18;
    __device__ static void deq8(const u8* b, int p, float (&v)[8]) {
        const float d = f16_at(b);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(static_cast<float>(nibble(b + 2, p + i, 16)) - 8.0f, d);
    }
};

struct Q4_1 {
    static constexpr int QK = 32, TS = 20;
    __device__ static void deq8(const u8* b, int p, float (&v)[8]) {
        const float d = f16_at(b), m = f16_at(b + 2);
#pragma unroll
        for (int i = 0; i < 8; ++i)
            v[i] = __fadd_rn(__fmul_rn(static_cast<float>(nibble(b + 4, p + i, 16)), d), m);
    }
};

struct Q5_0 {
    static constexpr int QK = 32, TS = 22;
    __device__ static void deq8(const u8* b, int p, float (&v)[8]) {
        const float d = f16_at(b);
        const u32 qh = u32_at(b + 2);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = nibble(b + 6, p + i, 16) | (((qh >> (p + i)) & 1) << 4);
            v[i] = __fmul_rn(d, static_cast<float>(q - 16));
        }
    }
};

struct Q5_1 {
    static constexpr int QK = 32, TS = 24;
    __device__ static void deq8(const u8* b, int p, float (&v)[8]) {
        const float d = f16_at(b), m = f16_at(b + 2);
        const u32 qh = u32_at(b + 4);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = nibble(b + 8, p + i, 16) | (((qh >> (p + i)) & 1) << 4);
            v[i] = __fadd_rn(__fmul_rn(d, static_cast<float>(q)), m);
        }
    }
};

struct Q8_0 {
    static constexpr int QK = 32, TS = 34;
    __device__ static void deq8(const u8* b, int p, float (&v)[8]) {
        const float d = f16_at(b);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(static_cast<float>(static_cast<signed char>(b[2 + p + i])), d);
    }
};

// The 6-bit scale and min of sub-block s (0..7) of a Q4_K/Q5_K block's 12 packed bytes.
__device__ __forceinline__ void scale_min_k4(const u8* s, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// d*sc*q - dmin*m for the 8 quants q of one Q4_K/Q5_K sub-block s.
__device__ __forceinline__ void k_scaled(const u8* b, int s, const int (&q)[8], float (&v)[8]) {
    int sc, mn;
    scale_min_k4(b + 4, s, sc, mn);
    const float d = __fmul_rn(f16_at(b), static_cast<float>(sc));
    const float dm = __fmul_rn(f16_at(b + 2), static_cast<float>(mn));
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fsub_rn(__fmul_rn(d, static_cast<float>(q[i])), dm);
}

struct Q4_K {
    static constexpr int QK = 256, TS = 144;
    __device__ static void deq8(const u8* b, int p, float (&v)[8]) {
        const int s = p >> 5, i0 = p & 31;  // sub-block s: nibble s & 1 of bytes 32 * (s / 2) + i
        const u8* qs = b + 16 + 32 * (s >> 1) + i0;
        const int shift = (s & 1) * 4;
        int q[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] = (qs[i] >> shift) & 15;
        k_scaled(b, s, q, v);
    }
};

struct Q5_K {
    static constexpr int QK = 256, TS = 176;
    __device__ static void deq8(const u8* b, int p, float (&v)[8]) {
        const int s = p >> 5, i0 = p & 31;  // the fifth bit: bit s of qh[i]
        const u8* qs = b + 48 + 32 * (s >> 1) + i0;
        const u8* qh = b + 16 + i0;
        const int shift = (s & 1) * 4;
        int q[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] = ((qs[i] >> shift) & 15) | (((qh[i] >> s) & 1) << 4);
        k_scaled(b, s, q, v);
    }
};

struct Q6_K {
    static constexpr int QK = 256, TS = 210;
    __device__ static void deq8(const u8* b, int p, float (&v)[8]) {
        // Weight p = 128c + 32r + l: low 4 bits from nibble r / 2 of ql[64c + 32(r % 2) + l], high 2
        // bits from bits 2r of qh[32c + l]; scale p / 16 (int8) times d.
        const int c = p >> 7, r = (p >> 5) & 3, l0 = p & 31;
        const u8* ql = b + 64 * c + 32 * (r & 1) + l0;
        const u8* qh = b + 128 + 32 * c + l0;
        const int shift = (r >> 1) * 4;
        const float d = __fmul_rn(f16_at(b + 208), static_cast<float>(static_cast<signed char>(b[192 + (p >> 4)])));
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = (((ql[i] >> shift) & 15) | (((qh[i] >> (2 * r)) & 3) << 4)) - 32;
            v[i] = __fmul_rn(d, static_cast<float>(q));
        }
    }
};

#if defined(GGML_Q4_0)
typedef Q4_0 Q;
#elif defined(GGML_Q4_1)
typedef Q4_1 Q;
#elif defined(GGML_Q5_0)
typedef Q5_0 Q;
#elif defined(GGML_Q5_1)
typedef Q5_1 Q;
#elif defined(GGML_Q8_0)
typedef Q8_0 Q;
#elif defined(GGML_Q4_K)
typedef Q4_K Q;
#elif defined(GGML_Q5_K)
typedef Q5_K Q;
#elif defined(GGML_Q6_K)
typedef Q6_K Q;
#else
#error "define one block type: -DGGML_Q4_0 ... -DGGML_Q6_K"
#endif

constexpr int GROUPS = Q::QK / 8;  // groups of 8 weights per block

// Weights 8g..8g+8 of row `row` (g counted within the row).
__device__ __forceinline__ void row_group(const u8* raw, long long row_bytes, long long row, int g, float (&v)[8]) {
    Q::deq8(raw + row * row_bytes + static_cast<long long>(g / GROUPS) * Q::TS, (g % GROUPS) * 8, v);
}

// ---- dequantize: one thread per group of 8 (coalesced 16- or 32-byte stores) ---------------------

template <typename T>
__device__ void dequant(const u8* raw, long long first, long long n, typename Elem<T>::type* out) {
    const long long g = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= n) return;
    const long long flat = first + g;
    float v[8];
    Q::deq8(raw + (flat / GROUPS) * Q::TS, static_cast<int>(flat % GROUPS) * 8, v);
    store8(T(), out + 8 * g, v);
}

extern "C" __global__ void ggml_dequant_f32(const u8* raw, long long first, long long n, float* out) {
    dequant<F32>(raw, first, n, out);
}
extern "C" __global__ void ggml_dequant_f16(const u8* raw, long long first, long long n, u16* out) {
    dequant<F16>(raw, first, n, out);
}
extern "C" __global__ void ggml_dequant_bf16(const u8* raw, long long first, long long n, u16* out) {
    dequant<BF16>(raw, first, n, out);
}

// ---- few-token forward: y[m, n] = sum_k x[m, k] W[n, k], a warp per output row -------------------

// Lane l takes the groups l, l + 32, ... of its row; the M partial sums are reduced across the warp
// in a fixed order (the same bits on every run).
template <typename T, int M>
__device__ void gemv(const u8* raw, const typename Elem<T>::type* x, float* y, int m, int n, int k) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= n) return;
    const long long row_bytes = static_cast<long long>(k / Q::QK) * Q::TS;
    float acc[M];
#pragma unroll
    for (int t = 0; t < M; ++t) acc[t] = 0.0f;
    for (int g = lane; g < k / 8; g += 32) {
        float w[8];
        row_group(raw, row_bytes, row, g, w);
#pragma unroll
        for (int t = 0; t < M; ++t) {
            if (t < m) {
                float xv[8];
                load8(T(), x + static_cast<long long>(t) * k + 8 * g, xv);
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[t] = fmaf(xv[i], w[i], acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < M; ++t) {
        float s = acc[t];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0 && t < m) y[static_cast<long long>(t) * n + row] = s;
    }
}

// ---- few-token input gradient: gx[m, k] = sum_n gy[m, n] W[n, k] ---------------------------------

// Block (kb, split): lane l of warp w takes group 32 kb + l of the rows split*rows + w, + warps, ...
// and writes its M x 8 sums to slab (split * warps + w), which the caller adds up in a fixed order.
template <typename T, int M>
__device__ void bwd(const u8* raw, const typename Elem<T>::type* gy, float* parts, int m, int n, int k, int rows) {
    const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int g = blockIdx.x * 32 + lane;
    if (g >= k / 8) return;
    const long long row_bytes = static_cast<long long>(k / Q::QK) * Q::TS;
    const int r0 = blockIdx.y * rows, r1 = min(n, r0 + rows);
    float acc[M][8];
#pragma unroll
    for (int t = 0; t < M; ++t)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[t][i] = 0.0f;
    for (int r = r0 + warp; r < r1; r += warps) {
        float w[8];
        row_group(raw, row_bytes, r, g, w);
#pragma unroll
        for (int t = 0; t < M; ++t) {
            if (t < m) {
                const float gv = load1(T(), gy + static_cast<long long>(t) * n + r);
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[t][i] = fmaf(gv, w[i], acc[t][i]);
            }
        }
    }
    float* slab = parts + static_cast<long long>(blockIdx.y * warps + warp) * m * k;
#pragma unroll
    for (int t = 0; t < M; ++t)
        if (t < m) store8(F32(), slab + static_cast<long long>(t) * k + 8 * g, acc[t]);
}

#define GGML_FEW(T, NAME, MM)                                                                              \
    extern "C" __global__ void ggml_gemv_##NAME##_m##MM(const u8* raw, const Elem<T>::type* x, float* y, \
                                                        int m, int n, int k) {                             \
        gemv<T, MM>(raw, x, y, m, n, k);                                                                   \
    }                                                                                                      \
    extern "C" __global__ void ggml_bwd_##NAME##_m##MM(const u8* raw, const Elem<T>::type* gy,            \
                                                       float* parts, int m, int n, int k, int rows) {      \
        bwd<T, MM>(raw, gy, parts, m, n, k, rows);                                                         \
    }
#define GGML_FEW_ALL(T, NAME) \
    GGML_FEW(T, NAME, 1) GGML_FEW(T, NAME, 2) GGML_FEW(T, NAME, 4) GGML_FEW(T, NAME, 8) GGML_FEW(T, NAME, 16)

GGML_FEW_ALL(F32, f32)
GGML_FEW_ALL(F16, f16)
GGML_FEW_ALL(BF16, bf16)
