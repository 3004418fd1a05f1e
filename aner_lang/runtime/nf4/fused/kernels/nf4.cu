// Fused NF4 (bitsandbytes layout, double-quantized absmax) kernels, compiled at run time by NVRTC.
//
// Layout of one weight W[N, K] (row-major, K % 64 == 0, so a 64-block never crosses a row):
//   packed[N*K/2]  uint8: byte j = nibble(2j) << 4 | nibble(2j+1)        (high nibble first)
//   qabsmax[N*K/64] uint8 index into code2, one per 64-block
//   code2[256]     float32 dynamic map;  absmax2[ceil(blocks/256)] float32;  offset: float32[1]
//   (read on the device, so the host never waits for it)
//   absmax(b) = code2[qabsmax[b]] * absmax2[b / 256] + offset;  w = NF4[nibble] * absmax(b)
// The weight is dequantized in fp32 (as bitsandbytes does) and rounded to the compute type only
// when it is fed to a tensor-core instruction. No header is included: half/bfloat16 values are
// moved as raw 16-bit words and converted with PTX, so the source compiles with plain NVRTC.
//
// Kernels (extern "C" names are what the Python side looks up):
//   nf4_dequant_{f32,f16,bf16}          W -> dense buffer (the many-token path feeds it to cuBLAS)
//   nf4_gemv_f32_m{1,2,4,8,16}          y[M,N] = x[M,K] W^T, fp32, one warp per output row
//   nf4_mma_fwd_{f16,bf16}_m{8,16}      y = x W^T on tensor cores (mma.sync m16n8k16, fp32 acc.)
//   nf4_bwd_f32_m{1,2,4,8,16}           gx[M,K] += gy[M,N] W, fp32, atomics over N splits
//   nf4_mma_bwd_{f16,bf16}_m{8,16}      gx[M,K] += gy W on tensor cores, fp32 atomics

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

__constant__ float NF4_CODE[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

// ---- 16-bit float helpers (raw words; no cuda_fp16.h) -------------------------------------------

struct F16 {};
struct BF16 {};

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
__device__ __forceinline__ u16 to16(F16, float v) {
    u16 d;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(d) : "f"(v));
    return d;
}
__device__ __forceinline__ u16 to16(BF16, float v) {
    u16 d;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(d) : "f"(v));
    return d;
}

__device__ __forceinline__ u32 mul2(F16, u32 a, u32 b) {
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ u32 mul2(BF16, u32 a, u32 b) {
    u32 d;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ void mma16816(F16, float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816(BF16, float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- shared pieces --------------------------------------------------------------------------------

struct NF4 {
    const u8* packed;
    const u8* qabsmax;
    const float* code2;
    const float* absmax2;
    float offset;
};  // offset is loaded once per thread from the device scalar (NF4_MAKE)

// Rounded multiply, then rounded add (no FMA contraction): the same fp32 value host_tiled's torch
// code computes, so dequantized weights are bit-identical across backends.
__device__ __forceinline__ float block_absmax(const NF4& w, long long block) {
    return __fadd_rn(__fmul_rn(__ldg(w.code2 + __ldg(w.qabsmax + block)), __ldg(w.absmax2 + (block >> 8))), w.offset);
}

// The 16 code values in shared memory: indexed by data, so constant memory would serialise.
__device__ __forceinline__ void load_code(float* code) {
    if (threadIdx.x < 16) code[threadIdx.x] = NF4_CODE[threadIdx.x];
    __syncthreads();
}

// 32 consecutive weights starting at flat element e (e % 32 == 0) from one 16-byte load.
__device__ __forceinline__ void dequant32(const NF4& w, const float* code, long long e, float (&v)[32]) {
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(w.packed + (e >> 1)));
    const float am = block_absmax(w, e >> 6);
    const u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const u32 byte = (words[i >> 2] >> (8 * (i & 3))) & 0xffu;
        v[2 * i] = code[byte >> 4] * am;
        v[2 * i + 1] = code[byte & 15u] * am;
    }
}

// ---- dequantize ---------------------------------------------------------------------------------

// One thread per 32 weights: one 16-byte load in, 32 values out with 16-byte stores.
struct F32 {};

__device__ __forceinline__ void store32(F32, float* o, const float (&v)[32]) {
    float4* q = reinterpret_cast<float4*>(o);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}
template <typename T>
__device__ __forceinline__ void store32(T, u16* o, const float (&v)[32]) {
    uint4* q = reinterpret_cast<uint4*>(o);
#pragma unroll
    for (int i = 0; i < 4; ++i)
        q[i] = make_uint4(pack2(T(), v[8 * i], v[8 * i + 1]), pack2(T(), v[8 * i + 2], v[8 * i + 3]),
                          pack2(T(), v[8 * i + 4], v[8 * i + 5]), pack2(T(), v[8 * i + 6], v[8 * i + 7]));
}

// Elements [first, first + n) of the flat weight go to out[0, n); first % 64 == 0.
template <typename Tag, typename Out>
__device__ void dequant(const NF4& w, long long first, long long n, Out* out) {
    __shared__ float code[16];
    load_code(code);
    const long long e = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * 32;
    if (e >= n) return;
    float v[32];
    dequant32(w, code, first + e, v);
    store32(Tag(), out + e, v);
}

#define NF4_ARGS const u8 *packed, const u8 *qabsmax, const float *code2, const float *absmax2, const float *offset
#define NF4_MAKE NF4 w = {packed, qabsmax, code2, absmax2, __ldg(offset)}

extern "C" __global__ void nf4_dequant_f32(NF4_ARGS, long long first, long long n, float* out) {
    NF4_MAKE;
    dequant<F32>(w, first, n, out);
}
extern "C" __global__ void nf4_dequant_f16(NF4_ARGS, long long first, long long n, u16* out) {
    NF4_MAKE;
    dequant<F16>(w, first, n, out);
}
extern "C" __global__ void nf4_dequant_bf16(NF4_ARGS, long long first, long long n, u16* out) {
    NF4_MAKE;
    dequant<BF16>(w, first, n, out);
}

// ---- fp32 small-token forward: one warp per output row --------------------------------------------

// Each lane takes 32 weights (16 bytes) per step, a warp 1024 consecutive weights of its row; the
// MT per-token partial sums are reduced across the warp at the end.
template <int MT>
__device__ void gemv_f32(const NF4& w, const float* __restrict__ x, float* __restrict__ y, int M, int N, int K) {
    __shared__ float code[16];
    load_code(code);
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    float acc[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m] = 0.f;
    for (int k = lane * 32; k < K; k += 1024) {
        float v[32];
        dequant32(w, code, static_cast<long long>(row) * K + k, v);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (m < M) {
                const float4* xr = reinterpret_cast<const float4*>(x + static_cast<long long>(m) * K + k);
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const float4 xv = __ldg(xr + i);
                    acc[m] += v[4 * i] * xv.x + v[4 * i + 1] * xv.y + v[4 * i + 2] * xv.z + v[4 * i + 3] * xv.w;
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], s);
        if (lane == 0 && m < M) y[static_cast<long long>(m) * N + row] = acc[m];
    }
}

// ---- fp32 small-token backward to the input ------------------------------------------------------

// Thread = 8 consecutive k of the input gradient; blockIdx.y = a slice of the N rows it sums over.
// Partial sums go to the fp32 output with atomics (the caller zeroes it).
template <int MT>
__device__ void bwd_f32(const NF4& w, const float* __restrict__ gy, float* __restrict__ gx, int M, int N, int K,
                        int rows_per_split) {
    __shared__ float code[16];
    load_code(code);
    const int k = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (k >= K) return;
    const int n0 = blockIdx.y * rows_per_split;
    const int n1 = min(N, n0 + rows_per_split);
    float acc[MT][8];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[m][i] = 0.f;
    for (int n = n0; n < n1; ++n) {
        const long long e = static_cast<long long>(n) * K + k;
        const u32 q = __ldg(reinterpret_cast<const u32*>(w.packed + (e >> 1)));
        const float am = block_absmax(w, e >> 6);
        float v[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 byte = (q >> (8 * i)) & 0xffu;
            v[2 * i] = code[byte >> 4] * am;
            v[2 * i + 1] = code[byte & 15u] * am;
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (m < M) {
                const float g = __ldg(gy + static_cast<long long>(m) * N + n);
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[m][i] += g * v[i];
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m)
        if (m < M)
#pragma unroll
            for (int i = 0; i < 8; ++i) atomicAdd(gx + static_cast<long long>(m) * K + k + i, acc[m][i]);
}

// ---- tensor-core small-token forward -------------------------------------------------------------

// y^T[N, M] = W[N, K] x^T: W is the mma's A operand (16 rows per tile), x^T its B operand (8 tokens
// per mma, MT/8 mmas share each A fragment). The reduction index k is permuted so that each thread
// reads 32 consecutive weights of a row (one 16-byte load) and the 32 matching x values (64 bytes):
// in the 128-wide chunk at c, thread (g = lane/4, t = lane%4) owns k = c + 32t .. c + 32t + 31, and
// k16-tile j takes its logical columns {2t, 2t+1, 2t+8, 2t+9} from k = c + 32t + 4j + {0, 1, 2, 3}.
// The same map gives the B fragment, so a B register pair is two consecutive 32-bit words of x.
// A block's warps split K (chunk stride = warps * 128); their partial tiles are summed in shared
// memory. Each warp covers RG row groups of 16, reusing its x fragments for all of them.
template <typename T, int MT, int RG>
__device__ void mma_fwd(const NF4& w, const u16* __restrict__ x, u16* __restrict__ y, int M, int N, int K) {
    constexpr int NT = MT / 8;
    __shared__ float code[16];
    __shared__ float red[8][RG][NT][4][32];
    load_code(code);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row_base = blockIdx.x * 16 * RG;
    float acc[RG][NT][4];
#pragma unroll
    for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int s = 0; s < NT; ++s)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][s][i] = 0.f;
    for (int c = warp * 128; c < K; c += warps * 128) {
        // K % 64 == 0: the last chunk may be half full. Lanes past K feed zeros instead of
        // skipping, because mma.sync needs the whole warp.
        const int k = c + 32 * t;
        const bool k_ok = k < K;
        u32 xb[NT][16];
#pragma unroll
        for (int s = 0; s < NT; ++s) {
            const int tok = 8 * s + g;
            if (k_ok && tok < M) {
                const uint4* xr = reinterpret_cast<const uint4*>(x + static_cast<long long>(tok) * K + k);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const uint4 q = __ldg(xr + i);
                    xb[s][4 * i] = q.x; xb[s][4 * i + 1] = q.y; xb[s][4 * i + 2] = q.z; xb[s][4 * i + 3] = q.w;
                }
            } else {
#pragma unroll
                for (int i = 0; i < 16; ++i) xb[s][i] = 0u;
            }
        }
#pragma unroll
        for (int r = 0; r < RG; ++r) {
            const int n_lo = row_base + 16 * r + g, n_hi = n_lo + 8;
            float lo[32], hi[32];
            if (k_ok && n_lo < N) dequant32(w, code, static_cast<long long>(n_lo) * K + k, lo);
            else
#pragma unroll
                for (int i = 0; i < 32; ++i) lo[i] = 0.f;
            if (k_ok && n_hi < N) dequant32(w, code, static_cast<long long>(n_hi) * K + k, hi);
            else
#pragma unroll
                for (int i = 0; i < 32; ++i) hi[i] = 0.f;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const u32 a[4] = {pack2(T(), lo[4 * j], lo[4 * j + 1]), pack2(T(), hi[4 * j], hi[4 * j + 1]),
                                  pack2(T(), lo[4 * j + 2], lo[4 * j + 3]), pack2(T(), hi[4 * j + 2], hi[4 * j + 3])};
#pragma unroll
                for (int s = 0; s < NT; ++s) mma16816(T(), acc[r][s], a, xb[s][2 * j], xb[s][2 * j + 1]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int s = 0; s < NT; ++s)
#pragma unroll
            for (int i = 0; i < 4; ++i) red[warp][r][s][i][lane] = acc[r][s][i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int s = 0; s < NT; ++s)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float sum = 0.f;
                for (int v = 0; v < warps; ++v) sum += red[v][r][s][i][lane];
                // D fragment: c0, c1 at row g, tokens 2t, 2t+1; c2, c3 at row g + 8.
                const int n = row_base + 16 * r + g + 8 * (i >> 1);
                const int tok = 8 * s + 2 * t + (i & 1);
                if (n < N && tok < M) y[static_cast<long long>(tok) * N + n] = to16(T(), sum);
            }
}

// The same forward with cheaper dequantization, for speed: a 256-entry shared table maps a byte
// straight to its two code values packed in T, scaled by the block's absmax in T with one packed
// multiply (code and absmax rounded to T first, so values can differ from the fp32-then-round
// weights by an ulp of T; the accumulation is still fp32). Byte 2j / 2j+1 of a thread's 16-byte
// chunk are exactly the A pairs of k16-tile j (k = 4j, 4j+1 / 4j+2, 4j+3 in the map above).
template <typename T, int MT>
__device__ void mma_fwd_lut(const NF4& w, const u16* __restrict__ x, u16* __restrict__ y, int M, int N, int K) {
    constexpr int NT = MT / 8;
    __shared__ u32 lut[256];
    __shared__ float red[8][NT][4][32];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = pack2(T(), NF4_CODE[i >> 4], NF4_CODE[i & 15]);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n_lo = blockIdx.x * 16 + g, n_hi = n_lo + 8;
    float acc[NT][4];
#pragma unroll
    for (int s = 0; s < NT; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[s][i] = 0.f;
    for (int c = warp * 128; c < K; c += warps * 128) {
        const int k = c + 32 * t;
        const bool k_ok = k < K;
        u32 xb[NT][16];
#pragma unroll
        for (int s = 0; s < NT; ++s) {
            const int tok = 8 * s + g;
            if (k_ok && tok < M) {
                const uint4* xr = reinterpret_cast<const uint4*>(x + static_cast<long long>(tok) * K + k);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const uint4 q = __ldg(xr + i);
                    xb[s][4 * i] = q.x; xb[s][4 * i + 1] = q.y; xb[s][4 * i + 2] = q.z; xb[s][4 * i + 3] = q.w;
                }
            } else {
#pragma unroll
                for (int i = 0; i < 16; ++i) xb[s][i] = 0u;
            }
        }
        uint4 ql = make_uint4(0u, 0u, 0u, 0u), qh = ql;
        u32 aml = 0u, amh = 0u;
        if (k_ok && n_lo < N) {
            const long long e = static_cast<long long>(n_lo) * K + k;
            ql = __ldg(reinterpret_cast<const uint4*>(w.packed + (e >> 1)));
            const float am = block_absmax(w, e >> 6);
            aml = pack2(T(), am, am);
        }
        if (k_ok && n_hi < N) {
            const long long e = static_cast<long long>(n_hi) * K + k;
            qh = __ldg(reinterpret_cast<const uint4*>(w.packed + (e >> 1)));
            const float am = block_absmax(w, e >> 6);
            amh = pack2(T(), am, am);
        }
        const u32 lw[4] = {ql.x, ql.y, ql.z, ql.w}, hw[4] = {qh.x, qh.y, qh.z, qh.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int sh = 16 * (j & 1);
            const u32 l = lw[j >> 1] >> sh, h = hw[j >> 1] >> sh;
            const u32 a[4] = {mul2(T(), lut[l & 0xffu], aml), mul2(T(), lut[h & 0xffu], amh),
                              mul2(T(), lut[(l >> 8) & 0xffu], aml), mul2(T(), lut[(h >> 8) & 0xffu], amh)};
#pragma unroll
            for (int s = 0; s < NT; ++s) mma16816(T(), acc[s], a, xb[s][2 * j], xb[s][2 * j + 1]);
        }
    }
#pragma unroll
    for (int s = 0; s < NT; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp][s][i][lane] = acc[s][i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int s = 0; s < NT; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float sum = 0.f;
            for (int v = 0; v < warps; ++v) sum += red[v][s][i][lane];
            const int n = n_lo + 8 * (i >> 1);
            const int tok = 8 * s + 2 * t + (i & 1);
            if (n < N && tok < M) y[static_cast<long long>(tok) * N + n] = to16(T(), sum);
        }
}

// ---- tensor-core small-token backward to the input ------------------------------------------------

// gx^T[K, M] = W^T[K, N] gy^T: W^T is the A operand (16 k rows per tile, reduction over n), gy^T
// the B operand. Thread (g, t) reads rows n0 + {2t, 2t+1, 2t+8, 2t+9} at k = kb + 32g .. + 31 (four
// 16-byte loads); in k16-tile i, its logical rows g and g + 8 are k = kb + 32g + 2i and + 1, so byte
// i of each row chunk feeds one tile. B pairs are consecutive gy values: one 32-bit load each.
// A warp covers 256 k and loops over its slice of N; partial sums go out with fp32 atomics.
template <typename T, int MT>
__device__ void mma_bwd(const NF4& w, const u16* __restrict__ gy, float* __restrict__ gx, int M, int N, int K,
                        int rows_per_split) {
    constexpr int NT = MT / 8;
    __shared__ float code[16];
    load_code(code);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int kb = blockIdx.x * 256;
    const int k = kb + 32 * g;
    const bool k_ok = k < K;
    const int n_begin = blockIdx.y * rows_per_split;
    const int n_end = min(N, n_begin + rows_per_split);
    float acc[16][NT][4];
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int s = 0; s < NT; ++s)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][s][j] = 0.f;
    for (int n0 = n_begin + warp * 16; n0 < n_end; n0 += warps * 16) {
        const int rows[4] = {n0 + 2 * t, n0 + 2 * t + 1, n0 + 2 * t + 8, n0 + 2 * t + 9};
        u32 q[4][4];
        float am[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            if (k_ok && rows[r] < n_end) {
                const long long e = static_cast<long long>(rows[r]) * K + k;
                const uint4 v = __ldg(reinterpret_cast<const uint4*>(w.packed + (e >> 1)));
                q[r][0] = v.x; q[r][1] = v.y; q[r][2] = v.z; q[r][3] = v.w;
                am[r] = block_absmax(w, e >> 6);
            } else {
                q[r][0] = q[r][1] = q[r][2] = q[r][3] = 0u;
                am[r] = 0.f;
            }
        }
        u32 b[NT][2];
#pragma unroll
        for (int s = 0; s < NT; ++s) {
            const int tok = 8 * s + g;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int n = n0 + 2 * t + 8 * h;  // n and n + 1 are both < n_end or both not (N even)
                b[s][h] = (tok < M && n < n_end)
                              ? __ldg(reinterpret_cast<const u32*>(gy + static_cast<long long>(tok) * N + n))
                              : 0u;
            }
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            float hi_[4], lo_[4];  // per row: element k + 2i (high nibble) and k + 2i + 1 (low)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const u32 byte = (q[r][i >> 2] >> (8 * (i & 3))) & 0xffu;
                hi_[r] = code[byte >> 4] * am[r];
                lo_[r] = code[byte & 15u] * am[r];
            }
            // a0a1: row g (k+2i), cols 2t, 2t+1; a2a3: row g+8 (k+2i+1); a4..a7: cols 2t+8, 2t+9.
            const u32 a[4] = {pack2(T(), hi_[0], hi_[1]), pack2(T(), lo_[0], lo_[1]), pack2(T(), hi_[2], hi_[3]),
                              pack2(T(), lo_[2], lo_[3])};
#pragma unroll
            for (int s = 0; s < NT; ++s) mma16816(T(), acc[i][s], a, b[s][0], b[s][1]);
        }
    }
    if (!k_ok) return;
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int s = 0; s < NT; ++s)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int tok = 8 * s + 2 * t + (j & 1);
                const int kk = k + 2 * i + (j >> 1);
                if (tok < M) atomicAdd(gx + static_cast<long long>(tok) * K + kk, acc[i][s][j]);
            }
}

// ---- extern "C" entry points ----------------------------------------------------------------------

#define GEMV_F32(MT)                                                                                   \
    extern "C" __global__ void nf4_gemv_f32_m##MT(NF4_ARGS, const float* x, float* y, int M, int N, int K) { \
        NF4_MAKE;                                                                                      \
        gemv_f32<MT>(w, x, y, M, N, K);                                                                \
    }                                                                                                  \
    extern "C" __global__ void nf4_bwd_f32_m##MT(NF4_ARGS, const float* gy, float* gx, int M, int N, int K, \
                                                 int rows_per_split) {                                 \
        NF4_MAKE;                                                                                      \
        bwd_f32<MT>(w, gy, gx, M, N, K, rows_per_split);                                               \
    }
GEMV_F32(1)
GEMV_F32(2)
GEMV_F32(4)
GEMV_F32(8)
GEMV_F32(16)

#define MMA_FWD(TY, NAME, MT, RG)                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                                  \
        nf4_mma_fwd_##NAME##_m##MT##_r##RG(NF4_ARGS, const u16* x, u16* y, int M, int N, int K) {       \
        NF4_MAKE;                                                                                      \
        mma_fwd<TY, MT, RG>(w, x, y, M, N, K);                                                         \
    }
#define MMA_BWD(TY, NAME, MT)                                                                          \
    extern "C" __global__ void __launch_bounds__(128)                                                  \
        nf4_mma_bwd_##NAME##_m##MT(NF4_ARGS, const u16* gy, float* gx, int M, int N, int K, int rows_per_split) { \
        NF4_MAKE;                                                                                      \
        mma_bwd<TY, MT>(w, gy, gx, M, N, K, rows_per_split);                                           \
    }
#define MMA_FWD_LUT(TY, NAME, MT)                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                                  \
        nf4_mma_fwd_lut_##NAME##_m##MT(NF4_ARGS, const u16* x, u16* y, int M, int N, int K) {            \
        NF4_MAKE;                                                                                      \
        mma_fwd_lut<TY, MT>(w, x, y, M, N, K);                                                         \
    }
#define MMA_ALL(TY, NAME)                                                                              \
    MMA_FWD_LUT(TY, NAME, 8) MMA_FWD_LUT(TY, NAME, 16)                                                 \
    MMA_FWD(TY, NAME, 8, 1) MMA_FWD(TY, NAME, 8, 2) MMA_FWD(TY, NAME, 8, 4)                            \
    MMA_FWD(TY, NAME, 16, 1) MMA_FWD(TY, NAME, 16, 2) MMA_FWD(TY, NAME, 16, 4)                         \
    MMA_BWD(TY, NAME, 8) MMA_BWD(TY, NAME, 16)
MMA_ALL(F16, f16)
MMA_ALL(BF16, bf16)
