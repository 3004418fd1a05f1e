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
//   nf4_wgmma_fwd_{f16,bf16}_m{32..256} y = x W^T for many tokens, Hopper warpgroup MMAs (sm_90a)
//   nf4_ws_fwd_{f16,bf16}_m{64,128}     the same, warp-specialized (producers dequantize into smem)
//   nf4_tma_fwd_{f16,bf16}_m{128,256}_r{64,128}[_k2]  the same, tiles copied by TMA (tensor maps)
//   nf4_bwd_f32_m{1,2,4,8,16}           gx[M,K] += gy[M,N] W, fp32, atomics over N splits
//   nf4_mma_bwd_{f16,bf16}_m{8,16}      gx[M,K] += gy W on tensor cores, fp32 atomics

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

// -DANER_PART=p keeps only the entry points of part p (0 to 7), so that a machine without a
// kernel cache compiles the parts as concurrent NVRTC programs (compiler.py); without it every
// entry point is compiled. The parts share every helper: a kernel's code is the same either way.
#ifdef ANER_PART
#define PART(p) (ANER_PART == (p))
#else
#define PART(p) 1
#endif

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

// A block's absmax from its double-quantization inputs: rounded multiply, then rounded add (no FMA
// contraction), the same fp32 value host_tiled's torch code computes, so dequantized weights are
// bit-identical across backends.
__device__ __forceinline__ float absmax_of(float code2_value, float absmax2, float offset) {
    return __fadd_rn(__fmul_rn(code2_value, absmax2), offset);
}
__device__ __forceinline__ float block_absmax(const NF4& w, long long block) {
    return absmax_of(__ldg(w.code2 + __ldg(w.qabsmax + block)), __ldg(w.absmax2 + (block >> 8)), w.offset);
}

// The 16 code values in shared memory: indexed by data, so constant memory would serialise.
__device__ __forceinline__ void load_code(float* code) {
    if (threadIdx.x < 16) code[threadIdx.x] = NF4_CODE[threadIdx.x];
    __syncthreads();
}

// The 8 weights of one 4-byte word of packed NF4 (high nibble first) with its block's absmax,
// written to v[0..8).
__device__ __forceinline__ void dequant8(const float* code, u32 word, float am, float* v) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 byte = (word >> (8 * i)) & 0xffu;
        v[2 * i] = code[byte >> 4] * am;
        v[2 * i + 1] = code[byte & 15u] * am;
    }
}

// 32 consecutive weights starting at flat element e (e % 32 == 0) from one 16-byte load.
__device__ __forceinline__ void dequant32(const NF4& w, const float* code, long long e, float (&v)[32]) {
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(w.packed + (e >> 1)));
    const float am = block_absmax(w, e >> 6);
    const u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) dequant8(code, words[i], am, v + 8 * i);
}

// ---- dequantize ---------------------------------------------------------------------------------

// A warp takes 1024 consecutive weights (512 packed bytes) in four steps; in each, lane l reads the
// 4 bytes at 8l and writes their 8 weights, so every warp-wide store covers one contiguous span
// (512 bytes for 16-bit outputs). All four loads are issued before the first use.
struct F32 {};

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

// Elements [first, first + n) of the flat weight go to out[0, n); first % 64 == 0, n % 64 == 0.
template <typename Tag, typename Out>
__device__ void dequant(const NF4& w, long long first, long long n, Out* out) {
    __shared__ float code[16];
    load_code(code);
    const int lane = threadIdx.x & 31;
    const long long base = (static_cast<long long>(blockIdx.x) * blockDim.x + (threadIdx.x & ~31)) * 32 + 8 * lane;
    u32 q[4];
    float am[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const long long e = base + 256 * i;
        if (e < n) {
            q[i] = __ldg(reinterpret_cast<const u32*>(w.packed + ((first + e) >> 1)));
            am[i] = block_absmax(w, (first + e) >> 6);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const long long e = base + 256 * i;
        if (e >= n) return;
        float v[8];
        dequant8(code, q[i], am[i], v);
        store8(Tag(), out + e, v);
    }
}

#define NF4_ARGS const u8 *packed, const u8 *qabsmax, const float *code2, const float *absmax2, const float *offset
#define NF4_MAKE NF4 w = {packed, qabsmax, code2, absmax2, __ldg(offset)}

#if PART(0)
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
#endif

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
// Each slice writes its partial sums to a slab of its own (gx + blockIdx.y * M * K, zeroed by the
// caller, which sums the slabs in a fixed order): no two threads add to one element, so the result
// is the same bits on every run (fp32 atomics from several slices would add in a varying order).
template <int MT>
__device__ void bwd_f32(const NF4& w, const float* __restrict__ gy, float* __restrict__ gx, int M, int N, int K,
                        int rows_per_split) {
    __shared__ float code[16];
    load_code(code);
    const int k = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (k >= K) return;
    const int n0 = blockIdx.y * rows_per_split;
    const int n1 = min(N, n0 + rows_per_split);
    gx += static_cast<long long>(blockIdx.y) * M * K;
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
        dequant8(code, q, am, v);
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

// y^T[N, M] = W[N, K] x^T for M <= 16: W is the mma's A operand (16 rows per block), x^T its B
// operand (8 tokens per mma, MT/8 mmas share each A fragment). Memory-bound, so the work per
// weight is kept to a few instructions and no shared-memory bank conflicts:
// * The reduction runs one 64-block at a time, so one absmax scales a whole row of each partial
//   product: the mma multiplies the raw NF4 code values (rounded to T) and the block's fp32
//   partial sums are scaled by its absmax, y = sum_b absmax_b * sum_{k in b} code_k x_k. (Unlike
//   the many-token paths, which round code * absmax to T, the code alone is rounded: the same
//   error bound, one fewer multiply per weight.)
// * In a block, thread (g = lane/4, t = lane%4) owns k = 16t .. 16t + 15 of rows g and g + 8 (8
//   bytes each); k16-tile j takes its logical columns {2t, 2t+1, 2t+8, 2t+9} from k = 16t + 4j +
//   {0, 1, 2, 3}, i.e. bytes 2j and 2j + 1. The same map gives the B fragment: two consecutive
//   32-bit words of x.
// * A byte becomes its pair of T codes through a 256-entry table held once per lane (32 copies,
//   copy l in bank l), so every lookup of a warp is one conflict-free shared load.
// * A warp issues the loads of U blocks (weights, absmax inputs, x) before it uses any; the
//   block's warps split K and their partial tiles are summed in shared memory.
constexpr int SMALL_WARPS = 8;

template <int U, int NT>
struct SmallBatch {
    uint2 q[U][2];  // packed bytes of rows lo/hi
    u32 qa[U][2];   // absmax codes
    float a2[U][2];
    u32 xb[U][NT][8];
};

template <typename T, int MT, int U>
__device__ void mma_fwd(const NF4& w, const u16* __restrict__ x, u16* __restrict__ y16, float* __restrict__ y32,
                        int M, int N, int K) {
    constexpr int NT = MT / 8;
    __shared__ u32 table[256 * 32];  // table[byte * 32 + lane] = (code[byte >> 4], code[byte & 15]) in T
    __shared__ float code2[256];
    __shared__ float red[SMALL_WARPS][NT][4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int rows[2] = {blockIdx.x * 16 + g, blockIdx.x * 16 + g + 8};
    auto load = [&](int c0, SmallBatch<U, NT>& b) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = c0 + u * SMALL_WARPS * 64 + 16 * t;
            const bool k_ok = k < K;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const bool ok = k_ok && rows[h] < N;
                const long long e = static_cast<long long>(ok ? rows[h] : 0) * K + (k_ok ? k : 0);
                b.q[u][h] = ok ? __ldg(reinterpret_cast<const uint2*>(w.packed + (e >> 1))) : make_uint2(0u, 0u);
                b.qa[u][h] = ok ? __ldg(w.qabsmax + (e >> 6)) : 0u;
                b.a2[u][h] = ok ? __ldg(w.absmax2 + (e >> 14)) : 0.f;
            }
#pragma unroll
            for (int s = 0; s < NT; ++s) {
                const int tok = 8 * s + g;
                if (k_ok && tok < M) {
                    const uint4* xr = reinterpret_cast<const uint4*>(x + static_cast<long long>(tok) * K + k);
                    const uint4 v0 = __ldg(xr), v1 = __ldg(xr + 1);
                    b.xb[u][s][0] = v0.x; b.xb[u][s][1] = v0.y; b.xb[u][s][2] = v0.z; b.xb[u][s][3] = v0.w;
                    b.xb[u][s][4] = v1.x; b.xb[u][s][5] = v1.y; b.xb[u][s][6] = v1.z; b.xb[u][s][7] = v1.w;
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) b.xb[u][s][i] = 0u;
                }
            }
        }
    };
    SmallBatch<U, NT> b;
    int c0 = warp * 64;
    load(c0, b);  // the first loads fly while the tables are written
    for (int i = threadIdx.x; i < 256 * 32; i += blockDim.x)
        table[i] = pack2(T(), NF4_CODE[(i >> 9) & 15], NF4_CODE[(i >> 5) & 15]);
    code2[threadIdx.x] = __ldg(w.code2 + threadIdx.x);
    __syncthreads();
    const u32* const my_table = table + lane;
    float acc[NT][4];
#pragma unroll
    for (int s = 0; s < NT; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[s][i] = 0.f;
    for (;;) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float part[NT][4];
#pragma unroll
            for (int s = 0; s < NT; ++s)
#pragma unroll
                for (int i = 0; i < 4; ++i) part[s][i] = 0.f;
            const u32 words[2][2] = {{b.q[u][0].x, b.q[u][0].y}, {b.q[u][1].x, b.q[u][1].y}};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                // a0/a1: rows lo/hi, byte 2j (cols 2t, 2t+1); a2/a3: byte 2j + 1 (cols 2t+8, 2t+9).
                u32 a[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int byte = 2 * j + (i >> 1);
                    a[i] = my_table[((words[i & 1][byte >> 2] >> (8 * (byte & 3))) & 0xffu) * 32];
                }
#pragma unroll
                for (int s = 0; s < NT; ++s) mma16816(T(), part[s], a, b.xb[u][s][2 * j], b.xb[u][s][2 * j + 1]);
            }
            float am[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) am[h] = absmax_of(code2[b.qa[u][h]], b.a2[u][h], w.offset);
#pragma unroll
            for (int s = 0; s < NT; ++s)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[s][i] = fmaf(am[i >> 1], part[s][i], acc[s][i]);
        }
        c0 += U * SMALL_WARPS * 64;
        if (c0 >= K) break;
        load(c0, b);
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
#pragma unroll
            for (int v = 0; v < SMALL_WARPS; ++v) sum += red[v][s][i][lane];
            // D fragment: c0, c1 at row g, tokens 2t, 2t+1; c2, c3 at row g + 8.
            const int n = rows[i >> 1], tok = 8 * s + 2 * t + (i & 1);
            if (n < N && tok < M) {
                const long long o = static_cast<long long>(tok) * N + n;
                if (y32) y32[o] = sum;
                else y16[o] = to16(T(), sum);
            }
        }
}

// ---- tensor-core small-token backward to the input ------------------------------------------------

// gx^T[K, M] = W^T[K, N] gy^T: W^T is the A operand (16 k rows per tile, reduction over n), gy^T
// the B operand. Thread (g, t) reads rows n0 + {2t, 2t+1, 2t+8, 2t+9} at k = kb + 32g .. + 31 (four
// 16-byte loads); in k16-tile i, its logical rows g and g + 8 are k = kb + 32g + 2i and + 1, so byte
// i of each row chunk feeds one tile. B pairs are consecutive gy values: one 32-bit load each.
// A warp covers 256 k and loops over its slice of N; its partial sums go to a slab of its own
// (gx + (blockIdx.y * warps + warp) * M * K, zeroed by the caller, which sums the slabs in a fixed
// order), so every element has one writer and the result is the same bits on every run.
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
    gx += static_cast<long long>(blockIdx.y * warps + warp) * M * K;
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

// ---- many-token forward on Hopper: wgmma with the NF4 operand dequantized in registers ------------

// y^T[N, M] = W[N, K] x^T as warpgroup MMAs (sm_90a): W is the A operand, dequantized from NF4
// straight into registers; x^T is the B operand, copied into shared memory by cp.async in the
// canonical K-major 128-byte-swizzled layout (a row = one token's 64 k = 128 bytes, its 16-byte
// chunk c stored at c ^ (row % 8)). A block is 2 warpgroups x 64 rows of W = 128 rows, times BM
// tokens; each k-step of 64 is 4 wgmma m64nBMk16. The packed W rows of a step come through shared
// memory too (a row's 32 bytes padded to 48, so the 8 rows a warp reads at once hit distinct
// banks). Pipelining: STAGES shared buffers, loads issued STAGES - 2 steps ahead; the A registers
// are double-buffered (the loop is unrolled by 2 for that) and each step waits only for the
// previous step's wgmmas (wait_group 1).
// The weight is dequantized exactly as everywhere else (fp32 product, then rounded to T).
// Rows past N and tokens past M are zero-filled on load and never stored.

typedef unsigned long long u64;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ u32 smem_addr(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }
// The first 1024-byte-aligned byte of dynamic shared memory (128-byte swizzle atoms need that
// alignment; the launch asks for 1024 bytes of slack).
__device__ __forceinline__ u8* align1024(u8* p) { return p + ((1024u - (smem_addr(p) & 1023u)) & 1023u); }
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool full) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(full ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {  // reads of d stay after the wait
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Keeps A fragments live until the wait that retires the wgmmas reading them, so the register
// allocator cannot hand their registers to the next step (ptxas would then serialize the wgmmas).
struct WgmmaInputs {
    u32 a[4][4];  // A fragments of the 4 k16 tiles
    u64 desc[4];  // their B descriptors
};
__device__ __forceinline__ void fence_regs(WgmmaInputs& in) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(in.a[j][i])::"memory");
        asm volatile("" : "+l"(in.desc[j])::"memory");
    }
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ u64 sw128_desc(const void* p) {
    return static_cast<u64>((smem_addr(p) & 0x3FFFFu) >> 4) | (1ull << 16) | (static_cast<u64>(1024 >> 4) << 32) |
           (1ull << 62);
}

// wgmma with N columns keeps N/2 fp32 accumulators per thread; inline PTX needs one operand per
// register, so the accumulator list (WG_D_N, operands 0..N/2-1) and the numbers of the operands
// after it are spelled out once per N. RS: A from 4 registers, B from a shared-memory descriptor;
// SS: both from descriptors. The scale-d predicate is always true (accumulators start at 0).
#define WG_D_32 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define WG_REGS_32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define WG_RS_32 ", {%16,%17,%18,%19}, %20, p, 1, 1, 0;}"
#define WG_RS_P_32 "%21"
#define WG_SS_32 ", %16, %17, p, 1, 1, 0, 0;}"
#define WG_SS_P_32 "%18"
#define WG_D_64 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WG_REGS_64 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define WG_RS_64 ", {%32,%33,%34,%35}, %36, p, 1, 1, 0;}"
#define WG_RS_P_64 "%37"
#define WG_SS_64 ", %32, %33, p, 1, 1, 0, 0;}"
#define WG_SS_P_64 "%34"
#define WG_D_128 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WG_REGS_128 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define WG_RS_128 ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;}"
#define WG_RS_P_128 "%69"
#define WG_SS_128 ", %64, %65, p, 1, 1, 0, 0;}"
#define WG_SS_P_128 "%66"
#define WG_D_256 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define WG_REGS_256 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}"
#define WG_RS_256 ", {%128,%129,%130,%131}, %132, p, 1, 1, 0;}"
#define WG_RS_P_256 "%133"
#define WG_SS_256 ", %128, %129, p, 1, 1, 0, 0;}"
#define WG_SS_P_256 "%130"
#define WGMMA(N, TAG, TY)                                                                              \
    __device__ __forceinline__ void wgmma_rs(TAG, float (&d)[N / 2], const u32 (&a)[4], u64 b) {        \
        asm volatile("{.reg .pred p; setp.ne.b32 p, " WG_RS_P_##N ", 0; wgmma.mma_async.sync.aligned.m64n" #N \
                     "k16.f32." TY "." TY " " WG_REGS_##N WG_RS_##N                                     \
                     : WG_D_##N : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));            \
    }                                                                                                  \
    __device__ __forceinline__ void wgmma_ss(TAG, float (&d)[N / 2], u64 a, u64 b) {                    \
        asm volatile("{.reg .pred p; setp.ne.b32 p, " WG_SS_P_##N ", 0; wgmma.mma_async.sync.aligned.m64n" #N \
                     "k16.f32." TY "." TY " " WG_REGS_##N WG_SS_##N                                     \
                     : WG_D_##N : "l"(a), "l"(b), "r"(1));                                                \
    }
WGMMA(32, BF16, "bf16") WGMMA(64, BF16, "bf16") WGMMA(128, BF16, "bf16") WGMMA(256, BF16, "bf16")
WGMMA(32, F16, "f16") WGMMA(64, F16, "f16") WGMMA(128, F16, "f16") WGMMA(256, F16, "f16")
#endif

template <int BM>
struct WgmmaShape {
    static constexpr int STAGES = BM == 256 ? 5 : 6;
    static constexpr int X_BYTES = BM * 128;  // one stage of x: BM tokens x 64 k
    static constexpr int W_STRIDE = 48;       // one W row's 32 packed bytes, padded
    static constexpr int W_BYTES = 128 * W_STRIDE;
};  // dynamic shared memory: 1024 (alignment slack) + STAGES * (X_BYTES + W_BYTES), ops.wgmma_smem_bytes

// x's tile of one k-step, BM tokens x 64 k (16-bit), copied by 256 threads with cp.async into a
// 128-byte-swizzled K-major shared tile (the wgmma B layout): thread tid copies 16-byte chunk
// tid % 8 of token rows tid / 8 + 32 j, zero-filled past M.
template <int BM>
struct XTile {
    static constexpr int J = BM / 32;
    const u16* src[J];
    bool ok[J];
    u32 dst;
    __device__ __forceinline__ XTile(const u16* x, int tid, int m0, int M, int K, u32 tile) {
        const int r = tid >> 3, c = tid & 7;
#pragma unroll
        for (int j = 0; j < J; ++j) {
            ok[j] = m0 + r + 32 * j < M;
            src[j] = x + static_cast<long long>(ok[j] ? m0 + r + 32 * j : 0) * K + 8 * c;
        }
        dst = tile + r * 128 + ((c ^ (r & 7)) << 4);  // (r + 32 j) % 8 == r % 8: one swizzle for all j
    }
    // The k-step starting at column k0 into the tile at byte offset `offset`.
    __device__ __forceinline__ void load(u32 offset, int k0) const {
#pragma unroll
        for (int j = 0; j < J; ++j) cp_async16(dst + offset + j * 32 * 128, src[j] + k0, ok[j]);
    }
};

// Writes a warpgroup's m64nBM fp32 accumulators as y[token, row] (fp32, or rounded to T): the D
// fragment's d[4j + 2h + e] is W row n + 8h, token m + 8j + e (n, m: this thread's first); only
// the 8-token groups j in [J0, J1).
template <typename T, int BM, int J0 = 0, int J1 = BM / 8>
__device__ __forceinline__ void store_d(const float (&d)[BM / 2], int n, int m, int M, int N, u16* y16, float* y32) {
#pragma unroll
    for (int j = J0; j < J1; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int r = n + 8 * h, tok = m + 8 * j + e;
                if (r < N && tok < M) {
                    const long long o = static_cast<long long>(tok) * N + r;
                    if (y32) y32[o] = d[4 * j + 2 * h + e];
                    else y16[o] = to16(T(), d[4 * j + 2 * h + e]);
                }
            }
}

template <typename T, int BM>
__device__ void wgmma_fwd(const NF4& w, const u16* __restrict__ x, u16* __restrict__ y16, float* __restrict__ y32,
                          int M, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = WgmmaShape<BM>;
    constexpr int STAGES = S::STAGES;
    extern __shared__ u8 dyn[];
    u8* const xs = align1024(dyn);
    u8* const ws = xs + STAGES * S::X_BYTES;
    __shared__ float code[16], code2[256];  // static: lookups address them by immediate offsets
    const int tid = threadIdx.x;
    if (tid < 16) code[tid] = NF4_CODE[tid];
    code2[tid] = __ldg(w.code2 + tid);
    const int n0 = blockIdx.x * 128, m0 = blockIdx.y * BM, steps = K / 64;

    // Loads: x as XTile says, and thread tid copies 16-byte chunk tid % 2 of W row tid / 2; the
    // pointers advance by one k-step (64 k) per step.
    const XTile<BM> xt(x, tid, m0, M, K, smem_addr(xs));
    const int wr = tid >> 1, wc = tid & 1;
    const bool wok = n0 + wr < N;
    const u8* const wsrc = w.packed + static_cast<long long>(wok ? n0 + wr : 0) * (K / 2) + 16 * wc;
    const u32 wdst = smem_addr(ws) + wr * S::W_STRIDE + 16 * wc;
    // The loop runs an even number of steps (ptxas serializes the wgmmas if a step is conditional);
    // a padding step loads step 0 again (finite values) and its absmax is 0, so it adds nothing.
    const int padded = (steps + 1) & ~1;
    auto load = [&](int s) {  // step s's x tile and W rows into stage s % STAGES (one commit group)
        if (s < padded) {
            const int st = s % STAGES, k0 = s < steps ? 64 * s : 0;
            xt.load(st * S::X_BYTES, k0);
            cp_async16(wdst + st * S::W_BYTES, wsrc + k0 / 2, wok);
        }
        cp_async_commit();
    };

    const int lane = tid & 31, t = lane & 3;
    const int r_lo = 64 * (tid >> 7) + 16 * ((tid >> 5) & 3) + (lane >> 2);  // this thread's rows r_lo, r_lo + 8
    // Rotations bringing nibble bits 8t+4.. (high) / 8t.. (low) of a word to bits 2..5 (= index * 4).
    const u32 rot_hi = 8 * t + 2, rot_lo = (8 * t + 30) & 31;
    u32 blk[2];  // first 64-block of each row (block indices fit 32 bits: N * K < 2^37)
#pragma unroll
    for (int h = 0; h < 2; ++h) blk[h] = static_cast<u32>(min(n0 + r_lo + 8 * h, N - 1)) * static_cast<u32>(K / 64);
    auto scale_load = [&](int s, u32 (&q)[2], float (&a2)[2]) {  // absmax inputs of step s, 2 steps early
        const int sc = min(s, steps - 1);  // past the end: any valid block (scaled by 0 below)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            q[h] = __ldg(w.qabsmax + blk[h] + sc);
            a2[h] = s < steps ? __ldg(w.absmax2 + ((blk[h] + sc) >> 8)) : 0.f;
        }
    };

    float d[BM / 2];
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) d[i] = 0.f;
    __syncthreads();  // tables
#pragma unroll 1
    for (int s = 0; s < STAGES - 2; ++s) load(s);
    u32 q[2][2];
    float a2[2][2];
    scale_load(0, q[0], a2[0]);
    scale_load(1, q[1], a2[1]);

    // Step u's A fragments from stage u % STAGES: scales loaded 2 steps early, bytes from shared memory.
    auto dequant = [&](int u, WgmmaInputs& in, u32 (&qs)[2], float (&as)[2]) {
        const int st = u % STAGES;
        float am[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) am[h] = u < steps ? absmax_of(code2[qs[h]], as[h], w.offset) : 0.f;
        scale_load(u + 2, qs, as);
        u32 words[2][8];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint4* row = reinterpret_cast<const uint4*>(ws + st * S::W_BYTES + (r_lo + 8 * h) * S::W_STRIDE);
            const uint4 p = row[0], v = row[1];
            words[h][0] = p.x; words[h][1] = p.y; words[h][2] = p.z; words[h][3] = p.w;
            words[h][4] = v.x; words[h][5] = v.y; words[h][6] = v.z; words[h][7] = v.w;
        }
        // k16 tile j: a0/a1 = rows lo/hi at k 2t, 2t+1 (byte t of word 2j); a2/a3 at 2t+8, 2t+9 (word 2j+1).
        // A nibble's byte offset in the code table comes from one rotate and one mask.
        const u8* const table = reinterpret_cast<const u8*>(code);
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u32 word = words[i & 1][2 * j + (i >> 1)];
                const float hi = *reinterpret_cast<const float*>(table + (__funnelshift_r(word, word, rot_hi) & 0x3Cu));
                const float lo = *reinterpret_cast<const float*>(table + (__funnelshift_r(word, word, rot_lo) & 0x3Cu));
                in.a[j][i] = pack2(T(), hi * am[i & 1], lo * am[i & 1]);
            }
        const u64 desc = sw128_desc(xs + st * S::X_BYTES);
#pragma unroll
        for (int j = 0; j < 4; ++j) in.desc[j] = desc + 2 * j;  // +32 bytes per k16
    };
    // Step s issues the wgmmas of step s (A dequantized during step s - 1), then dequantizes step
    // s + 1, meant to run while they do. Measured on the H200 (4096x4096, 512 tokens, tile 128) the
    // two do not overlap: 51 us in all, 26 us without the dequantization, 22 us without the MMAs
    // (the same with the dequantization first). Warp-specialized versions (one producer
    // warpgroup feeding these consumers; ws_fwd below, two producer warpgroups and SS wgmmas)
    // measured 47-52 us: the block is issue-bound, not waiting on memory. ncu: ~250 instructions
    // per warp per k-step (about 4.5 per weight dequantized, 1 of them a shared load), 1.8
    // instructions per cycle, stalls spread over dependencies, dispatch and shared-memory latency.
    auto step = [&](int s, WgmmaInputs& in, WgmmaInputs& next, u32 (&qs)[2], float (&as)[2]) {
        cp_async_wait<STAGES - 4>();
        fence_async_smem();
        __syncthreads();  // steps s and s + 1 landed for all; step s - 2 finished in both warpgroups
        load(s + STAGES - 2);
        fence_regs(in);  // every input computed before the first wgmma of the step, none between them
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) wgmma_rs(T(), d, in.a[j], in.desc[j]);
        wgmma_commit();
        wgmma_wait<1>();  // step s - 1's wgmmas are done: their A registers may be rewritten
        fence_regs(next);
        dequant(s + 1, next, qs, as);
    };
    WgmmaInputs even = {}, odd = {};
    cp_async_wait<STAGES - 3>();
    __syncthreads();  // step 0 landed
    dequant(0, even, q[0], a2[0]);
#pragma unroll 1
    for (int s = 0; s < padded; s += 2) {
        step(s, even, odd, q[1], a2[1]);
        step(s + 1, odd, even, q[0], a2[0]);
    }
    wgmma_wait<0>();
    fence_regs(d);
    cp_async_wait<0>();

    store_d<T, BM>(d, n0 + r_lo, m0 + 2 * t, M, N, y16, y32);
#endif
}

// ---- many-token forward on Hopper: producer warps dequantize into shared memory ------------------

// y^T[N, M] = W[N, K] x^T with both wgmma operands in shared memory (SS), warp-specialized: two
// producer warpgroups dequantize each k-step's 128 W rows x 64 k into a 128-byte-swizzled K-major
// tile (the layout cp.async gives x) and copy x's BM tokens x 64 k beside it; two consumer
// warpgroups (64 W rows each) only issue wgmmas. Stages are handed over with mbarriers: "full"
// completes when all 256 producers stored their rows and their cp.asyncs landed (cp.async's own
// arrive), "empty" when both consumer warpgroups' wgmmas reading the stage retired.
// Producer thread p dequantizes half a row: row p / 2, k 32 (p % 2) .. + 32 of the step, which lies
// in one 64-block, so one absmax per thread and step. It rounds that block's 16 values
// T(code * absmax) once (the rounding every path uses) into two 4-register byte tables and looks
// each nibble up with byte permutes (prmt), no shared-memory table: 5-10% faster than the table.
// The aim was dequantization beside the tensor cores instead of between their instructions; on
// the H200 a block still takes 0.6-0.75 us per k-step at any load, like the register-operand
// kernel, whether the producers keep one or four k-steps of W in flight (ops' docstring).

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 c) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// The 16 values T(code * am) of one 64-block as byte tables for lut_lookup: lo[j] / hi[j] hold the
// low / high bytes of values 4j .. 4j + 3 (the rounding every path uses, done once per block).
template <typename T>
__device__ __forceinline__ void lut_build(float am, u32 (&lo)[4], u32 (&hi)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u32 p0 = pack2(T(), NF4_CODE[4 * j] * am, NF4_CODE[4 * j + 1] * am);
        const u32 p1 = pack2(T(), NF4_CODE[4 * j + 2] * am, NF4_CODE[4 * j + 3] * am);
        lo[j] = prmt(p0, p1, 0x6420u);
        hi[j] = prmt(p0, p1, 0x7531u);
    }
}
// The same tables built by the 4 lanes of a quad that share am: this lane computes values
// 4t .. 4t + 3 (code4: their codes, t = lane % 4) and takes the rest from the others.
template <typename T>
__device__ __forceinline__ void lut_build_shared(float am, const float (&code4)[4], int lane, u32 (&lo)[4],
                                                 u32 (&hi)[4]) {
    const u32 p0 = pack2(T(), code4[0] * am, code4[1] * am), p1 = pack2(T(), code4[2] * am, code4[3] * am);
    const u32 mlo = prmt(p0, p1, 0x6420u), mhi = prmt(p0, p1, 0x7531u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        lo[j] = __shfl_sync(0xffffffffu, mlo, (lane & ~3) | j);
        hi[j] = __shfl_sync(0xffffffffu, mhi, (lane & ~3) | j);
    }
}
// The weights of the two packed bytes in bits 0..15 of sel as T pairs (first weight in the low
// half): out0 for byte 0, out1 for byte 1.
__device__ __forceinline__ void lut_lookup(u32 sel, const u32 (&lo_t)[4], const u32 (&hi_t)[4], u32& out0, u32& out1) {
    const u32 low3 = sel & 0x7777u;                 // nibbles n0..n3 = weights 1, 0, 3, 2
    const u32 big = prmt(sel << 4, sel, 0xD9C8u);  // byte j: 0xFF if nibble j >= 8
    const u32 lo = (prmt(lo_t[2], lo_t[3], low3) & big) | (prmt(lo_t[0], lo_t[1], low3) & ~big);
    const u32 hi = (prmt(hi_t[2], hi_t[3], low3) & big) | (prmt(hi_t[0], hi_t[1], low3) & ~big);
    out0 = prmt(lo, hi, 0x4051u);
    out1 = prmt(lo, hi, 0x6273u);
}

template <int BM>
struct WsShape {
    static constexpr int X_BYTES = BM * 128;  // BM tokens x 64 k, 16-bit
    static constexpr int W_BYTES = 128 * 128;  // 128 rows x 64 k, 16-bit
    static constexpr int STAGES = 192 * 1024 / (X_BYTES + W_BYTES);
};  // dynamic shared memory: 1024 (alignment slack) + STAGES * (W_BYTES + X_BYTES), ops.ws_smem_bytes

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("{.reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0];}" ::"r"(bar) : "memory");
}
// Arrives once this thread's earlier cp.asyncs have landed (counts as one of the expected arrivals).
__device__ __forceinline__ void mbar_arrive_cp_async(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{.reg .pred done; WAIT: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1; @!done bra WAIT;}" ::"r"(bar),
        "r"(parity)
        : "memory");
}
#endif

template <typename T, int BM>
__device__ void ws_fwd(const NF4& w, const u16* __restrict__ x, u16* __restrict__ y16, float* __restrict__ y32,
                       int M, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = WsShape<BM>;
    constexpr int STAGES = S::STAGES, STAGE_BYTES = S::W_BYTES + S::X_BYTES;
    extern __shared__ u8 dyn[];
    u8* const tiles = align1024(dyn);  // stage st: W tile, then x tile
    __shared__ float code2[256];
    __shared__ u64 full[STAGES], empty[STAGES];
    const int tid = threadIdx.x;
    if (tid < 256) code2[tid] = __ldg(w.code2 + tid);
    if (tid < STAGES) {
        mbar_init(smem_addr(full + tid), 512);  // 256 producers' stores + their 256 cp.async arrivals
        mbar_init(smem_addr(empty + tid), 256);  // 256 consumer threads
    }
    __syncthreads();
    const int n0 = blockIdx.x * 128, m0 = blockIdx.y * BM, steps = K / 64;

    if (tid < 256) {  // ---- producers
        const int row = tid >> 1, half = tid & 1;
        const bool wok = n0 + row < N;
        const u8* const wsrc = w.packed + static_cast<long long>(wok ? n0 + row : 0) * (K / 2) + 16 * half;
        const u32 blk = static_cast<u32>(wok ? n0 + row : 0) * static_cast<u32>(K / 64);
        const u32 wdst = smem_addr(tiles) + row * 128;
        const XTile<BM> xt(x, tid, m0, M, K, smem_addr(tiles) + S::W_BYTES);
        uint4 q = __ldg(reinterpret_cast<const uint4*>(wsrc));
        u32 qa = __ldg(w.qabsmax + blk);
        float a2 = __ldg(w.absmax2 + (blk >> 8));
#pragma unroll 1
        for (int s = 0; s < steps; ++s) {
            const int st = s % STAGES;
            // the next step's inputs, in flight while this one is waited for and dequantized
            const int sn = min(s + 1, steps - 1);
            const uint4 qn = __ldg(reinterpret_cast<const uint4*>(wsrc + 32 * sn));
            const u32 qan = __ldg(w.qabsmax + blk + sn);
            const float a2n = __ldg(w.absmax2 + ((blk + sn) >> 8));
            if (s >= STAGES) mbar_wait(smem_addr(empty + st), ((s / STAGES) - 1) & 1);
            const u32 stage = st * STAGE_BYTES;
            xt.load(stage, 64 * s);
            mbar_arrive_cp_async(smem_addr(full + st));
            const float am = wok ? absmax_of(code2[qa], a2, w.offset) : 0.f;
            const u32 words[4] = {q.x, q.y, q.z, q.w};
            u32 lut_lo[4], lut_hi[4];
            lut_build<T>(am, lut_lo, lut_hi);
#pragma unroll
            for (int c = 0; c < 4; ++c) {  // 16-byte chunk 4 half + c of the row: 8 weights, word c
                const u32 word = words[c];
                u32 out[4];  // (weight 0, weight 1) as T pairs, then (2, 3), ...
#pragma unroll
                for (int h = 0; h < 2; ++h) lut_lookup(word >> (16 * h), lut_lo, lut_hi, out[2 * h], out[2 * h + 1]);
                const u32 dst = wdst + stage + (((4 * half + c) ^ (row & 7)) << 4);
                asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(out[0]), "r"(out[1]),
                             "r"(out[2]), "r"(out[3])
                             : "memory");
            }
            fence_async_smem();  // the stores, for the consumers' wgmmas (async proxy)
            mbar_arrive(smem_addr(full + st));
            q = qn;
            qa = qan;
            a2 = a2n;
        }
    } else {  // ---- consumers: warpgroup c multiplies W rows 64 c .. + 64
        const int c = (tid >> 7) - 2;
        float d[BM / 2];
#pragma unroll
        for (int i = 0; i < BM / 2; ++i) d[i] = 0.f;
#pragma unroll 1
        for (int s = 0; s < steps; ++s) {
            const int st = s % STAGES;
            mbar_wait(smem_addr(full + st), (s / STAGES) & 1);
            fence_async_smem();
            const u8* const stage = tiles + st * STAGE_BYTES;
            const u64 da = sw128_desc(stage + c * 64 * 128), db = sw128_desc(stage + S::W_BYTES);
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < 4; ++j) wgmma_ss(T(), d, da + 2 * j, db + 2 * j);  // +32 bytes per k16
            wgmma_commit();
            wgmma_wait<1>();  // step s - 1's wgmmas retired: its stage may be refilled
            if (s > 0) mbar_arrive(smem_addr(empty + (s - 1) % STAGES));
        }
        wgmma_wait<0>();
        fence_regs(d);
        const int lane = tid & 31;
        store_d<T, BM>(d, n0 + 64 * c + 16 * ((tid >> 5) & 3) + (lane >> 2), m0 + 2 * (lane & 3), M, N, y16, y32);
    }
#endif
}

// ---- many-token forward on Hopper: TMA-fed tiles, the weight dequantized into wgmma registers ------

// y^T[N, M] = W[N, K] x^T with the weight as the wgmma's register operand A and x's tile as B in
// shared memory, like wgmma_fwd, but no MMA thread copies anything: one producer thread issues TMA
// copies (x: BM tokens x 64 k, 128-byte swizzled; W: the block's ROWS x 32 packed bytes of the
// step) into a ring of stages handed over with mbarriers, so no thread waits on its own copies and
// no proxy fence stands between the copies and the wgmmas (wgmma_fwd's and ws_fwd's cost: ops'
// docstring). The MMA warps read their rows' packed bytes from the stage, look the nibbles up in a
// per-block table of the 16 rounded values T(code * absmax) held in registers (byte permutes, no
// shared-memory table: those lookups compete with the wgmmas for shared-memory bandwidth), and
// issue the step's wgmmas while the other warpgroup's run.
// ROWS = 64 (SPLIT): both warpgroups take the same 64 rows, warpgroup c the k-steps s % 2 == c,
// and their sums are added at the end: each weight is dequantized once per token tile while two
// warpgroups keep the tensor cores fed. ROWS = 128: warpgroup c takes rows 64 c .. + 64 over every
// k-step. KS = 2 (ROWS = 128): a cluster of two CTAs along grid z, each over half the k-steps, adds
// its sums through distributed shared memory, so each CTA reads half of x for the same
// dequantization work per weight as ROWS = 64. The producer's warpgroup hands its registers to
// the MMA warpgroups (setmaxnreg), which a 256-token tile's 128 accumulators per thread need.

struct __align__(64) TmaDesc {
    u64 bits[16];
};  // a CUtensorMap encoded on the host (tensor_map.tiled_2d), passed as a __grid_constant__ parameter

template <int BM, bool SPLIT>
struct TmaShape {
    static constexpr int ROWS = SPLIT ? 64 : 128;
    static constexpr int X_BYTES = BM * 128;  // stage: x tile first (1024-byte aligned), then W bytes
    static constexpr int W_BYTES = ROWS * 32;
    static constexpr int STAGE_BYTES = X_BYTES + W_BYTES;
    static constexpr int STAGES = 200 * 1024 / STAGE_BYTES < 8 ? 200 * 1024 / STAGE_BYTES : 8;
    static constexpr int WARPS_PER_STEP = SPLIT ? 4 : 8;  // consumer warps releasing a stage
    // The lookup table of a row's block is shared by the 4 lanes holding that row: on 128-token
    // tiles (half the MMA work per dequantized weight) each lane computes a quarter and shuffles,
    // measured 8-11% faster on the H200 for ROWS = 64; on 256-token tiles within noise either way.
    static constexpr bool SHARED_LUT = BM == 128;
};  // dynamic shared memory: 1024 (alignment slack) + STAGES * STAGE_BYTES, ops.tma_smem_bytes

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("{.reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;}" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void tma_load_2d(u32 dst, const TmaDesc* map, int c0, int c1, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            dst),
        "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void cluster_sync() {  // every thread of the cluster's CTAs; memory ordered
    asm volatile("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Adds a partner's share of the BM-token tile's sums to this thread's accumulators d: the thread
// keeps the half of the tokens `keep_first` says (d's first or last BM / 4 values), hands the other
// half to the partner's thread through shared memory ([2 halves][BM / 16][NT threads] float4, this
// thread's slot at shared::cluster address `give` in the partner's CTA, at `mine` in its own),
// and adds the half the partner handed it. `sync` is the barrier both sides pass, before the
// hand-over (the shared memory is free) and after it.
template <int BM, int NT, typename Sync>
__device__ __forceinline__ void add_partner_half(float (&d)[BM / 2], bool keep_first, u32 give, u32 mine, Sync sync) {
    constexpr int H = BM / 4;
    constexpr u32 CHUNK = NT * 16, HALF = H / 4 * CHUNK;
    sync();
#pragma unroll
    for (int i = 0; i < H; i += 4) {  // d is indexed by constants only (registers), hence the selects
        const u32 to = give + (keep_first ? HALF : 0) + i / 4 * CHUNK;
        asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(to),
                     "f"(keep_first ? d[H + i] : d[i]), "f"(keep_first ? d[H + i + 1] : d[i + 1]),
                     "f"(keep_first ? d[H + i + 2] : d[i + 2]), "f"(keep_first ? d[H + i + 3] : d[i + 3])
                     : "memory");
    }
    sync();
    const u32 got = mine + (keep_first ? 0 : HALF);
    float v[H];
#pragma unroll
    for (int i = 0; i < H; i += 4)
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(v[i]), "=f"(v[i + 1]), "=f"(v[i + 2]), "=f"(v[i + 3])
                     : "r"(got + i / 4 * CHUNK)
                     : "memory");
    if (keep_first) {
#pragma unroll
        for (int i = 0; i < H; ++i) d[i] += v[i];
    } else {
#pragma unroll
        for (int i = 0; i < H; ++i) d[H + i] += v[i];
    }
}
// Stores a warpgroup's sums d[4 J0 ..] (its 64 rows n0w.. x tokens m0w + 0 .. 8 (J1 - J0)) rounded
// to T: stmatrix.trans writes them token-major into `stage` (one 128-byte row per token, 16-byte
// chunks XOR-swizzled by token so neither side conflicts), then each token's 64 values go out as
// 16-byte stores: a warp writes whole 128-byte rows, where storing the fragments directly wrote 2
// bytes per lane and half sectors (1.3-2.4 us of a 31 us kernel on the H200). `wg_sync` orders the
// warpgroup's shared-memory writes before its reads. wtid: the thread's index in its warpgroup.
template <typename T, int BM, int J0, int J1, typename Sync>
__device__ __forceinline__ void store_rows16(const float (&d)[BM / 2], u32 stage, int wtid, int n0w, int m0w, int M,
                                             int N, u16* y16, Sync wg_sync) {
    static_assert((J1 - J0) % 2 == 0, "stmatrix x4 takes two k16 column tiles of both row halves");
    const int lane = wtid & 31, q = lane >> 3, chunk = 2 * (wtid >> 5) + (q & 1);
#pragma unroll
    for (int j = J0; j < J1; j += 2) {  // matrix q: token tile j + q / 2, rows + 8 (q % 2)
        const int tok = 8 * (j - J0 + q / 2) + (lane & 7);
        const u32 at = stage + tok * 128 + ((chunk ^ (tok & 7)) << 4);
        u32 r[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) r[i] = pack2(T(), d[4 * (j + i / 2) + 2 * (i % 2)], d[4 * (j + i / 2) + 2 * (i % 2) + 1]);
        asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(at), "r"(r[0]),
                     "r"(r[1]), "r"(r[2]), "r"(r[3])
                     : "memory");
    }
    wg_sync();
    constexpr int CHUNKS = 8 * (J1 - J0) * 8;  // tokens x 8 chunks of 8 values
    const bool whole = N % 8 == 0;             // rows 16-byte aligned: a chunk in range is one store
#pragma unroll
    for (int i = wtid; i < CHUNKS; i += 128) {
        const int tok = i >> 3, c = i & 7, m = m0w + tok, n = n0w + 8 * c;
        if (m >= M || n >= N) continue;
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(stage + tok * 128 + ((c ^ (tok & 7)) << 4))
                     : "memory");
        u16* const o = y16 + static_cast<long long>(m) * N + n;
        if (whole && n + 8 <= N) {
            *reinterpret_cast<uint4*>(o) = v;
        } else {
            const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (n + e < N) o[e] = static_cast<u16>(w[e / 2] >> (16 * (e % 2)));
        }
    }
}
#endif

template <typename T, int BM, bool SPLIT, int KS>
__device__ void tma_fwd(const TmaDesc& tx, const TmaDesc& tw, const NF4& w, u16* __restrict__ y16,
                        float* __restrict__ y32, int M, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(KS == 1 || (KS == 2 && !SPLIT), "a k-split pairs two CTAs of 128 rows");
    using S = TmaShape<BM, SPLIT>;
    constexpr int STAGES = S::STAGES, STRIDE = SPLIT ? 2 : 1;
    extern __shared__ u8 dyn[];
    u8* const tiles = align1024(dyn);
    __shared__ float code2[256];
    __shared__ u64 full[STAGES], empty[STAGES];
    const int tid = threadIdx.x;
    const int n0 = blockIdx.x * S::ROWS, m0 = blockIdx.y * BM, steps = K / 64;
    // Every warpgroup runs an even number of k-steps (ptxas serializes the wgmmas if a step is
    // conditional): the padding steps lie past K, where TMA fills both tiles with zeros. KS = 2:
    // the cluster's CTA z takes the k-steps from s0 = z * padded on (steps counted from s0 below).
    const int share = (steps + KS - 1) / KS;
    const int padded = SPLIT ? (share + 3) & ~3 : (share + 1) & ~1, s0 = blockIdx.z * padded;
    // A step's place in the stage ring (stage, parity of its fill), advanced without divisions
    struct Ring {
        u32 stage, parity;
    };
    static_assert(STAGES > 2 * STRIDE, "a position advances by at most one lap");
    auto advance = [](Ring r, u32 n) {
        r.stage += n;
        if (r.stage >= STAGES) {
            r.stage -= STAGES;
            r.parity ^= 1u;
        }
        return r;
    };
    auto load = [&](int s, u32 st) {  // the producer's copies of step s into stage st
        const u32 stage = smem_addr(tiles) + st * S::STAGE_BYTES, bar = smem_addr(full + st);
        mbar_expect_tx(bar, S::STAGE_BYTES);
        tma_load_2d(stage, &tx, 64 * (s0 + s), m0, bar);
        tma_load_2d(stage + S::X_BYTES, &tw, 32 * (s0 + s), n0, bar);
    };
    // The producer thread sets up the barriers and fills the ring before the block synchronizes:
    // the first tiles are on their way while the code table loads (0.4 us of a block's start).
    if (tid == 256) {
        asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(&tx)) : "memory");
        asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(&tw)) : "memory");
        for (int i = 0; i < STAGES; ++i) {
            mbar_init(smem_addr(full + i), 1);  // the producer's expect_tx; the TMA bytes complete it
            mbar_init(smem_addr(empty + i), S::WARPS_PER_STEP);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the TMA unit
        for (int s = 0; s < STAGES && s < padded; ++s) load(s, s);
    }
    if (tid < 256) code2[tid] = __ldg(w.code2 + tid);
    __syncthreads();

    if (tid >= 256) {  // ---- producer: one thread issues every copy
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
        if (tid == 256) {
            Ring at = {0, 0};  // step STAGES refills stage 0 once its first fill was consumed
            for (int s = STAGES; s < padded; ++s, at = advance(at, 1)) {
                mbar_wait(smem_addr(empty + at.stage), at.parity);
                load(s, at.stage);
            }
        }
        return;
    }

    // ---- MMA warpgroups
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
    const int c = tid >> 7, lane = tid & 31, t = lane & 3;
    const int r_lo = (SPLIT ? 0 : 64 * c) + 16 * ((tid >> 5) & 3) + (lane >> 2);  // rows r_lo, r_lo + 8
    const int first = SPLIT ? c : 0;
    const u32 gather = 0x40u + 0x11u * t;  // prmt selector: byte t of two words into bits 0..15
    float code4[4];                         // this lane's share of a shared table (S::SHARED_LUT)
#pragma unroll
    for (int i = 0; i < 4; ++i) code4[i] = S::SHARED_LUT ? NF4_CODE[4 * t + i] : 0.f;
    u32 blk[2];  // first 64-block of each row (rows past N: the last row's, finite and never stored)
#pragma unroll
    for (int h = 0; h < 2; ++h) blk[h] = static_cast<u32>(min(n0 + r_lo + 8 * h, N - 1)) * static_cast<u32>(K / 64);
    auto scale_load = [&](int s, u32 (&q)[2], float (&a2)[2]) {  // absmax inputs of step s
        const u32 sc = min(s0 + s, steps - 1);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            q[h] = __ldg(w.qabsmax + blk[h] + sc);
            a2[h] = __ldg(w.absmax2 + ((blk[h] + sc) >> 8));
        }
    };
    const u64 desc0 = sw128_desc(tiles);  // stage 0's x tile; the address field (bits 0..13) never carries
    // Step s's A fragments; k16 tile j: a[j][h] = row h at k 2t, 2t+1 (byte t of word 2j of the
    // row's 32 bytes), a[j][2 + h] at k 2t+8, 2t+9 (byte t of word 2j+1). The scales of this
    // warpgroup's step after next are loaded here.
    auto dequant = [&](int s, Ring at, WgmmaInputs& in, u32 (&q)[2], float (&a2)[2]) {
        float am[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) am[h] = absmax_of(code2[q[h]], a2[h], w.offset);
        scale_load(s + 2 * STRIDE, q, a2);
        const u8* const wb = tiles + at.stage * S::STAGE_BYTES + S::X_BYTES;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint4* row = reinterpret_cast<const uint4*>(wb + (r_lo + 8 * h) * 32);
            const uint4 p = row[0], v = row[1];
            const u32 words[8] = {p.x, p.y, p.z, p.w, v.x, v.y, v.z, v.w};
            u32 lo[4], hi[4];
            if constexpr (S::SHARED_LUT) lut_build_shared<T>(am[h], code4, lane, lo, hi);
            else lut_build<T>(am[h], lo, hi);
#pragma unroll
            for (int j = 0; j < 4; ++j)
                lut_lookup(prmt(words[2 * j], words[2 * j + 1], gather), lo, hi, in.a[j][h], in.a[j][2 + h]);
        }
        const u32 lo = static_cast<u32>(desc0) + at.stage * (S::STAGE_BYTES >> 4);
#pragma unroll
        for (int j = 0; j < 4; ++j) in.desc[j] = (desc0 & ~0xFFFFFFFFull) | (lo + 2 * j);  // +32 bytes per k16
    };
    float d[BM / 2];
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) d[i] = 0.f;
    auto issue = [&](WgmmaInputs& in) {
        fence_regs(in);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) wgmma_rs(T(), d, in.a[j], in.desc[j]);
        wgmma_commit();
    };
    auto ready = [&](int s, Ring at) {  // waits for step s's tiles (none past the last step: nothing comes)
        if (s < padded) mbar_wait(smem_addr(full + at.stage), at.parity);
    };
    auto release = [&](Ring at) {  // the step's wgmmas retired: its stage may be refilled
        if (lane == 0) mbar_arrive(smem_addr(empty + at.stage));
    };
    u32 q[2][2];
    float a2[2][2];
    scale_load(first, q[0], a2[0]);
    scale_load(first + STRIDE, q[1], a2[1]);
    WgmmaInputs even = {}, odd = {};
    Ring at = advance({0, 0}, first), before = at;  // steps s and s - STRIDE
    ready(first, at);
    dequant(first, at, even, q[0], a2[0]);
#pragma unroll 1
    for (int s = first; s < padded; s += 2 * STRIDE) {
        // step s (A ready) runs while step s + STRIDE is dequantized, then the other way round
        const Ring next = advance(at, STRIDE), after = advance(at, 2 * STRIDE);
        issue(even);
        if (s > first) {
            wgmma_wait<1>();
            release(before);
        }
        ready(s + STRIDE, next);
        fence_regs(odd);
        dequant(s + STRIDE, next, odd, q[1], a2[1]);
        issue(odd);
        wgmma_wait<1>();
        release(at);
        ready(s + 2 * STRIDE, after);
        fence_regs(even);
        // past the end: step s + STRIDE's stage again (landed; the other warpgroup's may not have), never issued
        dequant(s + 2 * STRIDE, s + 2 * STRIDE < padded ? after : next, even, q[0], a2[0]);
        before = next;
        at = after;
    }
    wgmma_wait<0>();
    fence_regs(d);
    // The next kernel, if launched to overlap this one, may be scheduled once every block is here
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    // SPLIT: the other warpgroup's sums are added, through this CTA's tiles; KS = 2: those of the
    // same thread of the cluster's other CTA, through its tiles (distributed shared memory). Each
    // side then stores half the tokens.
    constexpr bool HALVES = SPLIT || KS == 2;
    constexpr int EXCHANGE = HALVES ? 2 * BM * (SPLIT ? 128 : 256) : 0;  // add_partner_half's bytes
    constexpr int TOKENS = HALVES ? BM / 2 : BM;                        // tokens a warpgroup stores
    static_assert(EXCHANGE + 2 * TOKENS * 128 <= STAGES * S::STAGE_BYTES, "the staged tiles fit the ring");
    bool keep_first = true;
    if constexpr (SPLIT) {
        keep_first = c == 0;
        const u32 mine = smem_addr(tiles) + 16 * (tid & 127);
        add_partner_half<BM, 128>(d, keep_first, mine, mine, [] { asm volatile("bar.sync 1, 256;" ::: "memory"); });
    } else if constexpr (KS == 2) {
        u32 rank, give;
        asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
        keep_first = rank == 0;
        const u32 mine = smem_addr(tiles) + 16 * tid;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(give) : "r"(mine), "r"(rank ^ 1));
        add_partner_half<BM, 256>(d, keep_first, give, mine, cluster_sync);
    } else if (!y32) {  // the other warpgroup's last wgmmas may still read a stage staged into below
        asm volatile("bar.sync 1, 256;" ::: "memory");
    }
    const int n = n0 + r_lo, m = m0 + 2 * t, n0w = n0 + (SPLIT ? 0 : 64 * c);
    const u32 staged = smem_addr(tiles) + EXCHANGE + c * TOKENS * 128;
    auto wg_sync = [c] {  // named barriers 2 and 3: one per warpgroup
        if (c == 0) asm volatile("bar.sync 2, 128;" ::: "memory");
        else asm volatile("bar.sync 3, 128;" ::: "memory");
    };
    if (!HALVES || keep_first) {
        if (y32) store_d<T, BM, 0, TOKENS / 8>(d, n, m, M, N, y16, y32);
        else store_rows16<T, BM, 0, TOKENS / 8>(d, staged, tid & 127, n0w, m0, M, N, y16, wg_sync);
    } else {
        if (y32) store_d<T, BM, BM / 16, BM / 8>(d, n, m, M, N, y16, y32);
        else store_rows16<T, BM, BM / 16, BM / 8>(d, staged, tid & 127, n0w, m0 + BM / 2, M, N, y16, wg_sync);
    }
#endif
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
#if PART(0)
GEMV_F32(1)
GEMV_F32(2)
GEMV_F32(4)
GEMV_F32(8)
GEMV_F32(16)
#endif

#define MMA_FWD(TY, NAME, MT)                                                                          \
    extern "C" __global__ void __launch_bounds__(256, 2)                                               \
        nf4_mma_fwd_##NAME##_m##MT(NF4_ARGS, const u16* x, u16* y16, float* y32, int M, int N, int K) { \
        NF4_MAKE;                                                                                      \
        mma_fwd<TY, MT, MT == 8 ? 4 : 2>(w, x, y16, y32, M, N, K);                                     \
    }
#define MMA_BWD(TY, NAME, MT)                                                                          \
    extern "C" __global__ void __launch_bounds__(128)                                                  \
        nf4_mma_bwd_##NAME##_m##MT(NF4_ARGS, const u16* gy, float* gx, int M, int N, int K, int rows_per_split) { \
        NF4_MAKE;                                                                                      \
        mma_bwd<TY, MT>(w, gy, gx, M, N, K, rows_per_split);                                           \
    }
#define MMA_ALL(TY, NAME) MMA_FWD(TY, NAME, 8) MMA_FWD(TY, NAME, 16) MMA_BWD(TY, NAME, 8) MMA_BWD(TY, NAME, 16)
#if PART(1)
MMA_ALL(F16, f16)
MMA_ALL(BF16, bf16)
#endif

// nf4_<KIND>_fwd_<dtype>_m<BM>: one block of THREADS per 128 W rows x BM tokens, KIND##_fwd does it.
#define GEMM_FWD(KIND, THREADS, TY, NAME, BM)                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS, 1) nf4_##KIND##_fwd_##NAME##_m##BM(          \
        NF4_ARGS, const u16* x, u16* y16, float* y32, int M, int N, int K) {                           \
        NF4_MAKE;                                                                                      \
        KIND##_fwd<TY, BM>(w, x, y16, y32, M, N, K);                                                   \
    }
#define GEMM_FWD_ALL(KIND, THREADS, BM) GEMM_FWD(KIND, THREADS, BF16, bf16, BM) GEMM_FWD(KIND, THREADS, F16, f16, BM)
#define WGMMA_FWD_ALL(TY, NAME) GEMM_FWD(wgmma, 256, TY, NAME, 32) GEMM_FWD(wgmma, 256, TY, NAME, 64) \
    GEMM_FWD(wgmma, 256, TY, NAME, 128) GEMM_FWD(wgmma, 256, TY, NAME, 256)
#if PART(2)
WGMMA_FWD_ALL(BF16, bf16)
#endif
#if PART(3)
WGMMA_FWD_ALL(F16, f16)
#endif
#if PART(4)
GEMM_FWD_ALL(ws, 512, 64) GEMM_FWD_ALL(ws, 512, 128)
#endif

// nf4_tma_fwd_<dtype>_m<BM>_r<ROWS>[_k2]: one block of 384 threads (2 MMA warpgroups, 1 copy
// warpgroup) per ROWS W rows x BM tokens; tx, tw: the tensor maps of x and of the packed weight
// (tensor_map.tiled_2d). _k2: clusters of 2 blocks along grid z split the k-steps and add their sums.
// Launched to overlap the kernel before it (ops._launch(overlapping=True)), a block waits here,
// before it reads anything, until that kernel has completed and its writes are visible.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CLUSTER_Z(KS) __cluster_dims__(1, 1, KS)
#define AFTER_PREVIOUS_KERNEL asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define CLUSTER_Z(KS)  // no clusters before Hopper (the body is empty there)
#define AFTER_PREVIOUS_KERNEL
#endif
#define TMA_FWD(TY, NAME, BM, SPLIT, ROWS, KS, SUFFIX)                                                 \
    extern "C" __global__ void __launch_bounds__(384, 1) CLUSTER_Z(KS)                                 \
        nf4_tma_fwd_##NAME##_m##BM##_r##ROWS##SUFFIX(const __grid_constant__ TmaDesc tx,               \
                                                      const __grid_constant__ TmaDesc tw, NF4_ARGS,     \
                                                      u16* y16, float* y32, int M, int N, int K) {      \
        AFTER_PREVIOUS_KERNEL;                                                                         \
        NF4_MAKE;                                                                                      \
        tma_fwd<TY, BM, SPLIT, KS>(tx, tw, w, y16, y32, M, N, K);                                     \
    }
#define TMA_FWD_ALL(BM, SPLIT, ROWS, KS, SUFFIX) \
    TMA_FWD(BF16, bf16, BM, SPLIT, ROWS, KS, SUFFIX) TMA_FWD(F16, f16, BM, SPLIT, ROWS, KS, SUFFIX)
#if PART(5)
TMA_FWD_ALL(128, true, 64, 1, ) TMA_FWD_ALL(256, true, 64, 1, )
#endif
#if PART(6)
TMA_FWD_ALL(128, false, 128, 1, ) TMA_FWD_ALL(256, false, 128, 1, )
#endif
#if PART(7)
TMA_FWD_ALL(128, false, 128, 2, _k2) TMA_FWD_ALL(256, false, 128, 2, _k2)
#endif
