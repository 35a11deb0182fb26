#!/usr/bin/env bash
# The owed GPU runs (benchmark/device_runs.md) as three calls of < 600 s on an nvidia-h200-x2
# machine: two lanes, one per GPU, each with its own time limit; results under $OUT, logs tarred.
#
#   device run (kind nvidia-h200-x2, carry .device):
#       source .device/prelude.sh && bash benchmark/device_session.sh 1     # then 2, then 3
#
# Merge the suite lanes afterwards (CPU): python3 benchmark/serving/suite.py --merge s-*.json --out suite.json
set -u
CALL=${1:?call number 1, 2 or 3}
LIMIT=${2:-560}  # seconds this call may take (calls 3, 10, 11)
OUT=${OUT:?set by the device tool}
LOGS=/tmp/logs
mkdir -p "$LOGS"
M=benchmark/models/tiny-hybrid
SUITE="python3 benchmark/serving/suite.py --model $M --log-dir $LOGS"
BENCH="python3 benchmark/serving/bench_spec.py --shape qwen3.5-27b-8l --log-dir $LOGS"
lane() {  # lane GPU SECONDS CMD...  (SIGINT first so pytest and the harness stop their servers)
    local gpu=$1 secs=$2; shift 2
    ( export CUDA_VISIBLE_DEVICES=$gpu LUMOTREE_TEST_PORT=$((30000 + 100 * gpu))
      timeout -s INT -k 30 "$secs" "$@" ) >> "$LOGS/lane$gpu.out" 2>&1
    echo "[lane $gpu] rc=$? $*" >> "$LOGS/lane$gpu.out"
    pkill -9 -f -- "launch_server.*--port $((30000 + 100 * gpu))" && echo "[lane $gpu] killed a leftover server" >> "$LOGS/lane$gpu.out"
    sleep 2
}
case $CALL in
1)  # the int32-offset fix and the served cross-check first; then parity + agent workloads
    ( lane 0 150 python3 -m pytest -q -m gpu test/ops/test_gdn_tree_gpu.py -k "2_31 or commit_layers"
      lane 0 200 python3 -m pytest -q -rA -m gpu test/sglang/test_served_crosscheck_gpu.py --basetemp=$LOGS/pt
      lane 0 $((560 - SECONDS)) $SUITE --configs none --out "$OUT/s-none.json" --port 30000 ) &
    ( lane 1 555 $SUITE --configs lumotree,nextn-tree --out "$OUT/s-lumotree.json" --port 30100 ) &
    wait ;;
2)  # the no-spec reference for call 1's lane 1 (whose lane 0 measured a leftover server), the served
    # cross-check with its logs, the fused step; LUMOTREE vs NEXTN topk 2 at 27B shapes
    ( lane 0 230 $SUITE --configs none --out "$OUT/s-none.json" --port 30000
      lane 0 150 python3 -m pytest -q -rA -x -m gpu test/sglang/test_served_crosscheck_gpu.py -k tree6 --basetemp=$LOGS/pt
      lane 0 $((470 - SECONDS)) python3 -m pytest -q -m gpu test/ops/test_gdn_tree_gpu.py -k fused_step ) &
    ( lane 1 470 $BENCH --configs lumotree-topk2,nextn-topk2 --batches 1,8,32 --out "$OUT/b-topk2.json" --port 30100 ) &
    wait ;;
3)  # the other baselines at 27B shapes, and controlled acceptance on both paths
    ( lane 0 $((LIMIT - 20)) $BENCH --configs none,nextn-topk4,lumotree-topk4 --batches 1,8,32 --out "$OUT/b-topk4.json" --port 30000 ) &
    ( lane 1 $((LIMIT / 2)) $BENCH --configs lumotree-oracle --oracle-p 0.7 --batches 1,8,32 --out "$OUT/b-oracle-lt.json" --port 30100
      lane 1 $((LIMIT - 20 - SECONDS)) $BENCH --configs ngram-oracle --oracle-p 0.7 --batches 1,8,32 \
          --out "$OUT/b-oracle-sg.json" --port 30100 ) &
    wait ;;
4)  # the no-spec reference again (call 2's hung after its abort step, now the last step), the fused step
    # test with the real-node comparison, the served cross-check, then the kernel bench of the served forms
    ( lane 0 295 $SUITE --configs none --out "$OUT/s-none.json" --port 30000 ) &
    ( lane 1 80 python3 -m pytest -q -m gpu test/ops/test_gdn_tree_gpu.py -k fused_step
      lane 1 120 python3 -m pytest -q -rA -m gpu test/sglang/test_served_crosscheck_gpu.py -k tree6 --basetemp=$LOGS/pt
      lane 1 $((295 - SECONDS)) python3 benchmark/kernels/bench_gdn_tree.py --models qwen3.5-27b \
          --trees topk2-depth3,eagle-16,eagle-64 --batches 8,32 --out "$OUT/gdn_tree_serving.json" ) &
    wait ;;
5)  # where LUMOTREE's served step loses to NEXTN's at small batch: a profile of both (tiny model, 27B
    # shapes), and LUMOTREE's own variants -- one-kernel verify, SGLang's acceptance -- on the tiny model
    # (the tf32 / mixed parity this call ran in session 5 is done)
    TINY="python3 benchmark/serving/bench_spec.py --model $M --log-dir $LOGS --mem-fraction-static 0.3 --batches 1,8"
    ( lane 0 260 $TINY --configs nextn-topk2,lumotree-topk2 --profile-dir /tmp/prof --out "$OUT/b-profile-tiny.json" --port 30000
      lane 0 $((420 - SECONDS)) $BENCH --configs nextn-topk2,lumotree-topk2 --batches 1 --profile-dir /tmp/prof \
          --profile-batches 1 --out "$OUT/b-profile.json" --port 30000
      lane 0 60 python3 benchmark/serving/profile_summary.py /tmp/prof --out "$OUT/profile_summary.json"
      tar -C /tmp -czf "$OUT/prof.tgz" prof ) &
    ( lane 1 500 $TINY --configs lumotree-topk2-chunk,lumotree-topk2-sgselect --profile-dir /tmp/prof1 \
          --out "$OUT/b-variants-tiny.json" --port 30100
      tar -C /tmp -czf "$OUT/prof1.tgz" prof1 ) &
    wait ;;
6)  # batch-invariant kernels: does NEXTN then match no-spec exactly, and LUMOTREE?
    ( lane 0 540 $SUITE --configs none,nextn-tree --parity-only --tag=-det --extra=--enable-deterministic-inference \
          --out "$OUT/s-det0.json" --port 30000 ) &
    ( lane 1 60 python3 -m pytest -q -m gpu test/drafters/test_tree_merge.py   # draft merge inside a CUDA graph
      lane 1 $((540 - SECONDS)) $SUITE --configs lumotree --parity-only --tag=-det --extra=--enable-deterministic-inference \
          --out "$OUT/s-det1.json" --port 30100 ) &
    wait ;;
7)  # 24 GDN layers (of 32) at 27B shapes: the GDN share of a step closer to the real model's
    ( lane 0 540 python3 benchmark/serving/bench_spec.py --shape qwen3.5-27b-32l --log-dir $LOGS \
          --configs nextn-topk2,none --batches 1,8,32 --out "$OUT/b32-sglang.json" --port 30000 ) &
    ( lane 1 540 python3 benchmark/serving/bench_spec.py --shape qwen3.5-27b-32l --log-dir $LOGS \
          --configs lumotree-topk2,lumotree-topk4 --batches 1,8,32 --out "$OUT/b32-lumotree.json" --port 30100 ) &
    wait ;;
8)  # the served verify in mixed precision (kernel bench column), the chain parity, the GPU tests
    ( lane 0 200 python3 benchmark/kernels/bench_gdn_tree.py --models qwen3.5-27b --trees topk2-depth3,topk4-n8,eagle-16 \
          --batches 8,32 --out "$OUT/gdn_tree_serving_mixed.json"
      lane 0 $((540 - SECONDS)) python3 -m pytest -q -m gpu test/ops test/drafters test/sglang/test_backend_emulation.py ) &
    ( lane 1 540 $SUITE --configs nextn-chain,lumotree-chain --parity-only --out "$OUT/s-chain.json" --port 30100 ) &
    wait ;;
9)  # MTP + suffix branches in one served tree (LUMOTREE_SUFFIX_MERGE=1, needs the synchronous scheduler),
    # against LUMOTREE on the same scheduler: parity, replay (accept length, tokens/s), agent loop
    ( lane 0 540 $SUITE --configs lumotree --tag=-merge --env LUMOTREE_SUFFIX_MERGE=1 \
          --extra=--disable-overlap-schedule --out "$OUT/s-merge.json" --port 30000 ) &
    ( lane 1 540 $SUITE --configs lumotree --tag=-sync --extra=--disable-overlap-schedule \
          --out "$OUT/s-sync.json" --port 30100 ) &
    wait ;;
10) # session 5: the split verify (two passes: WY algebra per request and head, then one dot per
    # state tile) -- kernel bench + its served parity; the GPU tests of everything changed since session 4
    ( lane 0 220 python3 benchmark/kernels/bench_gdn_tree.py --models qwen3.5-27b \
          --trees topk2-depth3,topk4-n8,eagle-16,eagle-64 --batches 8,32 --out "$OUT/gdn_tree_split.json"
      lane 0 $((LIMIT - SECONDS)) $SUITE --configs lumotree --parity-only --tag=-split \
          --env LUMOTREE_SGLANG_VERIFY=split --out "$OUT/s-split.json" --port 30000 ) &
    ( lane 1 $((LIMIT - 10)) python3 -m pytest -q -rf -m gpu test/ops test/drafters test/sglang/test_backend_emulation.py ) &
    wait ;;
11) # 24 GDN layers (of 32) at 27B shapes, SGLang's tree path vs LumoTree's (LT_CONFIGS); first, on GPU 0,
    # the split verify's passes timed apart and its pass-1 variants (kernel bench, ~150 s)
    BENCH32="python3 benchmark/serving/bench_spec.py --shape qwen3.5-27b-32l --log-dir $LOGS --output-len 256"
    ( lane 0 170 python3 benchmark/kernels/bench_gdn_tree.py --models qwen3.5-27b --trees topk2-depth3,eagle-16,eagle-64 \
          --batches 8,32 --out "$OUT/gdn_tree_split_passes.json"
      lane 0 $((LIMIT - 10 - SECONDS)) $BENCH32 --configs nextn-topk2,none --batches 1,8,32 --out "$OUT/b32-sglang.json" \
          --port 30000 ) &
    ( lane 1 $((LIMIT - 10)) $BENCH32 --configs "${LT_CONFIGS:-lumotree-topk2-split,lumotree-topk2-chunk}" --batches 1,8,32 \
          --out "$OUT/b32-lumotree.json" --port 30100 ) &
    wait ;;
12) # session 5: the suffix-drafted configurations served for the first time (#5): suffix only (no MTP),
    # and MTP + suffix merged in one tree (needs the synchronous scheduler); the merge's GPU tests first
    ( lane 0 $((LIMIT - 10)) $SUITE --configs lumotree-suffix --out "$OUT/s-suffix.json" --port 30000 ) &
    ( lane 1 60 python3 -m pytest -q -rf -m gpu test/drafters
      lane 1 $((LIMIT - 10 - SECONDS)) $SUITE --configs lumotree --tag=-merge --env LUMOTREE_SUFFIX_MERGE=1 \
          --extra=--disable-overlap-schedule --out "$OUT/s-merge.json" --port 30100 ) &
    wait ;;
13) # session 6: the mix verify -- kernel forms side by side (GPU 0) then its GPU tests; served at 24 GDN layers
    # (GPU 1): LUMOTREE mix at topk 2, then NEXTN vs LUMOTREE mix at topk 4
    BENCH32="python3 benchmark/serving/bench_spec.py --shape qwen3.5-27b-32l --log-dir $LOGS --output-len 256"
    ( lane 0 200 python3 benchmark/kernels/bench_verify_forms.py --out "$OUT/verify_forms.json"
      lane 0 $((LIMIT - 90 - SECONDS)) python3 -m pytest -q -rf -m gpu test/ops/test_gdn_tree_gpu.py \
          -k "(split_verify_matches and (eagle or random or chain)) or equals_sglang or (capture and (mix or split))"
      lane 0 $((LIMIT - 10 - SECONDS)) python3 -m pytest -q -rf -m gpu test/sglang/test_backend_emulation.py ) &
    ( lane 1 $((LIMIT - 10)) $BENCH32 --configs lumotree-topk2-mix,nextn-topk4,lumotree-topk4-mix --batches 1,8,32 \
          --out "$OUT/b32-mix.json" --port 30100 ) &
    wait ;;
14) # session 6: pass 2 transposed (o^T = h Q^T, the state tile on the MMA's M side) -- forms side by side and
    # GPU tests (GPU 0); served at 24 GDN layers, mix form, topk 4 and 2, then the mix form's parity (GPU 1)
    BENCH32="python3 benchmark/serving/bench_spec.py --shape qwen3.5-27b-32l --log-dir $LOGS --output-len 256"
    ( lane 0 200 python3 benchmark/kernels/bench_verify_forms.py --trees topk2-depth3,eagle-16,eagle-64 \
          --out "$OUT/verify_forms_t.json"
      lane 0 $((LIMIT - 10 - SECONDS)) python3 -m pytest -q -rf -m gpu test/ops/test_gdn_tree_gpu.py \
          -k "(split_verify_matches and eagle and bfloat16) or equals_sglang or (capture and (mix or split))" ) &
    ( lane 1 280 $BENCH32 --configs lumotree-topk4-mix,lumotree-topk2-mix --batches 1,8,32 --out "$OUT/b32-mix-t.json" \
          --port 30100
      lane 1 $((LIMIT - 10 - SECONDS)) $SUITE --configs lumotree --tag=-mix --env LUMOTREE_SGLANG_VERIFY=mix \
          --parity-only --out "$OUT/s-mix.json" --port 30100 ) &
    wait ;;
15) # session 7 (staged in session 6): the verify forms + both commit forms side by side, with variants (GPU 0),
    # then the GPU tests written in session 6 and not yet run; served at 24 GDN layers: the dot commit at
    # topk 4, then controlled acceptance (p 0.7) on LumoTree's path and SGLang's (GPU 1)
    BENCH32="python3 benchmark/serving/bench_spec.py --shape qwen3.5-27b-32l --log-dir $LOGS --output-len 256"
    ( lane 0 150 python3 benchmark/kernels/bench_verify_forms.py --trees topk2-depth3,topk4-n8,eagle-16,eagle-64 \
          --no-variants --out "$OUT/verify_forms.json"
      lane 0 180 python3 benchmark/kernels/bench_verify_forms.py --trees topk2-depth3,eagle-16,eagle-64 --batches 32 \
          --out "$OUT/verify_forms_variants.json"
      lane 0 $((LIMIT - 10 - SECONDS)) python3 -m pytest -q -rf -m gpu test/ops/test_gdn_tree_gpu.py \
          -k "dot_commit or (fused_step and not 64) or (split_verify_matches and random and bfloat16)" ) &
    ( lane 1 $((LIMIT - 10)) $BENCH32 --configs lumotree-oracle,ngram-oracle,lumotree-topk4-dot --oracle-p 0.7 \
          --batches 1,8,32 --out "$OUT/b32-dot-oracle.json" --port 30100 ) &
    wait ;;
16) # session 7: an Nsight Compute profile of the served GDN kernels beside SGLang's native ones (why the #7
    # targets are missed), then the parity suites in fp32 (--dtype float32: no bf16 logit ties) -- GPU 0:
    # ncu, NEXTN, MTP + suffix merged; GPU 1: no-spec reference, LUMOTREE, suffix only
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    FP32="--tag=-fp32 --extra=--dtype=float32"
    ( lane 0 200 bash -c "$NCU --clock-control none --profile-from-start off --set full -f -o /tmp/gdn \
          python3 benchmark/kernels/ncu_profile.py > $LOGS/ncu_stdout.txt 2>&1; \
          grep '^{\"profiled' $LOGS/ncu_stdout.txt > $OUT/ncu_marks.json; \
          $NCU --import /tmp/gdn.ncu-rep --csv --page raw > $OUT/ncu_raw.csv; \
          $NCU --import /tmp/gdn.ncu-rep --csv --page details > $OUT/ncu_details.csv; ls -la /tmp/gdn.ncu-rep"
      lane 0 $((LIMIT - 120 - SECONDS)) $SUITE --configs nextn-tree $FP32 --out "$OUT/s-fp32-0.json" --port 30000
      lane 0 $((LIMIT - 10 - SECONDS)) $SUITE --configs lumotree --tag=-merge-fp32 --extra=--dtype=float32 \
          --env LUMOTREE_SUFFIX_MERGE=1 --extra=--disable-overlap-schedule --out "$OUT/s-fp32-merge.json" --port 30000 ) &
    ( lane 1 $((LIMIT - 10)) $SUITE --configs none,lumotree,lumotree-suffix $FP32 --out "$OUT/s-fp32-1.json" --port 30100 ) &
    wait ;;
17) # session 7: the issue-7 table with the forms the server runs (mix verify + replay commit) vs SGLang's native
    # path, both models, every tree, batch 1-64 (one model per GPU)
    VF="python3 benchmark/kernels/bench_verify_forms.py --served-only --trees eagle-16,eagle-64,topk4-n8,topk2-depth3,eagle-32,chain-4 --batches 8,32,1,64"
    ( lane 0 $((LIMIT - 10)) $VF --models qwen3.5-27b --out "$OUT/served_forms_27b.json" ) &
    ( lane 1 $((LIMIT - 10)) $VF --models qwen3-next-80b --out "$OUT/served_forms_80b.json" ) &
    wait ;;
18) # session 8 (staged in session 7), 24 GDN layers at 27B shapes. GPU 0: beyond NEXTN's state slots -- SGLang
    # caps running requests at its GDN state slots / 2 (NEXTN topk 2: 147 slots, LUMOTREE 434), so at bs 128
    # NEXTN runs ~73 at a time; GPU 1: controlled acceptance again, 512 tokens (more logged intervals), with a
    # torch profile of one bs-32 pass each (where does LUMOTREE's client step lose 10 ms at bs 32?)
    BENCH32="python3 benchmark/serving/bench_spec.py --shape qwen3.5-27b-32l --log-dir $LOGS"
    ( lane 0 $((LIMIT - 10)) $BENCH32 --output-len 256 --configs lumotree-topk2,nextn-topk2 --batches 64,128 \
          --out "$OUT/b32-bs128.json" --port 30000 ) &
    ( lane 1 $((LIMIT - 40)) $BENCH32 --output-len 512 --configs lumotree-oracle,ngram-oracle --oracle-p 0.7 \
          --batches 8,32 --profile-dir /tmp/prof --profile-batches 32 --out "$OUT/b32-oracle512.json" --port 30100
      lane 1 30 python3 benchmark/serving/profile_summary.py /tmp/prof --out "$OUT/profile_oracle.json" ) &
    wait ;;
19) # session 8 (staged in session 7): parity with an fp32 LM head (logits in fp32: the bf16 logit ties at which
    # every speculative path parts from no-spec vanish); full suites, so the agent loop runs too (its no-spec
    # reference now records the top-2 margins of every reply)
    # GPU 0 first: the replay commit with the key norms the mix verify kept (LUMOTREE_SGLANG_COMMIT=knorm, new in
    # session 7: 13 % fewer instructions per step in the sm_90 SASS) -- its GPU test, then timed beside the served pair
    F32H="--tag=-fp32head --extra=--enable-fp32-lm-head"
    # and the mix fused step with the previous path loaded per step (pre_commit gather=False: the gathered form had
    # 24.6 M shared-memory bank conflicts; per-step loads need 3 instead of 24 shared stores per step in the SASS),
    # and mix pass 2 capped at 128 registers (4 programs per SM instead of 3; Nsight: too few loads in flight)
    ( lane 0 120 python3 -m pytest -q -rf -m gpu test/ops/test_gdn_tree_gpu.py -k "key_norms or (fused_step and not 64)"
      lane 0 90 python3 benchmark/kernels/bench_verify_forms.py --served-only --trees topk2-depth3,eagle-16,eagle-64 \
          --batches 8,32 --out "$OUT/served_forms_knorm.json"
      lane 0 100 python3 benchmark/kernels/bench_verify_forms.py --variants maxnreg128,maxnreg128-BV32-w2 \
          --trees topk2-depth3,eagle-16 --batches 32 --out "$OUT/verify_forms_fused_replay.json"
      lane 0 $((LIMIT - 10 - SECONDS)) $SUITE --configs none,nextn-tree $F32H --out "$OUT/s-fp32head-0.json" --port 30000 ) &
    ( lane 1 $((LIMIT - 10)) $SUITE --configs lumotree,lumotree-suffix $F32H --out "$OUT/s-fp32head-1.json" --port 30100 ) &
    wait ;;
20) # session 8. GPU 0: LUMOTREE_SUFFIX parity again after the host-context fix (call 19 found 19 of 32 texts parting
    # from no-spec within 10 characters, at margins up to 3.6: the draft root was the drafter's stale last token
    # when SGLang's overlap splice handed a round's tokens twice), then the chain rows at 24 GDN layers (NEXTN
    # chain vs LUMOTREE chain). GPU 1: controlled acceptance at bs 64 / 128, where SGLang's path runs out of
    # state slots (per-node snapshots) and caps its running requests
    F32H="--tag=-fp32head --extra=--enable-fp32-lm-head"
    BENCH32="python3 benchmark/serving/bench_spec.py --shape qwen3.5-27b-32l --log-dir $LOGS"
    ( lane 0 240 $SUITE --configs lumotree-suffix $F32H --out "$OUT/s-suffix-fixed.json" --port 30000
      lane 0 $((LIMIT - 10 - SECONDS)) $BENCH32 --output-len 256 --configs nextn-chain,lumotree-chain --batches 1,8,32 \
          --out "$OUT/b32-chain.json" --port 30000 ) &
    ( lane 1 $((LIMIT - 10)) $BENCH32 --output-len 384 --configs lumotree-oracle,ngram-oracle --oracle-p 0.7 \
          --batches 64,128 --out "$OUT/b32-oracle-bs128.json" --port 30100 ) &
    wait ;;
21) # session 8: is only committed state ever cached? Turn 1 with odd max_new_tokens (speculative overshoot), turn 2
    # from the radix cache vs the same turn 2 after /flush_cache; no-spec is the control (agent-loop transcripts of
    # every speculative config part from no-spec at the first token of a turn, never mid-reply)
    CHK="python3 benchmark/serving/cache_consistency.py --model $M --log-dir $LOGS"  # not CC: Triton compiles with $CC
    ( lane 0 $((LIMIT - 10)) $CHK --configs ${CHK0:-none,lumotree-suffix} --out "$OUT/cc-0.json" --port 30000 ) &
    ( lane 1 $((LIMIT - 10)) $CHK --configs ${CHK1:-lumotree,nextn-tree} --out "$OUT/cc-1.json" --port 30100 ) &
    wait ;;
22) # session 8 (staged): call 21 found LUMOTREE_SUFFIX's cached end-of-turn states inconsistent with their keys
    # (no-spec clean): under overlap scheduling a request that finished in step N still runs in the already
    # launched step N+1, whose commit advanced the slot SGLang had just donated to the radix cache. GPU 0: the same
    # check with lumotree.sglang.finish_guard (the commit skips requests that had ended by length or stop token;
    # cache_consistency now also ends turn 1 by a stop token); GPU 1: does SGLang's own NEXTN path share it, and
    # NEXTN without the overlap scheduler
    CHK="python3 benchmark/serving/cache_consistency.py --model $M --log-dir $LOGS"
    ( lane 0 $((LIMIT - 10)) $CHK --configs lumotree-suffix,lumotree --out "$OUT/cc-guard.json" --port 30000 ) &
    ( lane 1 $((LIMIT / 2)) $CHK --configs nextn-tree --out "$OUT/cc-nextn.json" --port 30100
      lane 1 $((LIMIT - 10 - SECONDS)) $CHK --configs nextn-tree --extra=--disable-overlap-schedule --tag=-nooverlap \
          --out "$OUT/cc-nextn-nooverlap.json" --port 30100 ) &
    wait ;;
23) # session 8 (staged), lane 1 changed in session 9: the bs-8 gap at controlled acceptance (client 0.85x SGLang's path,
    # server log 1.02x): rows carry each request's verify steps and e2e latency (ms_per_batch_step: wall / the longest
    # request's steps), and a torch profile of one bs-8 pass each (overlap on both, as every earlier row); GPU 1: what
    # LumoTree's synchronous default (radix cache on) costs at 27B shapes, both paths without overlap at bs 8 / 32
    BENCH32="python3 benchmark/serving/bench_spec.py --shape qwen3.5-27b-32l --log-dir $LOGS"
    ( lane 0 $((LIMIT - 40)) $BENCH32 --output-len 512 --configs lumotree-oracle,ngram-oracle --oracle-p 0.7 --batches 8 \
          --profile-dir /tmp/prof0 --profile-batches 8 --out "$OUT/b32-oracle-bs8.json" --port 30000
      lane 0 30 python3 benchmark/serving/profile_summary.py /tmp/prof0 --out "$OUT/profile_oracle_bs8.json" ) &
    ( lane 1 $((LIMIT - 10)) $BENCH32 --output-len 512 --configs lumotree-oracle,ngram-oracle --oracle-p 0.7 --batches 8,32 \
          --scheduler sync --out "$OUT/b32-oracle-sync.json" --port 30100 ) &
    wait ;;
24) # session 9: call 22 found LUMOTREE (tree) with the guard 13/16 on its cached prompt states (hits at the prompt
    # length, the state the overlap scheduler's extra_buffer strategy tracked at prefill), even for turns of one token
    # (no verify step). Controls: SGLang's NEXTN under the same overlap / extra_buffer setting (GPU 0, then no-spec),
    # LUMOTREE and LUMOTREE_SUFFIX without the overlap scheduler (no_buffer strategy; GPU 1)
    CHK="python3 benchmark/serving/cache_consistency.py --model $M --log-dir $LOGS"
    ( lane 0 $((LIMIT * 6 / 10)) $CHK --configs nextn-tree --out "$OUT/cc-nextn.json" --port 30000
      lane 0 $((LIMIT - 10 - SECONDS)) $CHK --configs none --out "$OUT/cc-none.json" --port 30000 ) &
    ( lane 1 $((LIMIT / 2)) $CHK --configs lumotree --extra=--disable-overlap-schedule --tag=-nooverlap \
          --out "$OUT/cc-lumotree-nooverlap.json" --port 30100
      lane 1 $((LIMIT - 10 - SECONDS)) $CHK --configs lumotree-suffix --extra=--disable-overlap-schedule --tag=-nooverlap \
          --out "$OUT/cc-suffix-nooverlap.json" --port 30100 ) &
    wait ;;
25) # session 9: LumoTree servers now default to SGLang's synchronous scheduler while the radix cache is on
    # (call 24: SGLang's overlap path -- NEXTN too -- served inconsistent cached states; without it 16/16). The fp32-head
    # suites (parity, agent replay, agent loop) under that default; then what the default costs (tiny model, real
    # acceptance: lumotree-topk2 with and without overlap) on GPU 0, and the GPU tests owed on GPU 1
    F32H="--tag=-fp32head --extra=--enable-fp32-lm-head"
    BT="python3 benchmark/serving/bench_spec.py --model $M --log-dir $LOGS --configs lumotree-topk2,nextn-topk2 --batches 1,8,32 --mem-fraction-static 0.3"
    ( lane 0 300 $SUITE --configs lumotree $F32H --out "$OUT/s-sync-0.json" --port 30000
      lane 0 $(( (LIMIT - 10 - SECONDS) / 2 )) $BT --scheduler sync --out "$OUT/b-tiny-sync.json" --port 30000
      lane 0 $((LIMIT - 10 - SECONDS)) $BT --scheduler overlap --out "$OUT/b-tiny-overlap.json" --port 30000 ) &
    ( lane 1 300 $SUITE --configs lumotree-suffix $F32H --out "$OUT/s-sync-1.json" --port 30100
      lane 1 $((LIMIT - 10 - SECONDS)) python3 -m pytest -q -rA -m gpu test/sglang/test_backend_emulation.py \
          test/sglang/test_select_adapter.py test/sglang/test_served_crosscheck_gpu.py --basetemp=$LOGS/pt ) &
    wait ;;
26) # session 9: call 25's agent loop under LumoTree's synchronous default parted from no-spec at a turn's first token
    # (margins <= 0.086); SGLang's NEXTN under the same scheduler, for the like-for-like count (GPU 0); the cross-check
    # GPU test's other tree (GPU 1)
    F32H="--tag=-sync-fp32head --extra=--enable-fp32-lm-head --extra=--disable-overlap-schedule"
    ( lane 0 $((LIMIT - 10)) $SUITE --configs nextn-tree $F32H --out "$OUT/s-nextn-sync.json" --port 30000 ) &
    ( lane 1 $((LIMIT - 10)) python3 -m pytest -q -rA -m gpu test/sglang/test_served_crosscheck_gpu.py -k "not tree6" \
          --basetemp=$LOGS/pt ) &
    wait ;;
27) # session 9 (staged): where SGLang's overlap path caches inconsistent states (call 24: NEXTN 15/16 and 11/16 with
    # overlap, 16/16 without). GPU 0: no-spec and NEXTN with overlap in one file, so versus_none tells which side of
    # NEXTN's cached-vs-fresh disagreement is off (the cached state or the fresh prefill); GPU 1: NEXTN with overlap under
    # SGLang's KV-cache canary (a full-attention KV slot owned twice would show), then NEXTN with the extra_buffer state
    # cache but without overlap (scheduler vs strategy)
    CHK="python3 benchmark/serving/cache_consistency.py --model $M --log-dir $LOGS"
    ( lane 0 $((LIMIT - 10)) $CHK --configs none,nextn-tree --out "$OUT/cc-none-nextn.json" --port 30000 ) &
    ( lane 1 $((LIMIT / 2)) $CHK --configs nextn-tree --extra=--kv-canary=log --extra=--kv-canary-sweep-interval=1 \
          --tag=-canary --out "$OUT/cc-nextn-canary.json" --port 30100
      lane 1 $((LIMIT - 10 - SECONDS)) $CHK --configs nextn-tree --extra=--disable-overlap-schedule \
          --extra=--mamba-radix-cache-strategy=extra_buffer --tag=-sync-extra-buffer --out "$OUT/cc-nextn-sync-eb.json" \
          --port 30100 ) &
    wait ;;
28) # session 9 (staged): how reproducible is the no-speculation reference itself? Every speculative path parts from it
    # only at near-ties (parity margins <= 0.0512, agent-loop turn starts <= 0.086; no-spec's own cached-vs-fresh spread
    # is 0.091): the same fp32-head suites for no-spec without the radix cache (GPU 0) and without overlap (GPU 1)
    ( lane 0 $((LIMIT - 10)) $SUITE --configs none --tag=-nocache-fp32head --extra=--enable-fp32-lm-head \
          --extra=--disable-radix-cache --out "$OUT/s-none-nocache.json" --port 30000 ) &
    ( lane 1 $((LIMIT - 10)) $SUITE --configs none --tag=-sync-fp32head --extra=--enable-fp32-lm-head \
          --extra=--disable-overlap-schedule --out "$OUT/s-none-sync.json" --port 30100 ) &
    wait ;;
29) # session 10: the decode-exact verify (LUMOTREE + --enable-deterministic-inference: every node computed as the
    # one-token decode at its position -- GDN by the decode recurrence along the root path, SGLang's decode conv,
    # per-node split-KV decode attention). GPU 0: its bitwise GPU tests against SGLang's decode kernels, then the
    # no-spec reference with the same flags; GPU 1: LUMOTREE and LUMOTREE_SUFFIX. Full suites (parity, replay, agent loop)
    # (SGLang's batch-invariant matmul JIT-compiles DeepGEMM, whose headers the bundle leaves out: its Triton
    # persistent matmul instead, on both servers)
    EXACT="--tag=-exact --extra=--enable-deterministic-inference --extra=--disable-overlap-schedule \
           --env SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM=0"
    ( lane 0 150 python3 -m pytest -q -rf -m gpu test/ops/test_exact_gpu.py
      lane 0 $((LIMIT - 10 - SECONDS)) $SUITE --configs none $EXACT --out "$OUT/s-exact-0.json" --port 30000 ) &
    ( lane 1 $((LIMIT - 10)) $SUITE --configs lumotree,lumotree-suffix $EXACT --out "$OUT/s-exact-1.json" --port 30100 ) &
    wait ;;
30) # session 10: call 29's speculative servers, one per GPU (call 29 ran the reference; its LUMOTREE servers failed
    # to capture: a host-to-device copy in the KV layout, fixed)
    EXACT="--tag=-exact --extra=--enable-deterministic-inference --extra=--disable-overlap-schedule \
           --env SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM=0"
    ( lane 0 $((LIMIT - 10)) $SUITE --configs lumotree $EXACT --out "$OUT/s-exact-1.json" --port 30000 ) &
    ( lane 1 $((LIMIT - 10)) $SUITE --configs lumotree-suffix $EXACT --out "$OUT/s-exact-2.json" --port 30100 ) &
    wait ;;
31) # session 10: call 30 found LUMOTREE's exact-mode agent loop 4/5 (one reply parted at an exact tie, margin 0.0),
    # but only the reference had asked for logprobs; now every configuration sends the same requests (with logprobs)
    # and the turns record cached tokens. GPU 0: the reference, then SGLang's NEXTN under the same flags; GPU 1: LumoTree
    EXACT="--tag=-exact --extra=--enable-deterministic-inference --extra=--disable-overlap-schedule \
           --env SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM=0"
    ( lane 0 $((LIMIT - 10)) $SUITE --configs none,nextn-tree $EXACT --out "$OUT/s-exact-0.json" --port 30000 ) &
    ( lane 1 $((LIMIT - 10)) $SUITE --configs lumotree,lumotree-suffix $EXACT --out "$OUT/s-exact-1.json" --port 30100 ) &
    wait ;;
32) # session 10: LUMOTREE's exact-mode agent loop parts from no-spec once (4/5, at an exact tie, the last turn of
    # session 0; LUMOTREE_SUFFIX 5/5): are the turns' cached prefixes the same on both servers (--enable-cache-report:
    # cached tokens per turn)? GPU 0 then: the MTP + suffix merged tree (LUMOTREE_SUFFIX_MERGE=1) in exact mode
    EXACT="--extra=--enable-deterministic-inference --extra=--disable-overlap-schedule"
    NODG="SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM=0"
    ( lane 0 200 $SUITE --configs none --agent-only --tag=-exact-cr $EXACT --extra=--enable-cache-report --env $NODG \
          --out "$OUT/s-cr-0.json" --port 30000
      lane 0 $((LIMIT - 10 - SECONDS)) $SUITE --configs lumotree --tag=-merge-exact $EXACT \
          --env $NODG LUMOTREE_SUFFIX_MERGE=1 --out "$OUT/s-merge-exact.json" --port 30000 ) &
    ( lane 1 200 $SUITE --configs lumotree --agent-only --tag=-exact-cr $EXACT --extra=--enable-cache-report --env $NODG \
          --out "$OUT/s-cr-1.json" --port 30100
      lane 1 $((LIMIT - 10 - SECONDS)) python3 test/sglang/backend_emulation.py cuda exact ) &
    wait ;;
33) # session 10 (staged): the cached prefix of each agent turn on LUMOTREE's and NEXTN's exact-mode servers (the reference's
    # is in call 32: session 0's last turn matched 583 of 709 tokens); where they differ from the reference's, the
    # single agent-loop difference (an exact tie) is the prefill's start, not the verify
    EXACT="--extra=--enable-deterministic-inference --extra=--disable-overlap-schedule --extra=--enable-cache-report"
    NODG="SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM=0"
    ( lane 0 $((LIMIT - 10)) $SUITE --configs lumotree --agent-only --tag=-exact-cr $EXACT --env $NODG \
          --out "$OUT/s-cr-1.json" --port 30000 ) &
    ( lane 1 $((LIMIT - 10)) $SUITE --configs nextn-tree,lumotree-suffix --agent-only --tag=-exact-cr $EXACT --env $NODG \
          --out "$OUT/s-cr-2.json" --port 30100 ) &
    wait ;;
*)  echo "unknown call $CALL" >&2; exit 2 ;;
esac
tail -n 5 "$LOGS"/lane*.out
tar -C /tmp -czf "$OUT/logs-call$CALL.tgz" logs
