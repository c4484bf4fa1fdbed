"""The forward pass: config parsing, numerics against llama.cpp, chunking, attention."""
from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from app.engine.attention.dense import attend, attend_reference
from app.engine.generate import decode_one_token, prefill, prefill_reusing_prefix
from app.engine.kv.contiguous import KVCache
from app.engine.header.model_config import (
    ROPE_NEOX,
    ROPE_NORMAL,
    ModelConfig,
    UnsupportedModelError,
)
from app.engine.model.transformer import Model
from app.engine.ops.expf import ggml_expf
from app.engine.ops.f16 import f16_to_f32, f32_to_f16
from tests.engine.conftest import llama_logits, llamacpp_built_for_this_cpu

PROMPT = [5, 977, 12, 1500, 44, 300, 2001, 87, 640, 19, 1024, 256, 7, 1999, 333, 42, 818, 99, 1400, 61]
STEPS = [410, 12, 1777, 5, 930, 64]

# Stated tolerances against llama.cpp, relative to the largest |logit| of the reference:
# F32 weights: float summation order, which can flip the f16 rounding of a q or k element. Quantized weights: activations are re-quantized to
# 8 bits before every matmul, and a last-bit difference can flip one rounding there.
TOLERANCE = {Q.F32: 1e-3, Q.Q8_0: 3e-2, Q.Q4_0: 3e-2, Q.Q4_1: 3e-2}


def assert_logits_close(ours: np.ndarray, ref: np.ndarray, rel: float) -> None:
    """max |ours - ref| <= rel * max |ref|, and the same top token wherever the reference's
    top-2 margin is larger than twice that error (a real tie may go either way)."""
    ours, ref = np.atleast_2d(ours), np.atleast_2d(ref)
    err = np.abs(ours - ref).max()
    bound = rel * np.abs(ref).max()
    assert err <= bound, f"logits differ by {err:.3g} > {bound:.3g}"
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * err
    assert (ours.argmax(1) == ref.argmax(1))[clear].all()


# ---- Config --------------------------------------------------------------------------------


def test_config_of_tiny_llama(tiny_model):
    c = ModelConfig.from_gguf(gguf.GGUFReader(str(tiny_model("llama"))))
    assert (c.arch, c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size) == \
        ("llama", 2, 64, 4, 2, 16, 128, 2048)
    assert (c.q_dim, c.kv_dim, c.group_size, c.rope_type, c.tied_output) == (64, 32, 2, ROPE_NORMAL, True)
    assert c.rope_freq_base == 10000.0 and c.rope_freq_scale == 1.0 and c.rope_ext_factor == 0.0


def test_config_of_tiny_qwen2(tiny_model):
    c = ModelConfig.from_gguf(gguf.GGUFReader(str(tiny_model("qwen2"))))
    assert (c.arch, c.rope_type, c.tied_output, c.rope_freq_base) == ("qwen2", ROPE_NEOX, False, 1e6)


def test_config_of_smollm2(smollm2):
    c = ModelConfig.from_gguf(gguf.GGUFReader(str(smollm2)), smollm2)
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size) == \
        (30, 576, 9, 3, 64, 1536, 49152)
    assert c.context_length == 8192 and c.rope_freq_base == 100000.0 and c.tied_output
    assert c.kv_bytes_per_token() == 2 * 30 * 192 * 2


def test_unknown_architecture_is_refused_with_advice(tiny_model):
    path = tiny_model("gemma")
    with pytest.raises(UnsupportedModelError) as e:
        Model(path)
    msg = str(e.value)
    assert str(path) in msg and "'gemma'" in msg and "--engine llamacpp" in msg


def test_unsupported_tensor_type_is_refused_with_its_advice_once(tiny_model):
    path = tiny_model("llama", Q.TQ2_0, dim=256, ffn_dim=256)    # ternary weights: no kernels of ours
    with pytest.raises(UnsupportedModelError) as e:
        Model(path)
    msg = str(e.value)
    assert str(path) in msg and "'token_embd.weight'" in msg and "TQ2_0" in msg
    assert msg.count("llama.cpp") == 1 and "--engine llamacpp" in msg and msg.count("token_embd") == 1


# ---- Numerics against llama.cpp --------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0, Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
def test_logits_match_llamacpp(tiny_model, llama_cpp, arch, qtype):
    path = tiny_model(arch, qtype)
    ref_prompt, ref_steps = llama_logits(llama_cpp, path, PROMPT, STEPS)
    model = Model(path)
    cache = model.new_cache(64)
    ours_prompt = prefill(model, cache, PROMPT, all_logits=True)       # (T, V)
    ours_steps = np.stack([decode_one_token(model, cache, t) for t in STEPS])
    assert ours_prompt.shape == ref_prompt.shape == (len(PROMPT), 2048)
    assert_logits_close(ours_prompt, ref_prompt, TOLERANCE[qtype])
    assert_logits_close(ours_steps, ref_steps, TOLERANCE[qtype])


# Every other weight format on a tiny model. The formats with super-blocks of 256 need
# D = F = 256 (head_dim 64). Random blocks stand in for the weights where gguf cannot quantize
# (tiny_gguf.py). Measured here: Q5_0 and Q5_1 logits bit-identical; the others within 3e-7 of
# the largest logit (float order), except where a last-bit difference flips the rounding of one
# 8-bit activation (IQ4_NL on qwen2: one prompt position at 7.3e-3). So the tolerance is that
# of the other quantized types; a wrong scale or bit in a kernel costs O(1).
OTHER_FORMATS_TOL = 3e-2
OTHER_FORMATS = [Q.Q5_0, Q.Q5_1, Q.IQ4_NL, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("qtype", OTHER_FORMATS, ids=lambda q: q.name)
def test_logits_of_every_weight_format_match_llamacpp(tiny_model, llama_cpp, arch, qtype):
    wide = {} if qtype in (Q.Q5_0, Q.Q5_1, Q.IQ4_NL) else {"dim": 256, "ffn_dim": 256}
    path = tiny_model(arch, qtype, **wide)
    ref_prompt, ref_steps = llama_logits(llama_cpp, path, PROMPT, STEPS)
    model = Model(path)
    assert model.layers[0].w_up.qtype == qtype
    cache = model.new_cache(64)
    assert_logits_close(prefill(model, cache, PROMPT, all_logits=True), ref_prompt, OTHER_FORMATS_TOL)
    assert_logits_close(np.stack([decode_one_token(model, cache, t) for t in STEPS]), ref_steps, OTHER_FORMATS_TOL)


@pytest.mark.parametrize("arch,scaling", [("llama", "linear"), ("qwen2", "yarn")])
def test_rope_scaling_matches_llamacpp(tiny_model, llama_cpp, arch, scaling):
    path = tiny_model(arch, Q.F32, rope_scaling=scaling, rope_factor=4.0, rope_orig_ctx=128)
    c = ModelConfig.from_gguf(gguf.GGUFReader(str(path)))
    assert c.rope_scaling == scaling and c.rope_freq_scale == 0.25
    assert c.rope_ext_factor == (1.0 if scaling == "yarn" else 0.0)
    ref_prompt, ref_steps = llama_logits(llama_cpp, path, PROMPT, STEPS)
    model = Model(path)
    cache = model.new_cache(64)
    assert_logits_close(prefill(model, cache, PROMPT, all_logits=True), ref_prompt, TOLERANCE[Q.F32])
    assert_logits_close(np.stack([decode_one_token(model, cache, t) for t in STEPS]), ref_steps, TOLERANCE[Q.F32])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1], ids=lambda q: q.name)
def test_bit_exact_with_llamacpp_matmul(tiny_model, llama_cpp, llamacpp_exact_matmul, arch, qtype):
    """Given llama.cpp's own matmul results, everything else (embedding, RMSNorm, RoPE,
    f16 KV cache, attention, softmax, SiLU, residuals) reproduces llama.cpp exactly, for a
    batched prefill and for single-token decode steps."""
    path = tiny_model(arch, qtype)
    ref_prompt, ref_steps = llama_logits(llama_cpp, path, PROMPT, STEPS)
    model = Model(path)
    cache = model.new_cache(64)
    ours_prompt = prefill(model, cache, PROMPT, all_logits=True)
    ours_steps = np.stack([decode_one_token(model, cache, t) for t in STEPS])
    np.testing.assert_array_equal(ours_prompt, ref_prompt)
    np.testing.assert_array_equal(ours_steps, ref_steps)



@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_k_quant_logits_are_bit_exact_with_llamacpp(tiny_model, llama_cpp, arch, qtype):
    """Q4_K and Q6_K, the formats of a Q4_K_M file, on an AVX2 machine: the same logits as
    llama.cpp bit for bit, for a prompt in one batch (llama.cpp: Q4_K through its 8-row
    repacked gemm, Q6_K through vec_dot) and for single-token decode steps (its gemv). Every
    row count is a multiple of 8, as llama.cpp needs to repack (real models' are). The same
    against a llama.cpp built with AVX-512 on a CPU that has it (its attention sums in 16 lanes
    and its exp takes the AVX-512 form there, and so do eLLM's). Against a build for another
    CPU, or with AMX, whose kernels sum in another order, the logits agree to float rounding;
    where eLLM's batches take AMX (quant/kquants_amx.py: every token of a batch gets its gemv
    bits, the bits it gets alone) a last-bit difference can flip the 8-bit rounding of one
    activation (measured: 0.029 at one of 20 positions, logits up to 274, 1.1e-4 of the
    largest; every other position within 6e-5)."""
    from app.engine.ops.amx import HAS_AMX
    from app.engine.ops.simd_int import HAS_AVX2
    if not HAS_AVX2:
        pytest.skip("the bit-exact kernels are those of llama.cpp's AVX2 build")
    path = tiny_model(arch, qtype, dim=256, ffn_dim=512)
    ref_prompt, ref_steps = llama_logits(llama_cpp, path, PROMPT, STEPS)
    model = Model(path)
    assert model.layers[0].w_up.qtype == qtype
    cache = model.new_cache(64)
    ours_prompt = prefill(model, cache, PROMPT, all_logits=True)
    ours_steps = np.stack([decode_one_token(model, cache, t) for t in STEPS])
    amx_batches = HAS_AMX and qtype == Q.Q4_K       # the prompt (20 tokens) on eLLM's AMX path
    if llamacpp_built_for_this_cpu(llama_cpp) and not amx_batches:
        np.testing.assert_array_equal(ours_prompt, ref_prompt)
        np.testing.assert_array_equal(ours_steps, ref_steps)
    else:
        assert_logits_close(ours_prompt, ref_prompt, 2e-4 if amx_batches else 1e-5)
        assert_logits_close(ours_steps, ref_steps, 1e-5)

# ---- Chunking and the KV cache ------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_chunked_prefill_equals_token_by_token(tiny_model, arch):
    model = Model(tiny_model(arch, Q.F32))
    chunked = prefill(model, model.new_cache(64), PROMPT, chunk=7, all_logits=True)   # 7 + 7 + 6
    cache = model.new_cache(64)
    one_by_one = np.stack([decode_one_token(model, cache, t) for t in PROMPT])
    assert cache.n_tokens == len(PROMPT) and cache.tokens == PROMPT
    assert_logits_close(chunked, one_by_one, 1e-5)
    whole = prefill(model, model.new_cache(64), PROMPT, all_logits=True)
    np.testing.assert_array_equal(whole[:7], chunked[:7])   # the first chunk sees the same inputs


def test_prefix_reuse_prefills_only_the_new_tokens(tiny_model):
    model = Model(tiny_model("llama", Q.F32))
    cache = model.new_cache(64)
    prefill(model, cache, PROMPT[:12])
    logits, reused = prefill_reusing_prefix(model, cache, PROMPT)
    assert reused == 12 and cache.tokens == PROMPT
    fresh = prefill(model, model.new_cache(64), PROMPT)
    assert_logits_close(logits, fresh, 1e-5)
    # a prompt that diverges at token 5 keeps only the first 5 cached tokens
    other = PROMPT[:5] + [1, 2, 3]
    _, reused = prefill_reusing_prefix(model, cache, other)
    assert reused == 5 and cache.tokens == other
    # the same prompt again recomputes only its last token
    _, reused = prefill_reusing_prefix(model, cache, other)
    assert reused == len(other) - 1


def test_context_overflow_is_an_error(tiny_model):
    model = Model(tiny_model("llama", Q.F32))
    cache = model.new_cache(8)
    prefill(model, cache, PROMPT[:8])
    with pytest.raises(ValueError, match="n_ctx 8"):
        decode_one_token(model, cache, 5)


def test_weights_stay_quantized(tiny_model):
    path = tiny_model("llama", Q.Q4_0)
    model = Model(path)
    assert model.layers[0].w_gate.qtype == Q.Q4_0
    assert model.output is model.tok_embd  # tied: one matrix, not two
    # 2-D weights: the bytes of the file, not an f32 copy (norms are f32 views of the file)
    assert model.weight_bytes < path.stat().st_size
    assert model.layers[0].attn_norm.base is not None


# ---- Attention and scalar numerics ------------------------------------------------------------


class _Cache:
    def __init__(self, k, v):
        self.k_bits, self.v_bits = k.view(np.uint16), v.view(np.uint16)


@pytest.mark.parametrize("n_q,pos0", [(1, 0), (1, 37), (5, 0), (9, 30)])
def test_attention_matches_numpy_reference(n_q, pos0):
    rng = np.random.default_rng(n_q * 100 + pos0)
    n_layers, kvh, n_ctx, hd, h = 2, 2, 48, 32, 6
    k = (2 * rng.standard_normal((n_layers, kvh, n_ctx, hd))).astype(np.float16)  # (L, KVH, C, HD)
    v = rng.standard_normal((n_layers, kvh, n_ctx, hd)).astype(np.float16)
    q = (2 * rng.standard_normal((n_q, h, hd))).astype(np.float32)                # (T, H, HD)
    out = attend(q, _Cache(k, v), 1, pos0)
    ref = attend_reference(q, k[1], v[1], pos0)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=2e-5)
    # causal: what lies after the last query's position does not matter
    k2, v2 = k.copy(), v.copy()
    k2[:, :, pos0 + n_q:] = 100
    v2[:, :, pos0 + n_q:] = -100
    np.testing.assert_array_equal(attend(q, _Cache(k2, v2), 1, pos0), out)


@pytest.mark.parametrize("h,kvh,hd,pos0,window,threads", [
    (12, 2, 128, 700, 0, 2),    # Qwen2.5-1.5B's heads: a whole GQA group per work item
    (4, 1, 64, 1200, 0, 2),     # one KV head: its group split in two for the threads
    (4, 1, 64, 1200, 512, 1),   # a sliding-window layer (gemma3)
    (8, 8, 32, 2100, 0, 2),     # no GQA
    (9, 3, 64, 333, 0, 1),      # SmolLM2's heads: groups of 3, a pair of heads and one alone
    (14, 2, 64, 450, 0, 2),     # Qwen2.5-0.5B's: groups of 7
])
def test_decode_attention_by_groups_equals_the_per_head_kernel(h, kvh, hd, pos0, window, threads):
    """One query token takes the grouped kernel (keys read once per GQA group, value sums
    kept per lane); it must give the per-head kernel's bits, which follow llama.cpp's."""
    from app.engine.attention import dense, dense_groups
    rng = np.random.default_rng(pos0 + h)
    n_ctx = pos0 + 3
    k = (2 * rng.standard_normal((2, kvh, n_ctx, hd))).astype(np.float16)  # (L, KVH, C, HD)
    v = rng.standard_normal((2, kvh, n_ctx, hd)).astype(np.float16)
    q = (2 * rng.standard_normal((1, h, hd))).astype(np.float32)            # (1, H, HD)
    assert h * hd * min(pos0 + 1, window or n_ctx) >= dense.PARALLEL_MIN_WORK  # the grouped path
    per_item = dense_groups.heads_per_item(h, kvh, threads)
    assert (per_item == h // kvh) == (h // kvh * threads <= h)
    grouped = np.empty_like(q)
    dense_groups.attend_one(q, k.view(np.uint16), v.view(np.uint16), 1, pos0, np.float32(hd ** -0.5),
                            window, per_item, grouped)
    per_head = np.empty_like(q)
    dense._attend_serial(q, k.view(np.uint16), v.view(np.uint16), 1, pos0, np.float32(hd ** -0.5), window,
                         per_head)
    np.testing.assert_array_equal(grouped, per_head)
    np.testing.assert_array_equal(attend(q, _Cache(k, v), 1, pos0, window=window), per_head)
    # numpy's score sums differ in the last bits, and rounding the probabilities to f16 turns that
    # into an f16 step (2**-11) now and then over a thousand keys
    np.testing.assert_allclose(grouped, attend_reference(q, k[1], v[1], pos0, window=window), rtol=3e-3, atol=1e-3)


@pytest.mark.parametrize("n_group,n_kv", [(6, 1100), (3, 64), (1, 70), (7, 5)])
def test_decode_value_sums_keep_each_lanes_order_in_both_widths(n_group, n_kv):
    """The decode kernel's value sums, in 8- and 16-lane registers alike: lane l of head g is the
    chain of FMAs over rows l, l + L, ... in order (ggml_vec_dot_f16's partial sums over the cells),
    against a float32 model of that chain -- over whole passes, a short last pass, and rows fewer
    than one per lane."""
    from numba import njit
    from app.engine.attention import dense_groups
    from app.engine.attention.ggml_lanes import F16_STEP
    rng = np.random.default_rng(n_kv)
    hd = 48 if n_group == 3 else 64      # 48: three 16-lane chunks
    v = rng.standard_normal((n_kv + 3, hd)).astype(np.float16)             # (C, HD)
    p = rng.random((n_group, n_kv + 3)).astype(np.float16).astype(np.float32)  # (G, >= n_kv)
    want = np.zeros((n_group, F16_STEP, hd), np.float32)                  # (G, L, HD)
    vf = v.astype(np.float32)
    for j in range(n_kv):   # lane j % L: one more FMA of its chain
        want[:, j % F16_STEP] = _fma32(vf[j], p[:, j:j + 1], want[:, j % F16_STEP])
    for kernel in (dense_groups._values_group8, dense_groups._values_group16):
        run = njit(lambda p, v, n, acc, k=kernel: k(p, v, n, acc))
        acc = np.full((n_group, F16_STEP, hd), np.nan, np.float32)
        run(p, v.view(np.uint16), n_kv, acc)
        np.testing.assert_array_equal(acc, want)


@pytest.mark.parametrize("n_q,h,kvh,hd,pos0", [
    (37, 12, 2, 128, 0),      # Qwen2.5-1.5B's heads, a chunk from the start: tiles cross tokens
    (21, 12, 2, 128, 300),    # a later chunk; the last tile is partly empty
    (30, 12, 2, 128, 700),    # a question after a document: 3 groups of tiles, 6 blocks of keys
    (64, 4, 4, 64, 100),      # a group's tiles end on both sides of key 128: some skip a block
    (9, 4, 1, 64, 1000),      # groups of 4: two tokens a tile
    (5, 6, 6, 32, 77),        # no GQA
    (3, 15, 5, 64, 10),       # groups of 3 (8 is not a multiple)
])
def test_prefill_attention_by_tiles_equals_the_per_head_kernel(n_q, h, kvh, hd, pos0):
    """Two or more query tokens take the tiled kernel (8 query vectors of one KV head share each
    key and value row; a key past a token's own position gets probability 0); it must give the
    per-head kernel's bits (tinyBLAS's lanes, as llama.cpp's prefill)."""
    from app.engine.attention import dense, dense_groups
    rng = np.random.default_rng(n_q * 7 + pos0)
    n_ctx = pos0 + n_q + 5
    k = (2 * rng.standard_normal((2, kvh, n_ctx, hd))).astype(np.float16)  # (L, KVH, C, HD)
    v = rng.standard_normal((2, kvh, n_ctx, hd)).astype(np.float16)
    k[:, :, pos0 + n_q:] = 60                                               # never attended
    q = (2 * rng.standard_normal((n_q, h, hd))).astype(np.float32)          # (T, H, HD)
    tiled = np.empty_like(q)
    dense_groups.attend_batch(q, k.view(np.uint16), v.view(np.uint16), 1, pos0, np.float32(hd ** -0.5), tiled)
    per_head = np.empty_like(q)
    dense._attend_serial(q, k.view(np.uint16), v.view(np.uint16), 1, pos0, np.float32(hd ** -0.5), 0, per_head)
    np.testing.assert_array_equal(tiled, per_head)
    if n_q * h * hd * (pos0 + n_q) >= dense.PARALLEL_MIN_WORK:
        np.testing.assert_array_equal(attend(q, _Cache(k, v), 1, pos0), per_head)


def test_ggml_expf_is_a_faithful_exp():
    from numba import njit

    @njit
    def exp_all(x):
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = ggml_expf(x[i])
        return out

    x = np.concatenate([np.linspace(-87, 88, 20001), [0.0, -0.0, -103.0, -150.0, -1e4]]).astype(np.float32)
    y = exp_all(x)
    ref = np.exp(x.astype(np.float64))
    finite = ref > 1e-37
    assert np.all(np.abs(y[finite] / ref[finite] - 1) < 4e-7)   # within ~3 ulp
    assert y[x == 0].tolist() == [1.0, 1.0] and y[-1] == 0.0 and y[-2] < 1e-44


def _fma32(a, b, c):
    """float32 fma(a, b, c) in numpy: the product exact in 80-bit long double, one more rounding
    there, then to float32 (a second rounding lands on a float32 tie about once in 2**40)."""
    ld = np.longdouble
    return (ld(a) * ld(b) + ld(c)).astype(np.float32)


def test_both_forms_of_ggml_expf_are_ggmls_formulas_and_differ_in_the_last_bit():
    """vec.h has two ggml_v_expf: the AVX2 one ends with fma(j, 2^n, 2^n), the AVX-512 one adds
    the 1 inside its polynomial and scales by 2^n in one rounding (_mm512_scalef_ps). A
    llama.cpp built for a CPU with AVX-512 takes the second in softmax and SiLU, and so does
    eLLM there (ops/expf.py AVX512_EXPF). Each form, one lane and eight, against the formula in
    numpy; they differ in the last bit for about a quarter of inputs, which is why the choice matters."""
    from numba import njit

    from app.engine.ops.expf import expf8_avx2, expf8_avx512, expf_avx2, expf_avx512
    from app.engine.ops.simd import load8, store8

    @njit
    def run(x):
        out = np.empty((4, x.shape[0]), np.float32)
        for i in range(x.shape[0]):
            out[0, i] = expf_avx2(x[i])
            out[1, i] = expf_avx512(x[i])
        for i in range(0, x.shape[0], 8):
            store8(expf8_avx2(load8(x, i)), out[2], i)
            store8(expf8_avx512(load8(x, i)), out[3], i)
        return out

    x = np.linspace(-100, 88, 20000).astype(np.float32)
    avx2, avx512, avx2_8, avx512_8 = run(x)
    np.testing.assert_array_equal(avx2_8, avx2)
    np.testing.assert_array_equal(avx512_8, avx512)
    f = np.float32
    z = _fma32(x, f(float.fromhex("0x1.715476p+0")), f(float.fromhex("0x1.8p23")))
    n = (z - f(float.fromhex("0x1.8p23"))).astype(np.float32)
    b = _fma32(-n, f(float.fromhex("0x1.7f7d1cp-20")), _fma32(-n, f(float.fromhex("0x1.62e4p-1")), x))
    u = (b * b).astype(np.float32)
    poly = _fma32(_fma32(f(float.fromhex("0x1.0e4020p-7")), b, f(float.fromhex("0x1.573e2ep-5"))), u,
                  _fma32(f(float.fromhex("0x1.555e66p-3")), b, f(float.fromhex("0x1.fffdb6p-2"))))
    j = _fma32(poly, u, _fma32(f(float.fromhex("0x1.ffffecp-1")), b, f(1.0)))
    scalef = np.ldexp(j.astype(np.float64), n.astype(np.int64)).astype(np.float32)   # one rounding
    np.testing.assert_array_equal(avx512, scalef)
    near = np.abs(n) <= 126
    j2 = _fma32(poly, u, (f(float.fromhex("0x1.ffffecp-1")) * b).astype(np.float32))
    k = np.ldexp(np.float32(1), n.astype(np.int64)).astype(np.float32)
    np.testing.assert_array_equal(avx2[near], _fma32(j2, k, k)[near])
    assert 0 < np.count_nonzero(avx2 != avx512) < len(x) // 2   # measured: 26 % of these inputs


def test_f16_conversions_round_like_numpy():
    from numba import njit

    @njit
    def round_trip(x, bits):
        for i in range(x.shape[0]):
            bits[i] = f32_to_f16(x[i])
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = f16_to_f32(bits[i])
        return out

    rng = np.random.default_rng(3)
    x = (rng.standard_normal(20000) * np.exp(rng.uniform(-20, 11, 20000))).astype(np.float32)
    bits = np.empty(x.shape, np.uint16)
    back = round_trip(x, bits)
    with np.errstate(over="ignore"):  # the largest values overflow to inf in both
        half = x.astype(np.float16)
    np.testing.assert_array_equal(bits, half.view(np.uint16))
    np.testing.assert_array_equal(back, half.astype(np.float32))


def test_rope_tables_follow_ggml(tiny_model):
    """theta = p * theta_scale^i by repeated f32 multiplication (ggml_rope_cache_init)."""
    model = Model(tiny_model("llama", Q.F32))
    cos, sin = model.rope.rows(0, 300)
    hd = model.config.head_dim
    theta_scale = np.float32(math.pow(10000.0, -2.0 / hd))
    theta = np.arange(300, dtype=np.float32)
    for i in range(hd // 2):
        np.testing.assert_allclose(cos[:, i], np.cos(theta.astype(np.float64)), atol=2e-7)
        np.testing.assert_allclose(sin[:, i], np.sin(theta.astype(np.float64)), atol=2e-7)
        theta = theta * theta_scale


def test_kv_cache_update_and_truncate():
    from app.engine.header.model_config import ModelConfig as MC
    c = MC(arch="llama", n_layers=2, dim=32, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64,
           vocab_size=10, context_length=16, rms_eps=1e-6, rope_type=ROPE_NORMAL)
    cache = KVCache(c, 16)
    k = np.arange(3 * 2 * 8, dtype=np.float32).reshape(3, 2 * 8) / 7   # (T, KVH*HD)
    cache.update(1, 4, k, -k)
    cache.commit([1, 2, 3])
    heads = k.reshape(3, 2, 8).transpose(1, 0, 2)                      # (KVH, T, HD)
    np.testing.assert_array_equal(cache.k[1, :, 4:7], heads.astype(np.float16))
    np.testing.assert_array_equal(cache.v[1, :, 4:7], (-heads).astype(np.float16))
    assert not cache.k[0].any() and not cache.k[1, :, :4].any()
    assert cache.common_prefix([1, 2, 9]) == 2
    cache.truncate(1)
    assert cache.tokens == [1]
    with pytest.raises(ValueError):
        cache.update(0, 15, k, k)
