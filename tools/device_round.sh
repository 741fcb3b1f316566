#!/usr/bin/env bash
# One GPU session's worth of checks, in stages, each with its own time limit, logs packed into
# $OUT/logs.tgz after every stage (so a stage killed at the call's limit loses nothing else).
#   tools/device_round.sh tests memory gemm doctor tune_bert        (one call)
#   tools/device_round.sh conv tune_rn50 tune_bench                 (the next call)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
L=${OUT:-/tmp/out}/logs; mkdir -p "$L"
pack() { tar czf "${OUT:-/tmp/out}/logs.tgz" -C "$(dirname "$L")" logs; }
dn() { python3 -m dnnctl "$@"; }
for st in "$@"; do
  t0=$(date +%s)
  case $st in
    tests)
      timeout 330 python3 -m pytest tests/gpu -q -p no:cacheprovider -n 16 --timeout 240 \
        --tb=short -rfE > "$L/tests.log" 2>&1
      tail -3 "$L/tests.log"; grep -E "^(FAILED|ERROR)" "$L/tests.log" | head -40 ;;
    memory|gemm|conv|tune)
      mkdir -p "$L/$st"
      OUT="$L/$st" timeout "${T:-400}" python3 benchmarks/run.py --only "$st" ${Q:-} \
        > "$L/bench_$st.log" 2>&1
      grep -E "geomean|Below|Slower|within 3%|speed-up|overhead|goal|skipped|wrong!" \
        "$L/bench_$st.log" | head -30 ;;
    doctor)
      { time dn doctor; } > "$L/doctor.txt" 2>&1
      dn doctor --deep > "$L/doctor_deep.txt" 2>&1
      dn doctor --deep --json > "$L/doctor_deep.json" 2>&1
      dn doctor --save "$L/env.yaml" > /dev/null 2>&1
      dn compat check --gpu H200 --driver 580.159.04 --torch 2.11.0+cu130 \
        --cupy cupy-cuda13x==14.2.0 > "$L/compat_check.txt" 2>&1; echo "compat rc=$?"
      tail -4 "$L/doctor.txt"; tail -2 "$L/doctor_deep.txt" ;;
    tune_bert)
      { time dn tune bert_base --budget 60 -o "$L/plan_bert.yaml"; } > "$L/tune_bert.txt" 2>&1
      echo "tune bert rc=$?"; tail -4 "$L/tune_bert.txt" ;;
    tune_rn50)
      { time dn tune resnet50 --batch 32 --budget 150 -o "$L/plan_rn50.yaml"; } \
        > "$L/tune_rn50.txt" 2>&1
      echo "tune rn50 rc=$?"; tail -4 "$L/tune_rn50.txt"
      dn plan coverage "$L/plan_rn50.yaml" resnet50 > "$L/coverage_rn50.txt" 2>&1
      dn plan show "$L/plan_rn50.yaml" > "$L/show_rn50.txt" 2>&1 ;;
    gpu_tests)  # every GPU test, several workers on one GPU (-n 16 runs out of memory)
      timeout -s INT -k 30 "${T:-320}" python3 -m pytest tests/gpu -q -p no:cacheprovider \
        -n "${N:-10}" --timeout 200 --tb=short -rfE > "$L/gpu_tests.log" 2>&1
      tail -3 "$L/gpu_tests.log"; grep -E "^(FAILED|ERROR)" "$L/gpu_tests.log" | head -40 ;;
    launch)  # the run-time path's host cost per call, from torch tensors and CuPy arrays
      timeout "${T:-90}" python3 benchmarks/bench_launch.py > "$L/launch.md" 2>&1
      tail -30 "$L/launch.md" ;;
    e2e)
      timeout "${T:-150}" python3 benchmarks/bench_e2e.py --quick --out "$L/e2e.json" \
        > "$L/e2e.md" 2>&1
      tail -25 "$L/e2e.md" ;;
    backward)
      timeout "${T:-90}" python3 benchmarks/bench_backward.py --quick > "$L/backward.md" 2>&1
      tail -25 "$L/backward.md" ;;
    backward_host)  # the backward functions' host time per call from torch CUDA tensors
      timeout "${T:-90}" python3 benchmarks/bench_backward_host.py > "$L/backward_host.md" 2>&1
      tail -10 "$L/backward_host.md" ;;
    cudnn_tests)  # the torch cuDNN attention variants' GPU tests (GQA forward, backward)
      timeout -s INT "${T:-150}" python3 -m pytest tests/gpu/test_attention.py -q -n 8 \
        -p no:cacheprovider --tb=short -rfE -k "torch_cudnn" > "$L/cudnn_tests.log" 2>&1
      tail -3 "$L/cudnn_tests.log" ;;
    attention)  # the attention benchmark (ours vs cuDNN / FA2) and the GPU tests of the op
      timeout "${T:-250}" python3 benchmarks/bench_attention.py > "$L/attention.md" 2>&1
      tail -14 "$L/attention.md"
      timeout -s INT 150 python3 -m pytest tests/gpu/test_attention.py -q -n 8 \
        -p no:cacheprovider --tb=short -rfE > "$L/attention_tests.log" 2>&1
      tail -3 "$L/attention_tests.log" ;;
    decode)  # the decode kernels' GPU tests, then every decode_ring candidate on decode shapes
      timeout -s INT "${T:-150}" python3 -m pytest tests/gpu/test_attention.py -q -n 8 \
        -p no:cacheprovider --tb=short -rfE -k "decode" > "$L/decode_tests.log" 2>&1
      tail -3 "$L/decode_tests.log"
      timeout 240 python3 benchmarks/attention_candidates.py --decode decode_ring \
        > "$L/decode_candidates.md" 2>&1
      timeout 90 python3 benchmarks/attention_candidates.py --decode --default decode \
        > "$L/decode_defaults.md" 2>&1
      grep -E "cuDNN|copy" "$L/decode_candidates.md" | head -20; cat "$L/decode_defaults.md" ;;
    bn_profile)  # each batch_norm training kernel's time, dnnctl and torch (torch profiler)
      timeout "${T:-120}" python3 tools/bn_kernel_times.py > "$L/bn_profile.txt" 2>&1
      grep " us " "$L/bn_profile.txt" ;;
    attention_defaults)  # each attention variant's default parameters only (fast)
      timeout "${T:-90}" python3 benchmarks/attention_candidates.py --default wgmma mma \
        > "$L/attention_defaults.md" 2>&1
      tail -20 "$L/attention_defaults.md" ;;
    doctor_time)
      python3 -m compileall -q dnnctl  # as an installed dnnctl has its .pyc files
      TIMEFORMAT=%R
      for i in $(seq "${R:-7}"); do { time python3 -m dnnctl doctor > /dev/null 2>&1; } \
        2>> "$L/doctor_time.txt"; done
      python3 -m dnnctl doctor --timings > /dev/null 2> "$L/doctor_timings.txt"
      python3 -m dnnctl doctor --deep --timings > "$L/doctor_deep.txt" 2>&1
      tail -"${R:-7}" "$L/doctor_time.txt" | tr '\n' ' '; echo; tail -30 "$L/doctor_timings.txt"
      tail -14 "$L/doctor_deep.txt" ;;
    overhead)  # host wall time per call from torch tensors vs torch itself
      timeout "${T:-60}" python3 benchmarks/bench_torch_overhead.py --quick --out "$L/overhead.json" \
        > "$L/overhead.md" 2>&1
      tail -30 "$L/overhead.md" ;;
    e2e_models)
      timeout "${T:-120}" python3 benchmarks/bench_e2e.py --models "${MODELS:-resnet50-b32,vit_b16-b32,llama7b-decode-b8-kv2048}" \
        --ways "${WAYS:-eager,dnnctl}" --iters 10 --out "$L/e2e.json" > "$L/e2e.md" 2>&1
      tail -16 "$L/e2e.md" ;;
    e2e_tuned)  # record each model's workload, tune it (one merged plan), then the five ways
      M=${MODELS:-resnet50-b32,vit_b16-b32,llama7b-prefill2048,llama7b-decode-b8-kv2048}
      timeout 200 python3 benchmarks/bench_e2e.py --models "$M" --ways dnnctl --iters 2 \
        --record-workload "$L/wl" > "$L/e2e_record.md" 2>&1
      for f in "$L"/wl/*.workload.yaml; do
        # TUNE_FLAGS=--gpu-time: a plan for the compiled (CUDA-graph) ways
        timeout "${TT:-120}" python3 -m dnnctl tune "$f" --budget "${B:-60}" ${TUNE_FLAGS:-} \
          -o "$L/e2e_plan.yaml" >> "$L/e2e_tune.txt" 2>&1; echo "tune $(basename "$f") rc=$?"
      done
      timeout "${T:-300}" python3 benchmarks/bench_e2e.py --models "$M" --plan "$L/e2e_plan.yaml" \
        --ways "${WAYS:-eager,compile-ro,dnnctl,dnnctl+compile-ro}" --iters 10 \
        --out "$L/e2e_tuned.json" > "$L/e2e_tuned.md" 2>&1
      tail -16 "$L/e2e_tuned.md" ;;
    conv_backward)
      timeout "${T:-120}" python3 benchmarks/bench_conv_backward.py --quick > "$L/conv_backward.md" 2>&1
      tail -25 "$L/conv_backward.md" ;;
    onnx)
      { dn workload from-onnx docs/examples/resnet_block.onnx --batch 32 --dtype fp16 --layout NHWC \
          -o "$L/rb.yaml" && timeout 40 python3 -m dnnctl tune "$L/rb.yaml" --budget 15 \
          -o "$L/rb-plan.yaml"; } > "$L/onnx.txt" 2>&1
      echo "onnx rc=$?"; tail -4 "$L/onnx.txt" ;;
    profile)  # where one call's host time goes, from torch tensors
      timeout "${T:-90}" python3 benchmarks/profile_call.py --calls 1500 > "$L/profile.md" 2>&1
      grep "###" "$L/profile.md" ;;
    fixtests)  # the GPU tests of this round's fixes and new kernels
      timeout -s INT -k 30 "${T:-250}" python3 -m pytest -q -p no:cacheprovider -n "${N:-12}" \
        --timeout 100 --tb=short -rfE tests/gpu/test_gemm_hopper.py tests/gpu/test_conv_backward.py \
        tests/gpu/test_backward_gpu.py tests/gpu/test_doctor_live_gpu.py \
        tests/gpu/test_doctor_server.py tests/gpu/test_torch_backward_gpu.py \
        tests/gpu/test_torch_runtime.py \
        "tests/gpu/test_attention.py::test_public_function_on_cupy_and_torch" \
        > "$L/fixtests.log" 2>&1
      tail -2 "$L/fixtests.log"; grep -E "^(FAILED|ERROR)" "$L/fixtests.log" | cut -c1-150 | head -30
      timeout -s INT -k 30 "${T2:-90}" python3 -m pytest -q -p no:cacheprovider -n "${N:-12}" \
        --timeout 80 --tb=short -rfE tests/gpu/test_gemm.py tests/gpu/test_conv2d.py \
        tests/gpu/test_kernels_memory.py \
        -k "cublaslt or wgmma_tma or wgrad or default or (norm and bwd)" \
        > "$L/fixtests2.log" 2>&1
      tail -2 "$L/fixtests2.log"; grep -E "^(FAILED|ERROR)" "$L/fixtests2.log" | cut -c1-150 | head -30 ;;
    adoption)  # output adoption (vendor attention on torch tensors), the new activations,
      # Conv1d / BatchNorm1d / InstanceNorm routing, capture cases
      timeout -s INT -k 30 "${T:-240}" python3 -m pytest -q -p no:cacheprovider -n "${N:-12}" \
        --timeout 150 --tb=short -rfE tests/gpu/test_attention.py tests/gpu/test_capture_ops.py \
        tests/gpu/test_backward_gpu.py tests/gpu/test_torch_gpu.py tests/gpu/test_torch_runtime.py \
        -k "planned_vendor or torch_ or public_function or decode or capture or backward_functions or torch" \
        > "$L/adoption.log" 2>&1
      tail -2 "$L/adoption.log"; grep -E "^(FAILED|ERROR)" "$L/adoption.log" | cut -c1-150 | head -30
      timeout -s INT -k 30 "${T2:-120}" python3 -m pytest -q -p no:cacheprovider -n "${N:-12}" \
        --timeout 100 --tb=short -rfE tests/gpu/test_kernels_memory.py tests/gpu/test_conv2d.py \
        -k "relu6 or hardswish or hardsigmoid or activation" > "$L/activations.log" 2>&1
      tail -2 "$L/activations.log"; grep -E "^(FAILED|ERROR)" "$L/activations.log" | cut -c1-150 | head -30 ;;
    depthwise)  # depthwise / depthwise_tile vs cuDNN on published models' layers
      timeout "${T:-150}" python3 benchmarks/bench_depthwise.py ${Q:-} > "$L/depthwise.md" 2>&1
      tail -16 "$L/depthwise.md" ;;
    linear_act)
      timeout "${T:-60}" python3 benchmarks/bench_linear_act.py --quick > "$L/linear_act.md" 2>&1
      tail -22 "$L/linear_act.md" ;;
    unseen)
      timeout "${T:-110}" python3 benchmarks/bench_unseen.py --quick --budget "${B:-90}" \
        --out "$L/unseen.json" > "$L/unseen.md" 2>&1
      tail -40 "$L/unseen.md" ;;
    diag_train)  # where a patched training step departs from eager, and where its time goes
      timeout -s INT "${T:-150}" python3 benchmarks/diag_train.py --model "${MODEL:-resnet50}" \
        --profile --steps "${STEPS:-20}" --only "${ONLY:-compare,steps,profile}" \
        --backward "${BWD:-torch}" > "$L/diag_train.md" 2>&1
      grep -vE "^ +(aten|cuda|void|Memcpy|Memset)" "$L/diag_train.md" | grep -v "^--" | head -70 ;;
    torch_tests)  # the torch-path GPU tests
      timeout -s INT -k 30 "${T:-200}" python3 -m pytest -q -p no:cacheprovider -n "${N:-12}" \
        --timeout 120 --tb=short -rfE tests/gpu/test_torch_backward_gpu.py \
        tests/gpu/test_torch_runtime.py tests/gpu/test_backward_gpu.py > "$L/torch_tests.log" 2>&1
      tail -2 "$L/torch_tests.log"; grep -E "^(FAILED|ERROR)" "$L/torch_tests.log" | cut -c1-150 | head -30 ;;
    norm_tests)
      timeout -s INT -k 30 "${T:-150}" python3 -m pytest -q -p no:cacheprovider -n "${N:-12}" \
        --timeout 140 --tb=short -rfE tests/gpu/test_kernels_memory.py -k "norm" \
        > "$L/norm_tests.log" 2>&1
      tail -2 "$L/norm_tests.log"; grep -E "^(FAILED|ERROR)" "$L/norm_tests.log" | cut -c1-150 | head -30 ;;
    train)
      timeout "${T:-80}" python3 benchmarks/bench_train.py --quick --models "${MODELS:-resnet50,vit}" \
        --backward "${BWD:-plan}" --steps "${STEPS:-20}" ${XARGS:-} --out "$L/train.json" \
        > "$L/train.md" 2>&1
      tail -16 "$L/train.md" ;;
    regress)  # quick benchmarks on this tree and on an older one, same call: no regression?
      # prepare here: rm -rf .snap && mkdir .snap && git archive REV | tar -x -C .snap
      # (.snap in .git/info/exclude), then run with carry [".snap"]
      for t in new old; do
        d=.; [ "$t" = old ] && d=.snap
        [ -d "$d" ] || { echo "no $d"; continue; }
        (cd "$d" && OUT="$L/regress_$t" PYTHONPATH=$PWD timeout "${T:-120}" python3 \
          benchmarks/run.py --quick --only "${ONLY:-memory,conv,gemm}" > "$L/regress_$t.log" 2>&1)
        grep -E "geomean|wrong" "$L/regress_$t.log" | head -12
      done ;;
    capture)  # which op's backward breaks a captured training step; run-to-run loss noise
      timeout "${T:-240}" python3 tools/capture_probe.py > "$L/capture.txt" 2>&1
      grep "^## " "$L/capture.txt" ;;
    *) echo "unknown stage $st" ;;
  esac
  echo "== $st: $(( $(date +%s) - t0 )) s"
  pack
done
