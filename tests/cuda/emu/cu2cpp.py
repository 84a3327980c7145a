#!/usr/bin/env python3
"""Rewrites a CUDA source (src/cuda/*.cu) into C++ for the CPU emulator (tests/cuda/emu).

Only the two constructs that headers cannot express are touched, each within its own
lines, so line numbers stay those of the .cu file (a #line directive points back at it):

  name<<<grid, block[, smem[, stream]]>>>(args)
      -> emu::launch("name", name, emu::cfg(grid, block[, smem[, stream]])[, bound])(args)
         (bound: the kernel's __launch_bounds__ maximum when it is declared in the same file;
         a launch with more threads fails as on the GPU)
  cu_go(name, grid, block[, smem[, stream]])(args)   (cu_common.h's launch that can carry attributes)
      -> emu::go("name", name, bound, grid, block[, smem[, stream]])(args)   (bound 0: none)
  extern __shared__ T name[];
      -> T *name = (T *)emu::dyn_smem(sizeof(T));
  __shared__ [attrs] T a[..], b;   (static shared memory)
      -> static [attrs] T a[..], b; emu::shared(a, sizeof a); emu::shared(&b, sizeof b);
         (the emulator poisons it at the start of every block and counts its size)

usage: cu2cpp.py [--mutate NAME] in.cu out.cpp
--mutate applies one of the deliberate bugs below (for the test that shows the emulator
catches broken kernels) when in.cu is the mutant's file (cu_kernels.cu unless it names
another; other files are converted unchanged); the named pattern must occur exactly once."""
import re
import sys

# name -> (original text, broken text, what it breaks[, the file it applies to: cu_kernels.cu[, for a header,
# the unit that takes the broken header in place of its #include]])
MUTANTS = {
    "sort-one-batch": ("const int per = SORT_R * blockDim.x, one = n <= per;",
                       "const int per = SORT_R * blockDim.x, one = 1;",
                       "k_moe_sort's scatter reuses the first batch's experts for every batch of slots", "cu_moe.cu"),
    "rmsnorm-off-by-one": ("for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * w[i];",
                           "for (int i = threadIdx.x; i < n - 1; i += blockDim.x) yr[i] = xr[i] * r * w[i];",
                           "k_rmsnorm leaves the last element of each row unwritten"),
    "block-sum-no-sync": ("    if (lane == 0) sh[w] = v;\n    __syncthreads();\n",
                          "    if (lane == 0) sh[w] = v;\n",
                          "block_sum reads the per-warp partials without the barrier", "cu_kern.h", "cu_mvq.cu"),
    "warp-sum-half": ("for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);",
                      "for (int o = 8; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);",
                      "warp_sum adds only 16 of the 32 lanes", "cu_dev.h", "cu_matmul.cu"),
    "router-no-syncwarp": ("        if (lane == 0) p[bi] = -2.0f; /* taken */\n        __syncwarp();\n",
                           "        if (lane == 0) p[bi] = -2.0f; /* taken */\n",
                           "k_router_topk's lanes read the probabilities before lane 0 marks the expert taken", "cu_kern.h", "cu_moe.cu"),
    "route-regs-tie": ("            if (v[i] > bv) { bv = v[i]; bi = lane + WARP * i; }",
                       "            if (v[i] >= bv) { bv = v[i]; bi = lane + WARP * i; }",
                       "route_regs gives a tie within a lane to the higher expert id", "cu_dev.h", "cu_moe.cu"),
    "tf32-tile-b": ("wmma::load_matrix_sync(fb, Ws + (wr + 16 * f) * TLD + kk, TLD);",
                    "wmma::load_matrix_sync(fb, Ws + (wr + 15 * f) * TLD + kk, TLD);",
                    "k_mm_tiled's second B fragment starts one weight row early", "cu_matmul.cu"),
    "mvqb-row0": ("xv[t] = t < T ? xs[((size_t)t * nch + c) * 8 + ((j + c) & 7)]",
                  "xv[t] = t < T ? xs[((size_t)0 * nch + c) * 8 + ((j + c) & 7)]",
                  "k_mvqb multiplies the weights with the first input row for every row", "cu_mvq.cu"),
    "mvdpb-row0": ("xs + (size_t)(r < rmax ? r : 0) * ts);", "xs + (size_t)(r < rmax ? 0 : r) * ts);",
                   "k_mvdpb stages every input row into the first row's place (dp_stage_rows)", "cu_mvdp.h", "cu_mvdpb.cu"),
    "mvdpb-tile-stale": ("if (!PF) t = dp_locate<R, BITS>(a, false, 0, tile, mi, rpt, rib);",
                         "if (!PF && tile < 0) t = dp_locate<R, BITS>(a, false, 0, tile, mi, rpt, rib);",
                         "k_mvdpb (R 2) computes a warp's later tiles with its first tile's rows", "cu_mvdpb.cu"),
    "gsr-row-cnt": ("        cnt += (size_t)row * GDN_DEC_CNT;\n", "",
                    "the batch's split DeltaNet step shares one row's key-head counters among the rows", "cu_gdn.cu"),
    "gsr-row-s": ("        S = R.S[row] + R.S_off;\n        mixed += (size_t)row * (2 * kd + nv * dv);",
                  "        S = R.S[0] + R.S_off;\n        mixed += (size_t)row * (2 * kd + nv * dv);",
                  "the batch's split DeltaNet step runs every row on the first row's S", "cu_gdn.cu"),
    "dpt-gated-gw": ("if (a.f.gz) dp_ld8(a.f.gw, 8 * (threadIdx.x % 16), gw8);", "if (a.f.gz) dp_ld8(a.f.gw, 8 * (threadIdx.x % 8), gw8);",
                     "k_mvdpt's staged gated norm takes the first half of the head's weights for both halves", "cu_mvdpt.cu"),
    "dpt-kstep-b": ("tc_mma_u8s8(C[nb][lev], A[1][0], A[1][1], A[1][2], A[1][3], xv.z, xv.w);",
                    "tc_mma_u8s8(C[nb][lev], A[1][0], A[1][1], A[1][2], A[1][3], xv.x, xv.y);",
                    "k_mvdpt meets the second k step's codes with the first step's input bytes", "cu_mvdpt.cu"),
    "dpt-stale-batch": ("if (more) cur = nxt;", "if (more && k < 0) cur = nxt;",
                        "k_mvdpt sums a warp's first batch of codes again in place of each later one", "cu_mvdpt.cu"),
    "dpt-red-warps": ("for (int w = 0; w < NW; w++) y += red", "for (int w = 1; w < NW; w++) y += red",
                      "k_mvdpt leaves the first warp's partial sums out of a tile's outputs", "cu_mvdpt.cu"),
    "dpt-meta-row": ("const int n = 8 * nb + 2 * q + e;", "const int n = 8 * nb + 2 * q;",
                     "k_mvdpt scales both input rows of a lane's pair by the first one's unit and group sum", "cu_mvdpt.cu"),
    "rows-pos-first": ("p = R.pos ? R.pos[t] : *pos + t;",
                       "p = R.pos ? R.pos[0] : *pos + t;",
                       "a decode batch's RoPE and KV-cache write use the first row's position for every row", "cu_attn.cu"),
    "mvtc-column": ("const bool mine = g == 2 * q + h && u < nun;",
                    "const bool mine = g == 2 * q && u < nun;",
                    "k_mvtc's lanes put the input of both their units in the first unit's B column", "cu_mvtc.cu"),
    "gemm-tc-early": ("        if (NS == 2) cu_cp_wait<0>();\n",
                      "        if (NS == 2) cu_cp_wait<1>();\n",
                      "k_gemm_tc computes a step before its cp.async copies have landed", "cu_gemm_tc.cu"),
    "gemm-tc-nj": ("if (XP && BT == 32 && nj <= 2 && njv) gt_body",
                   "if (XP && BT == 32 && nj <= 3 && njv) gt_body",
                   "k_gemm_tc computes a 32-token tile of 17-24 tokens with two n-tiles, dropping the third", "cu_gemm_tc.cu"),
    "gdn-tc-early": ("        cu_cp_wait<0>();\n        __syncthreads(); /* Vn, k, P, sF and sX in; W, q and U free */\n",
                     "        __syncthreads(); /* Vn, k, P, sF and sX in; W, q and U free */\n",
                     "k_tq_state's state update reads k and P before their cp.async copies land", "cu_gdn_tc.cu"),
    "qk-fold-rope": ("        v[i + HW] = b * cs[i] + a * sn[i];",
                     "        v[i + HW] = b * cs[i] - a * sn[i];",
                     "decode attention's folded q/k prep rotates the second half of each pair the wrong way", "cu_attn.h", "cu_attn.cu"),
    "qk-fold-kw": ("        kw[i] = P.qg ? P.kn[lane + WARP * i] : 0.f;\n",
                   "        kw[i] = P.qg ? P.qn[lane + WARP * i] : 0.f;\n",
                   "decode attention's folded prep normalizes the new key with the q norm's weights (loaded before the wait)", "cu_attn.h", "cu_attn.cu"),
    "qk-fold-no-sync": ("    __syncthreads(); /* (the q heads, and the block's cache writes, seen by its threads past the barrier) */\n",
                        "",
                        "decode attention's folded prep: warps read the q heads and the new key before they are written", "cu_attn.h", "cu_attn.cu"),
    "dtc-p-lo": ("                    tc_mma(O[4 * jj + p], ad, ad1, ad, ad1, ph[u], pl[u]);",
                 "                    tc_mma(O[4 * jj + p], ad, ad1, ad, ad1, ph[u], 0u);",
                 "decode attention on the tensor cores drops the probabilities' low fp16 halves", "cu_attn_dtc.h", "cu_attn.cu"),
    "dtc-mask": ("                s[u][e] = jb + DT_STEP * u + 2 * qd + e < j1 ? v : -INFINITY;",
                 "                s[u][e] = v;",
                 "decode attention on the tensor cores counts the keys past its split (the last key again)", "cu_attn_dtc.h", "cu_attn.cu"),
    "mvq-add-row0": ("*ad = a.f.add + roff + c * 32 + j * 4;",
                     "*ad = a.f.add + c * 32 + j * 4;",
                     "a decode batch's router group adds the first row's mixer output to every row's residual", "cu_mvq.cu"),
    "xslot-row0": ("    int xr = xsl ? a.f.xrow + (slot - a.f.xslot) : slot / xdiv;\n",
                   "    int xr = xsl ? a.f.xrow : slot / xdiv;\n",
                   "every extra slot (a batch's tokens' shared expert) reads the first extra slot's input row", "cu_dev.h", "cu_mvdp.cu"),
    "dtc-join-warp": ("        for (int w = 0; w < W; w++) {\n            const float me",
                      "        for (int w = 0; w < W - 1; w++) {\n            const float me",
                      "decode attention on the tensor cores joins every warp's output but the last's", "cu_attn_dtc.h", "cu_attn.cu"),
    "dpc-rows-sel0": ("#define DPC_TK (ROWS ? (size_t)blockIdx.y * a.K : (size_t)0)",
                      "#define DPC_TK ((size_t)0)",
                      "k_mvdp_comb over a batch's rows takes the first token's experts and weights for every token", "cu_mvdp_comb.cu"),
    "rows-norm-r0": ("v[u][j] = v[u][j] * rr[r] * (n8 ? gw8[j] : f.nw[8 * w + j]);",
                     "v[u][j] = v[u][j] * rr[0] * (n8 ? gw8[j] : f.nw[8 * w + j]);",
                     "the rows kernels' staged norm scales every row by the first row's", "cu_mvdp.h", "cu_mvdpb.cu"),
    "dpc-no-sync": ("    if ((sub & (LPR / R - 1)) == 0 && rsel < t.nr) ys[slot][rib * R + rsel] = acc;\n    __syncthreads();\n",
                    "    if ((sub & (LPR / R - 1)) == 0 && rsel < t.nr) ys[slot][rib * R + rsel] = acc;\n",
                    "k_mvdp_comb sums the slots' rows before every warp has written its own", "cu_mvdp_comb.cu"),
    "dpc-slot-stage": ("dp_stage_warp(a.hg + hrow * I, a.hu + hrow * I, I, xs);",
                       "dp_stage_warp(a.hg, a.hu + hrow * I, I, xs);",
                       "k_mvdp_comb's warps all stage the first slot's gate outputs", "cu_mvdp_comb.cu"),
    "mvdp-row-sel": ("            if (up) sel += n / 2;\n",
                     "",
                     "k_mvdp writes each lane group's R rows' sums as if they were its first row's", "cu_mvdp.h", "cu_mvdp.cu"),
    "mvdp-stage-odd": ("const int sh = 8 * (j / 2), par = j & 1;",
                       "const int sh = 8 * (j / 2), par = 0;",
                       "k_mvdp's staging puts the odd columns' bytes into the even columns' words", "cu_mvdp.h", "cu_mvdp.cu"),
    "mvdp-q8-order": ("xn[h][lev][1] = __byte_perm(cu_word(v, 2 * h), cu_word(v, 2 * h + 1), 0x7362);",
                      "xn[h][lev][1] = __byte_perm(cu_word(v, 2 * h), cu_word(v, 2 * h + 1), 0x5140);",
                      "k_mvdp's 8-bit codes of columns 4-7 of a word meet the input of columns 0-3", "cu_mvdp.h", "cu_mvdp.cu"),
    "attn-merge-max": ("        for (int o = 16; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));\n",
                       "        for (int o = 8; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));\n",
                       "k_attn_merge's lanes take the maximum of half the warp's partials", "cu_attn.cu"),
    "attn-merge-w-warp": ("    for (int w = 0; w < AMW_WARPS; w++) {\n        const float f = sm[w]",
                          "    for (int w = 0; w < AMW_WARPS - 1; w++) {\n        const float f = sm[w]",
                          "k_attn_merge_w joins all warps' partials but the last's", "cu_attn.cu"),
    "mvdp-route-slot": ("            e = xsl ? 0 : rs[slot];\n        }\n    }\n    for (; tile",
                        "            e = xsl ? 0 : rs[0];\n        }\n    }\n    for (; tile",
                        "k_mvdp routing itself gives every slot the first chosen expert", "cu_mvdp.cu"),
    "mvdp-broute-slot": ("            e = xsl ? 0 : rs[slot % a.f.K];\n        } else {",
                         "            e = xsl ? 0 : rs[slot / a.f.K];\n        } else {",
                         "a decode batch's gate|up launch routing each token itself takes its slots' experts by token, not by rank",
                         "cu_mvdp.cu"),
    "gdn-dec-first": ("        last = atomicAdd(&cnt[kh], 1u) == (unsigned)ratio - 1;\n",
                      "        last = atomicAdd(&cnt[kh], 1u) == 0u;\n",
                      "k_gdn_dec128's first block of a key head writes its shared conv state, before the others read it", "cu_gdn.cu"),
    "argmax1-tie": ("(ov == bv && oi < bi))) { bv = ov; bi = oi; }\n    sum = s1 + s2;",
                    "(ov == bv && oi > bi))) { bv = ov; bi = oi; }\n    sum = s1 + s2;",
                    "k_argmax_part1's joins give a tie to the higher index"),
    "mvdp-g2-stale": ("        for (int i = 0; i < BITS / 2; i++) c[k][i] = c2[k][i];\n",
                      "        for (int i = 0; i < BITS / 2; i++) c[k][i] = c[k][i];\n        (void)c2;\n",
                      "k_mvdp's two-group form computes a lane's second group with the first group's codes", "cu_mvdp.h", "cu_mvdp.cu"),
    "wg-transpose": ("                wb[(4 * w + 1) * 64 + n] = make_uint4(M[0].y, M[1].y, M[2].y, M[3].y);",
                     "                wb[(4 * w + 1) * 64 + n] = make_uint4(M[0].y, M[2].y, M[1].y, M[3].y);",
                     "k_gemm_tc's wgmma form puts lanes 1 and 2's pair 1 in each other's place of wgmma's B", "cu_gemm_tc.cu"),
    "attn-h16-pair": ("    const int j0 = min(2 * jp, nk - 1), j1 = min(2 * jp + 1, nk - 1);",
                      "    const int j0 = min(2 * jp, nk - 1), j1 = min(2 * jp, nk - 1);",
                      "k_kv_h16 writes each key pair's first key twice", "cu_attn_tc.cu"),
    "gemm-sbup-step": ("            ss = sball + (size_t)k * sbb;\n",
                       "            ss = sball + (size_t)(k & ~1) * sbb;\n",
                       "k_gemm_tc's scales held for the whole block give every odd step the step before's", "cu_gemm_tc.cu"),
    "gdn-split-first": ("        last = ticket == (unsigned)(ratio * GDN_SPLIT) - 1;\n",
                        "        last = ticket == 0u;\n",
                        "k_gdn_dec_split's first block of a key head writes its shared conv state, before the others read it", "cu_gdn.cu"),
    "gdn-split-col": ("    if (p == 0) o[(size_t)h * dv + jj] = out;\n",
                      "    if (p == 0) o[(size_t)h * dv + j] = out;\n",
                      "k_gdn_dec_split writes every quarter's columns to the head's first quarter", "cu_gdn.cu"),
    "gated-half-head": ("    for (int o = 1; o < 16; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);\n",
                        "    for (int o = 1; o < 8; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);\n",
                        "the staged gated norm sums half a head", "cu_mvdp.h", "cu_mvdp.cu"),
    "mvdp-stage-pre2": ("        if (st < nw) dp_win_put(a.f, db, n0, wb, nw, xs);\n",
                        "        if (st < nw) dp_win_put(a.f, db, n0, wa, nw, xs);\n",
                        "k_mvdp's staging puts a thread's second preloaded word in its first word's place", "cu_mvdp.h", "cu_mvdp.cu"),
    "mvdp-gw-pre": ("        dp_ld8(a.f.gw, 8 * w % 128, n0);\n",
                    "        dp_ld8(a.f.gw, 8 * w % 64, n0);\n",
                    "k_mvdp's pre-wait gw of a thread's words comes from the wrong half of the head", "cu_mvdp.h", "cu_mvdp.cu"),
    "mvdp-raw-bias": ("            bi[k] = dp_sb_cvt<SBT>(br[k], psbt);\n",
                      "            bi[k] = dp_sb_cvt<SBT>(sr[k], psbt);\n",
                      "k_mvdp's pre-wait group takes its rows' scales for their biases", "cu_mvdp.cu"),
    "route-rdx-id": ("const unsigned gi = __reduce_min_sync(0xffffffffu, key == km ? (unsigned)bi : 0xffffffffu);",
                     "const unsigned gi = __reduce_min_sync(0xffffffffu, key != km ? (unsigned)bi : 0xffffffffu);",
                     "decode's routing warp takes the lowest id of the lanes not holding the largest probability",
                     "cu_dev.h", "cu_mvdp.cu"),
    "attn-adapt-merge": ("    const int i = blockIdx.y * WARP + lane; /* hd is a multiple of 32 */\n    const float *pp = part + (size_t)th * np * (hd + 2);\n    if (amin > 0) np = attn_splits_used(np, amin, *pos + 1);",
                         "    const int i = blockIdx.y * WARP + lane; /* hd is a multiple of 32 */\n    const float *pp = part + (size_t)th * np * (hd + 2);\n    if (amin > 0) np = attn_splits_used(np, amin, *pos + 2);",
                         "decode's wide merge counts the splits of one key more than the attention blocks used", "cu_attn.cu"),
    "rtr-stage-wait": ("        cu_cp_wait<RT_NS - 2>();\n        __syncthreads(); /* stage s in;",
                       "        cu_cp_wait<RT_NS - 1>();\n        __syncthreads(); /* stage s in;",
                       "k_rtr computes on a stage before its copies are waited for", "cu_router.cu"),
    "rtr-frag-order": ("make_float4(code(r, c), code(r + 8, c), code(r, c + 4), code(r + 8, c + 4));",
                       "make_float4(code(r, c), code(r, c + 4), code(r + 8, c), code(r + 8, c + 4));",
                       "the router's code copy swaps a1 and a2", "cu_router.cu"),
    "rtr-xs-half": ("            v += __shfl_xor_sync(0xffffffffu, v, 1);\n            float *xb",
                    "            float *xb",
                    "k_rtr's group sums of the inputs (the biases' factor) take half the columns", "cu_router.cu"),
    "attn-tc-causal": ("                if (j > mylim) S[n][c] = -INFINITY;",
                       "                if (j > mylim + 1) S[n][c] = -INFINITY;",
                       "k_attn_tc lets each query see the key after its own", "cu_attn_tc.cu"),
}

GO = re.compile(r"\bcu_go\(\s*([A-Za-z_]\w*(?:\s*<[^<>;()]*>)?)\s*,")
LAUNCH = re.compile(r"([A-Za-z_]\w*(?:\s*<[^<>;()]*>)?)\s*<<<(.*?)>>>", re.S)
DYN = re.compile(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w\s]*?)\s+([A-Za-z_]\w*)\s*\[\s*\]\s*;")
BOUNDS = re.compile(r"__launch_bounds__\(\s*([^,()]+?)\s*(?:,[^()]*)?\)\s*([A-Za-z_]\w*)\s*\(")
STATIC = re.compile(r"__shared__\s+((?:__align__\(\s*\d+\s*\)\s+)?)([A-Za-z_]\w*(?:\s+[A-Za-z_]\w*)*?)\s+([^;]*?);")


def split_top(s):
    """Splits declarators at commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [d.strip() for d in out if d.strip()]


def static_shared(m):
    attrs, typ, decls = m.group(1), m.group(2), m.group(3)
    regs = []
    for d in split_top(decls):
        name = re.match(r"[A-Za-z_]\w*", d).group(0)
        regs.append("emu::shared(&%s, sizeof %s);" % (name, name))
    return "static %s%s %s; %s" % (attrs, typ, decls, " ".join(regs))


def convert(text):
    bounds = {m.group(2): m.group(1) for m in BOUNDS.finditer(text)}

    def bound_of(name):  # the kernel's __launch_bounds__ maximum, or None
        return bounds.get(re.match(r"[A-Za-z_]\w*", name).group(0))

    def launch(m):
        name, cfg = m.group(1), m.group(2)
        bound = ", (%s)" % bound_of(name) if bound_of(name) else ""
        return 'emu::launch("%s", %s, emu::cfg(%s)%s)' % (re.sub(r"\s+", " ", name), name, cfg, bound)

    text = DYN.sub(lambda m: "%s *%s = (%s *)emu::dyn_smem(sizeof(%s));" % (m.group(1), m.group(2), m.group(1), m.group(1)), text)
    text = STATIC.sub(static_shared, text)
    text = LAUNCH.sub(launch, text)

    def go(m):
        name = m.group(1)
        return 'emu::go("%s", %s, (%s),' % (re.sub(r"\s+", " ", name), name, bound_of(name) or "0")

    text = GO.sub(go, text)
    return text


def main(argv):
    mut = None
    if len(argv) == 3 and argv[1] == "--target":  # the source a mutant changes, for the Makefile
        if argv[2] not in MUTANTS:
            sys.stderr.write("cu2cpp: unknown mutant %s\n" % argv[2])
            return 2
        m = MUTANTS[argv[2]]
        print((m[4] if len(m) > 4 else m[3] if len(m) > 3 else "cu_kernels.cu")[:-3])
        return 0
    if len(argv) > 1 and argv[1] == "--mutate":
        mut = argv[2]
        argv = [argv[0]] + argv[3:]
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    src, dst = argv[1], argv[2]
    with open(src) as f:
        text = f.read()
    if mut:
        if mut not in MUTANTS:
            sys.stderr.write("cu2cpp: unknown mutant %s (known: %s)\n" % (mut, ", ".join(MUTANTS)))
            return 2
        old, new = MUTANTS[mut][0], MUTANTS[mut][1]
        target = MUTANTS[mut][3] if len(MUTANTS[mut]) > 3 else "cu_kernels.cu"
        if target.endswith(".h"):
            # a header's mutant: the unit named fifth gets the broken header in place of its
            # #include (after conversion, as an include is not converted); its helpers are static,
            # so the other units keep their own copies
            unit = MUTANTS[mut][4]
            if src.split("/")[-1] == unit:
                hdr = open("/".join(src.split("/")[:-1] + [target])).read()
                if hdr.count(old) != 1:
                    sys.stderr.write("cu2cpp: mutant %s: pattern found %d times in %s\n" % (mut, hdr.count(old), target))
                    return 1
                inc = '#include "cuda/%s"' % target
                out = convert(text)
                if out.count(inc) != 1:
                    sys.stderr.write("cu2cpp: mutant %s: %s included %d times in %s\n" % (mut, target, out.count(inc), src))
                    return 1
                out = out.replace(inc, hdr.replace(old, new))
                with open(dst, "w") as f:
                    f.write('#line 1 "%s"\n' % src)
                    f.write(out)
                return 0
            old = None
        elif src.split("/")[-1] != target:
            old = None
        if old is not None and text.count(old) != 1:
            sys.stderr.write("cu2cpp: mutant %s: pattern found %d times in %s\n" % (mut, text.count(old), src))
            return 1
        if old is not None:
            text = text.replace(old, new)
    out = convert(text)
    if "<<<" in out or "__shared__" in out:
        bad = [i + 1 for i, l in enumerate(out.split("\n")) if "<<<" in l or "__shared__" in l]
        sys.stderr.write("cu2cpp: %s: unconverted launch or shared declaration at lines %s\n" % (src, bad))
        return 1
    with open(dst, "w") as f:
        f.write('#line 1 "%s"\n' % src)
        f.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
