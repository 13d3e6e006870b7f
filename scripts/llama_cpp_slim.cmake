# Included right after llama.cpp's own project() call (scripts/_setup.sh
# passes it as CMAKE_PROJECT_llama.cpp_INCLUDE). llama-cpp-python forces
# LLAMA_BUILD_COMMON on with a cache FORCE, which no -D can undo, yet its
# Python code loads only libllama and ggml: llama-common (the CLI tools'
# argument parser, chat parsers, Jinja engine and HTTP client) is compiled,
# installed outside the package, and never loaded. A normal variable shadows
# the forced cache entry, and llama.cpp's option() (policy CMP0077) keeps it.
set(LLAMA_BUILD_COMMON OFF)

# Patches to ggml's CPU kernels, each checked: the build stops if its anchor
# is not found, so a new llama.cpp cannot drop one silently. They are applied
# once to the source tree (a rebuild finds them in place). OLD_VAR and NEW_VAR
# name variables, so C++ text passes through unparsed.
function(_llmctl_patch old_var new_var what)
  string(FIND "${_llmctl_src}" "${${old_var}}" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "llmctl: ${what} not found in ${_llmctl_file}")
  endif()
  string(REPLACE "${${old_var}}" "${${new_var}}" _out "${_llmctl_src}")
  set(_llmctl_src "${_out}" PARENT_SCOPE)
endfunction()

# Flash attention.
set(_llmctl_fa "${CMAKE_CURRENT_SOURCE_DIR}/ggml/src/ggml-cpu/ops.cpp")
set(_llmctl_file "${_llmctl_fa}")
file(READ "${_llmctl_fa}" _llmctl_src)
string(FIND "${_llmctl_src}" "llmctl:" _llmctl_done)
if(_llmctl_done EQUAL -1)
  # Batch invariance (docs/exactness.md): with two or more threads, ggml's
  # CPU flash attention gives a lone decode row over 512+ KV cells a
  # split-KV kernel, which sums the softmax in per-thread pieces, while the
  # same row beside other rows takes the per-row kernel. So a greedy answer
  # could depend on what else the server ran in its step. llmctl turns the
  # split path off; the per-row kernel already spreads a step's heads over
  # the threads, which on a few cores costs nothing measurable
  # (measurements.md, "Batch invariance").
  set(_old "q->type == GGML_TYPE_F32 && nek1 >= 512;")
  set(_new "q->type == GGML_TYPE_F32 && nek1 >= 512 && false /* llmctl: batch-invariant */;")
  _llmctl_patch(_old _new "flash attention's split-KV condition")

  # llmctl's kernel, batch-invariant and fast (llama_cpp_fa_rows.h says why
  # and how): its code goes in ahead of ggml's, which calls it per row.
  file(READ "${CMAKE_CURRENT_LIST_DIR}/llama_cpp_fa_rows.h" _code)
  set(_old "static void ggml_compute_forward_flash_attn_ext_f16_one_chunk(")
  set(_new "${_code}\n${_old}")
  _llmctl_patch(_old _new "the per-row flash-attention kernel")
  # ...whose vector operations go where it includes them.
  file(READ "${CMAKE_CURRENT_LIST_DIR}/llama_cpp_fa_simd.h" _new)
  set(_old "#include \"llama_cpp_fa_simd.h\"")
  _llmctl_patch(_old _new "llama_cpp_fa_rows.h's include of its vector operations")
  set(_old "    int ith = params->ith;\n\n    for (int ir = ir0; ir < ir1; ++ir) {\n        // q indices\n")
  set(_new "    int ith = params->ith;

    // llmctl: rows computed ahead in groups of one head (llama_cpp_fa_rows.h).
    const bool llmctl_rows = ic_start == 0 &&
        llmctl_fa_rows_ok(q, k, v, sinks, DK, DV, write_partials);
    int llmctl_lo = 0, llmctl_hi = 0;
    // Its scratch follows ggml's per-thread rows; ggml-cpu.c's plan adds it.
    const size_t llmctl_floats = llmctl_fa_floats(DK, DV) + CACHE_LINE_SIZE_F32;
    float * llmctl_work = (float *) params->wdata + params->nth*(1*DK + 2*DV + CACHE_LINE_SIZE_F32)
        + ith*llmctl_floats;
    float * llmctl_out = llmctl_work + llmctl_floats - CACHE_LINE_SIZE_F32 - LLMCTL_FA_GROUP*(DV + 2);
    GGML_ASSERT(!llmctl_rows || params->wsize >= sizeof(float)*params->nth*
        (1*DK + 2*DV + CACHE_LINE_SIZE_F32 + llmctl_floats));

    for (int ir = ir0; ir < ir1; ++ir) {
        // q indices
")
  _llmctl_patch(_old _new "the per-row kernel's loop over its rows")
  set(_old "        for (int64_t ic = ic_start; ic < ic_end; ++ic) {")
  set(_new "        if (llmctl_rows) {
            if (ir >= llmctl_hi) {
                const float * qs[LLMCTL_FA_GROUP];
                const ggml_fp16_t * ms[LLMCTL_FA_GROUP];
                float slopes[LLMCTL_FA_GROUP];
                const int n = llmctl_fa_gather(q, k, v, mask, ir, ir1, max_bias, m0, m1,
                                               n_head_log2, qs, ms, slopes);
                llmctl_lo = ir;
                llmctl_hi = ir + n;
                llmctl_fa_group(qs, ms, slopes, n, (const char *) k->data + ik2*nbk2 + ik3*nbk3,
                                nbk1, (const char *) v->data + iv2*nbv2 + iv3*nbv3, nbv1, DK, DV,
                                ic_end, scale, logit_softcap, llmctl_work, llmctl_out);
            }
            const float * st = llmctl_out + (ir - llmctl_lo)*(DV + 2);
            M = st[0];
            S = st[1];
            memcpy(VKQ32, st + 2, DV*sizeof(float));
        }
        for (int64_t ic = llmctl_rows ? ic_end : ic_start; ic < ic_end; ++ic) {")
  _llmctl_patch(_old _new "the per-row kernel's loop over the KV")
  set(_old "                VKQ32[d] = GGML_CPU_FP16_TO_FP32(VKQ16[d]);")
  set(_new "                if (!llmctl_rows) VKQ32[d] = GGML_CPU_FP16_TO_FP32(VKQ16[d]);")
  _llmctl_patch(_old _new "the per-row kernel's f16 accumulator")
  # In the dispatcher, where the kernel applies: a chunk of the threads'
  # work holds all the rows that read one KV head where they are few (a
  # decode step's heads under grouped-query attention), so that the kernel
  # reads that KV once for them...
  set(_old "        const int64_t dr = (nr + nchunk - 1) / nchunk;")
  set(_new "        int64_t dr = (nr + nchunk - 1) / nchunk;
        const bool llmctl_rows = llmctl_fa_rows_ok(q, k, v, dst->src[4], DK, DV, false);
        const int64_t llmctl_per_kv = neq1*(neq2/nek2);
        if (llmctl_rows && llmctl_per_kv <= LLMCTL_FA_GROUP && nr/llmctl_per_kv >= nth) {
            dr = llmctl_per_kv;
            nchunk = (nr + dr - 1)/dr;
        }")
  _llmctl_patch(_old _new "flash attention's rows per chunk")
  # ...and it takes every chunk, 64+ rows too, which ggml gives its tiled
  # kernel: the two round differently, so a prompt's rows would depend on
  # how it was cut (a prefix-cache hit, a step's token budget).
  set(_old "                                neq1 >= Q_TILE_SZ);")
  set(_new "                                neq1 >= Q_TILE_SZ && !llmctl_rows);")
  _llmctl_patch(_old _new "flash attention's tiled-kernel condition")
  file(WRITE "${_llmctl_fa}" "${_llmctl_src}")
endif()

# The kernel's scratch in the graph plan: per thread, llmctl_fa_floats(DK,
# DV) of llama_cpp_fa_rows.h and a cache line (ops.cpp asserts it is there),
# with the header's block and group sizes read from it.
set(_llmctl_plan "${CMAKE_CURRENT_SOURCE_DIR}/ggml/src/ggml-cpu/ggml-cpu.c")
set(_llmctl_file "${_llmctl_plan}")
file(READ "${_llmctl_plan}" _llmctl_src)
string(FIND "${_llmctl_src}" "llmctl:" _llmctl_done)
if(_llmctl_done EQUAL -1)
  file(READ "${CMAKE_CURRENT_LIST_DIR}/llama_cpp_fa_rows.h" _code)
  foreach(_name BLOCK GROUP)
    string(REGEX MATCH "\n#define LLMCTL_FA_${_name} ([0-9]+)\n" _at "${_code}")
    if(NOT _at)
      message(FATAL_ERROR "llmctl: LLMCTL_FA_${_name} not found in llama_cpp_fa_rows.h")
    endif()
    set(_fa_${_name} "${CMAKE_MATCH_1}")
  endforeach()
  set(_old "                        cur += MAX(prefill, decode);")
  set(_new "                        cur += MAX(prefill, decode);
                        // llmctl: the flash-attention kernel's scratch (llama_cpp_fa_rows.h)
                        cur += sizeof(float)*n_tasks*((DK + DV + ${_fa_GROUP} + 1)*${_fa_BLOCK} + ${_fa_GROUP}*(DV + 2) + CACHE_LINE_SIZE_F32);")
  _llmctl_patch(_old _new "flash attention's scratch in the plan")
  file(WRITE "${_llmctl_plan}" "${_llmctl_src}")
endif()

# Batch invariance for K-quant weights in their file's layout (the default's
# layout, docs/exactness.md): ggml's tiled matmul, which rounds the same in a
# call of any size, takes every row count, and llmctl's kernels compute
# Q4_K and Q6_K at 1-14 rows (llama_cpp_tiled_rows.h), or with AVX-512 VNNI
# at 1-7 and 8-64 (llama_cpp_tiled_lanes.h), faster than the one-row kernel
# and the tiles, rounding as the tiles do.
set(_llmctl_tiled "${CMAKE_CURRENT_SOURCE_DIR}/ggml/src/ggml-cpu/tiled/tiled.cpp")
set(_llmctl_file "${_llmctl_tiled}")
file(READ "${_llmctl_tiled}" _llmctl_src)
string(FIND "${_llmctl_src}" "llmctl:" _llmctl_done)
if(_llmctl_done EQUAL -1)
  file(READ "${CMAKE_CURRENT_LIST_DIR}/llama_cpp_tiled_lanes.h" _lanes)
  file(READ "${CMAKE_CURRENT_LIST_DIR}/llama_cpp_tiled_rows.h" _code)
  set(_code "${_lanes}\n${_code}")
  set(_old "template <typename B, int SUBBLK, bool HAS_MIN, int BIAS, bool ACTBIAS>
static void ggml_compute_forward_mul_mat_tiled_driver(")
  set(_new "${_code}\n${_old}")
  _llmctl_patch(_old _new "the tiled matmul's driver")
  set(_old "    ggml_barrier(params->threadpool);

    // This is the size of the first dimension of the result, so we can")
  set(_new "    ggml_barrier(params->threadpool);

    // llmctl: 1-64 rows of Q4_K and Q6_K through llama_cpp_tiled_rows.h.
    if (llmctl_tiled_rows<B>(params, dst,
            (src1->type == vec_dot_type) ? src1->data : params->wdata,
            (src1->type == vec_dot_type) ? (size_t) nb11 : ggml_row_size(vec_dot_type, ne10))) {
        return;
    }

    // This is the size of the first dimension of the result, so we can")
  _llmctl_patch(_old _new "the tiled matmul's start")
  set(_old "return rows >= 8 || ggml_tiled_matmul_forced();")
  set(_new "UNUSED(rows); return true; // llmctl: every row count, batch-invariant")
  _llmctl_patch(_old _new "the tiled matmul's row floor")
  file(WRITE "${_llmctl_tiled}" "${_llmctl_src}")
endif()

# Activations to Q8_K, every K-quant matmul's first step, in vectors on
# x86 where ggml converts one float at a time: byte for byte the scalar
# reference's output (llama_cpp_q8k.h; tests/test_kernels.py).
set(_llmctl_q8k "${CMAKE_CURRENT_SOURCE_DIR}/ggml/src/ggml-cpu/arch/x86/quants.c")
set(_llmctl_file "${_llmctl_q8k}")
file(READ "${_llmctl_q8k}" _llmctl_src)
string(FIND "${_llmctl_src}" "llmctl:" _llmctl_done)
if(_llmctl_done EQUAL -1)
  file(READ "${CMAKE_CURRENT_LIST_DIR}/llama_cpp_q8k.h" _new)
  set(_old "void quantize_row_q8_K(const float * GGML_RESTRICT x, void * GGML_RESTRICT y, int64_t k) {
    quantize_row_q8_K_ref(x, y, k);
}")
  _llmctl_patch(_old _new "x86 quantize_row_q8_K")
  file(WRITE "${_llmctl_q8k}" "${_llmctl_src}")
endif()
