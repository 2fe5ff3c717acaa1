// Selective scoring kernels for filter-first decoding (zerogr).
//
// Contract (the torch reference in runtime/scoring/selective_torch.py computes the same function):
//   selective_scores(hidden [R, d], weight [V, d], bias [V] | null, slot_tokens int32 [R, K]) -> fp32 [R, K]
//     out[r, k] = dot(hidden[r], weight[tok]) + bias[tok]  with tok = slot_tokens[r, k], fp32 accumulation;
//     out[r, k] = -inf where the slot is empty (tok == -1; any tok outside [0, V) is treated as empty so a bad
//     slot can never read outside the weight matrix).
//   selective_log_softmax(same) -> fp32 [R, K]: the row's valid slots log-softmaxed, -inf at empty slots,
//     a row without any valid slot is all -inf (never NaN).
//
// Memory layout: every 2-D operand has unit stride along its last dimension and an arbitrary row stride
// (given in elements), so views such as weight[:, :d] or hidden[::2] are read in place. bias is contiguous.
// hidden, weight and bias share one dtype T (fp32, fp16 or bf16); out is always fp32.
//
// Work split: a thread block owns one beam row r and caches hidden[r] in shared memory as fp32 (dynamic
// shared memory, d * 4 bytes); each warp computes one slot at a time, its 32 lanes reading the slot's weight
// row in 16-byte vectors (float4 / 8 halves / 8 bf16) when the weight base and row stride are 16-byte
// aligned, element by element otherwise. A slot's token is the same for all lanes of its warp, so the
// "empty slot" branch never diverges inside a warp.
//
// No header is included: fp16 and bf16 values are read as their 16-bit patterns (tag structs below) and
// converted with one PTX instruction (fp16) or a shift (bf16, exact). The file therefore compiles with nvcc
// and with NVRTC even where the CUDA include directory (cuda_fp16.h) is not installed, e.g. next to a CuPy
// wheel.

#define ZG_MAX_WARPS 32
#define ZG_FULL_MASK 0xffffffffu

namespace zg {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Storage types: fp16 and bf16 are both 16-bit patterns, told apart by a tag type.
struct f16 {
    unsigned short bits;
};
struct bf16 {
    unsigned short bits;
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(f16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float to_float(bf16 x) { return __uint_as_float(((unsigned int)x.bits) << 16); }

// The two 16-bit values packed in a 32-bit word (low half first, as they lie in memory).
__device__ __forceinline__ float2 unpack2(f16, unsigned int u) {
    const f16 lo{(unsigned short)(u & 0xffffu)};
    const f16 hi{(unsigned short)(u >> 16)};
    return make_float2(to_float(lo), to_float(hi));
}
__device__ __forceinline__ float2 unpack2(bf16, unsigned int u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(ZG_FULL_MASK, v, offset);
    return v;
}

// Dot product of one 16-byte pack of weights with the matching fp32 hidden values in shared memory.
// `h` is 16-byte aligned (shared memory base is, and packs start at multiples of 4 or 8 floats).
__device__ __forceinline__ float pack_dot(const float4* w, const float* h) {
    const float4 wv = __ldg(w);
    const float4 hv = *reinterpret_cast<const float4*>(h);
    return wv.x * hv.x + wv.y * hv.y + wv.z * hv.z + wv.w * hv.w;
}

// 8 half-precision values (fp16 or bf16, told apart by T) packed in a uint4.
template <typename T>
__device__ __forceinline__ float pack_dot_8(const uint4* w, const float* h) {
    const uint4 raw = __ldg(w);
    const float4 h0 = *reinterpret_cast<const float4*>(h);
    const float4 h1 = *reinterpret_cast<const float4*>(h + 4);
    const float2 a = unpack2(T{}, raw.x);
    const float2 b = unpack2(T{}, raw.y);
    const float2 c = unpack2(T{}, raw.z);
    const float2 e = unpack2(T{}, raw.w);
    return a.x * h0.x + a.y * h0.y + b.x * h0.z + b.y * h0.w + c.x * h1.x + c.y * h1.y + e.x * h1.z +
           e.y * h1.w;
}

template <typename T>
struct Pack;
template <>
struct Pack<float> {
    static constexpr int width = 4;
    static __device__ __forceinline__ float dot(const float* w, const float* h) {
        return pack_dot(reinterpret_cast<const float4*>(w), h);
    }
};
template <>
struct Pack<f16> {
    static constexpr int width = 8;
    static __device__ __forceinline__ float dot(const f16* w, const float* h) {
        return pack_dot_8<f16>(reinterpret_cast<const uint4*>(w), h);
    }
};
template <>
struct Pack<bf16> {
    static constexpr int width = 8;
    static __device__ __forceinline__ float dot(const bf16* w, const float* h) {
        return pack_dot_8<bf16>(reinterpret_cast<const uint4*>(w), h);
    }
};

// Whole-warp dot product of weight row `w` (d elements) with hidden_s (fp32, shared). Every lane returns
// the full sum. `vectorised` must be uniform across the warp.
template <typename T>
__device__ __forceinline__ float warp_dot(const T* __restrict__ w, const float* __restrict__ hidden_s, int d,
                                          bool vectorised, int lane) {
    float acc = 0.0f;
    int tail_start = 0;
    if (vectorised) {
        constexpr int W = Pack<T>::width;
        const int packs = d / W;
#pragma unroll 4
        for (int p = lane; p < packs; p += 32) acc += Pack<T>::dot(w + p * W, hidden_s + p * W);
        tail_start = packs * W;
    }
    for (int j = tail_start + lane; j < d; j += 32) acc += to_float(w[j]) * hidden_s[j];
    return warp_sum(acc);
}

// Copies hidden[r] (d elements of T) into shared memory as fp32. Ends with a block barrier.
template <typename T>
__device__ __forceinline__ void load_hidden(const T* __restrict__ hidden_row, float* hidden_s, int d) {
    for (int j = threadIdx.x; j < d; j += blockDim.x) hidden_s[j] = to_float(hidden_row[j]);
    __syncthreads();
}

template <typename T>
__device__ __forceinline__ bool rows_are_vector_aligned(const T* weight, long long weight_row_stride) {
    return (reinterpret_cast<unsigned long long>(weight) & 15ull) == 0ull &&
           ((weight_row_stride * (long long)sizeof(T)) & 15ll) == 0ll;
}

// Score of slot k of row r, or -inf for an empty slot. Warp-uniform result.
template <typename T>
__device__ __forceinline__ float slot_score(const T* __restrict__ weight, long long weight_row_stride,
                                            const T* __restrict__ bias, int tok, long long V,
                                            const float* __restrict__ hidden_s, int d, bool vectorised,
                                            int lane) {
    if (tok < 0 || (long long)tok >= V) return neg_inf();
    float s = warp_dot<T>(weight + (long long)tok * weight_row_stride, hidden_s, d, vectorised, lane);
    if (bias != nullptr) s += to_float(bias[tok]);
    return s;
}

// Online log-sum-exp state: running max m and sum of exp(x - m). (m = -inf, s = 0) is the empty state.
struct Lse {
    float m;
    float s;
};

__device__ __forceinline__ Lse lse_empty() { return Lse{neg_inf(), 0.0f}; }

// NaN is sticky (m = NaN once any score is NaN), so a NaN row normalises like the torch reference:
// lse = NaN, and normalise_row leaves such a row's scores as they are (NaN stays NaN, never -inf).
__device__ __forceinline__ bool is_nan(float x) { return x != x; }

__device__ __forceinline__ Lse lse_add(Lse a, float x) {
    if (x == neg_inf()) return a;  // empty slot: contributes exp(-inf) = 0
    if (is_nan(x) || is_nan(a.m)) return Lse{__int_as_float(0x7fc00000), 1.0f};
    if (x > a.m) return Lse{x, a.s * expf(a.m - x) + 1.0f};  // a.m = -inf gives a.s * 0 = 0
    return Lse{a.m, a.s + expf(x - a.m)};
}

__device__ __forceinline__ Lse lse_merge(Lse a, Lse b) {
    // Guarded so that two empty states never evaluate exp(-inf - -inf) = NaN; fmaxf would drop a NaN.
    if (is_nan(a.m)) return a;
    if (is_nan(b.m)) return b;
    if (b.m == neg_inf()) return a;
    if (a.m == neg_inf()) return b;
    const float m = fmaxf(a.m, b.m);
    return Lse{m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// Block-wide merge of per-thread states; returns log-sum-exp (-inf for an all-empty row) to every thread.
__device__ __forceinline__ float block_log_sum_exp(Lse mine) {
    __shared__ float m_s[ZG_MAX_WARPS];
    __shared__ float s_s[ZG_MAX_WARPS];
    __shared__ float lse_s;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        Lse other;
        other.m = __shfl_xor_sync(ZG_FULL_MASK, mine.m, offset);
        other.s = __shfl_xor_sync(ZG_FULL_MASK, mine.s, offset);
        mine = lse_merge(mine, other);
    }
    if (lane == 0) {
        m_s[warp] = mine.m;
        s_s[warp] = mine.s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        Lse total = lse_empty();
        for (int w = 0; w < warps; ++w) total = lse_merge(total, Lse{m_s[w], s_s[w]});
        lse_s = (total.m == neg_inf()) ? neg_inf() : total.m + logf(total.s);
    }
    __syncthreads();
    return lse_s;
}

// Subtracts lse from row `out_row` (K entries) in place; an all-empty row (lse = -inf) stays all -inf.
// The caller must have made the row's writes visible to the block (a __syncthreads in between).
__device__ __forceinline__ void normalise_row(float* out_row, int K, float lse) {
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        // torch's masked_log_softmax subtracts 0 where lse is not finite (-inf: all empty; NaN; +inf).
        out_row[k] = (lse - lse == 0.0f) ? out_row[k] - lse : out_row[k];
    }
}

// What every thread of the block that owns beam row r = blockIdx.x works with: hidden[r] in shared memory as
// fp32, the row's slot tokens and output, its lane and warp, and whether weight rows are read as vectors.
struct RowContext {
    const float* hidden_s;
    const int* tokens_row;
    float* out_row;
    int lane;
    int warp;
    int warps;
    bool vectorised;
};

// The block prologue of both kernels: loads hidden[r] into dynamic shared memory (d * 4 bytes; ends with a
// block barrier) and locates row r of slot_tokens and out.
template <typename T>
__device__ __forceinline__ RowContext row_context(const T* __restrict__ hidden, long long hidden_row_stride,
                                                  const T* __restrict__ weight, long long weight_row_stride,
                                                  const int* slot_tokens, long long slots_row_stride,
                                                  float* out, long long out_row_stride, int d) {
    extern __shared__ float4 zg_dynamic_smem[];
    float* hidden_s = reinterpret_cast<float*>(zg_dynamic_smem);
    const long long r = blockIdx.x;
    load_hidden<T>(hidden + r * hidden_row_stride, hidden_s, d);
    RowContext row;
    row.hidden_s = hidden_s;
    row.tokens_row = slot_tokens + r * slots_row_stride;
    row.out_row = out + r * out_row_stride;
    row.lane = threadIdx.x & 31;
    row.warp = threadIdx.x >> 5;
    row.warps = blockDim.x >> 5;
    row.vectorised = rows_are_vector_aligned<T>(weight, weight_row_stride);
    return row;
}

// grid = (R, ceil(K / slots_per_block)), block = 32 * warps threads, dynamic shared memory = d * 4 bytes.
template <typename T>
__device__ __forceinline__ void scores_impl(const T* __restrict__ hidden, long long hidden_row_stride,
                                            const T* __restrict__ weight, long long weight_row_stride,
                                            const T* __restrict__ bias, const int* __restrict__ slot_tokens,
                                            long long slots_row_stride, float* __restrict__ out,
                                            long long out_row_stride, int K, int d, long long V,
                                            int slots_per_block) {
    const RowContext row = row_context<T>(hidden, hidden_row_stride, weight, weight_row_stride, slot_tokens,
                                          slots_row_stride, out, out_row_stride, d);
    const int k_begin = blockIdx.y * slots_per_block;
    const int k_end = min(K, k_begin + slots_per_block);
    for (int k = k_begin + row.warp; k < k_end; k += row.warps) {
        const float s = slot_score<T>(weight, weight_row_stride, bias, row.tokens_row[k], V, row.hidden_s, d,
                                      row.vectorised, row.lane);
        if (row.lane == 0) row.out_row[k] = s;
    }
}

// grid = (R), block = 32 * warps threads, dynamic shared memory = d * 4 bytes. One block per beam row:
// scores go to `out` first, then the block's log-sum-exp is subtracted in place.
template <typename T>
__device__ __forceinline__ void log_softmax_impl(const T* __restrict__ hidden, long long hidden_row_stride,
                                                 const T* __restrict__ weight, long long weight_row_stride,
                                                 const T* __restrict__ bias,
                                                 const int* __restrict__ slot_tokens,
                                                 long long slots_row_stride, float* out,
                                                 long long out_row_stride, int K, int d, long long V) {
    const RowContext row = row_context<T>(hidden, hidden_row_stride, weight, weight_row_stride, slot_tokens,
                                          slots_row_stride, out, out_row_stride, d);
    Lse mine = lse_empty();
    for (int k = row.warp; k < K; k += row.warps) {
        const float s = slot_score<T>(weight, weight_row_stride, bias, row.tokens_row[k], V, row.hidden_s, d,
                                      row.vectorised, row.lane);
        if (row.lane == 0) {
            row.out_row[k] = s;
            mine = lse_add(mine, s);
        }
    }
    // block_log_sum_exp's barriers also make lane 0's global writes above visible to the whole block.
    const float lse = block_log_sum_exp(mine);
    normalise_row(row.out_row, K, lse);
}

}  // namespace zg

#define ZG_SCORES_ENTRY(NAME, T)                                                                           \
    extern "C" __global__ void __launch_bounds__(256)                                                      \
        NAME(const T* __restrict__ hidden, long long hidden_row_stride, const T* __restrict__ weight,     \
             long long weight_row_stride, const T* __restrict__ bias, const int* __restrict__ slot_tokens, \
             long long slots_row_stride, float* __restrict__ out, long long out_row_stride, int K, int d,  \
             long long V, int slots_per_block) {                                                           \
        zg::scores_impl<T>(hidden, hidden_row_stride, weight, weight_row_stride, bias, slot_tokens,        \
                           slots_row_stride, out, out_row_stride, K, d, V, slots_per_block);               \
    }

#define ZG_LOG_SOFTMAX_ENTRY(NAME, T)                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                                      \
        NAME(const T* __restrict__ hidden, long long hidden_row_stride, const T* __restrict__ weight,     \
             long long weight_row_stride, const T* __restrict__ bias, const int* __restrict__ slot_tokens, \
             long long slots_row_stride, float* out, long long out_row_stride, int K, int d, long long V) { \
        zg::log_softmax_impl<T>(hidden, hidden_row_stride, weight, weight_row_stride, bias, slot_tokens,   \
                                slots_row_stride, out, out_row_stride, K, d, V);                           \
    }

ZG_SCORES_ENTRY(selective_scores_f32, float)
ZG_SCORES_ENTRY(selective_scores_f16, zg::f16)
ZG_SCORES_ENTRY(selective_scores_bf16, zg::bf16)

ZG_LOG_SOFTMAX_ENTRY(selective_log_softmax_f32, float)
ZG_LOG_SOFTMAX_ENTRY(selective_log_softmax_f16, zg::f16)
ZG_LOG_SOFTMAX_ENTRY(selective_log_softmax_bf16, zg::bf16)

// Second pass of the two-kernel log-softmax (used when there are too few rows to fill the GPU with one
// block per row): grid = (R), block = 32 * warps threads. Log-softmaxes each row of `scores` in place over
// its finite entries; -inf entries (empty slots) stay -inf; an all -inf row stays all -inf.
extern "C" __global__ void __launch_bounds__(256)
    selective_row_log_softmax_inplace(float* scores, long long row_stride, int K) {
    float* row = scores + (long long)blockIdx.x * row_stride;
    zg::Lse mine = zg::lse_empty();
    for (int k = threadIdx.x; k < K; k += blockDim.x) mine = zg::lse_add(mine, row[k]);
    const float lse = zg::block_log_sum_exp(mine);
    zg::normalise_row(row, K, lse);
}
