#!/usr/bin/env bash
# timerl's checks on a machine with a CUDA GPU, in one pass of a few minutes:
#   1. the differential fuzzer with the torch backend on the GPU for every program and the
#      jax backend on the GPU for its own programs, each against the numpy reference; the
#      memory tests, whose swap test runs on cuda there (blocks swapped to host memory);
#   2. the benchmark's synthetic-e256 and memory-e8 cases, timerl torch and jax on the GPU
#      against eager PyTorch and the jitted JAX PPO on the same GPU, alternated;
#   3. where a jax iteration's time goes on the GPU: inside its jitted call or in the host's
#      work around it, and the device's kernels by name (bench/jax_iteration.py).
# Usage: bench/gpu_check.sh [OUTDIR]   (python3 with torch built for CUDA and jax with a GPU
# plugin; DEVICE=cpu runs the same steps on the host, FUZZ / REPEATS size them).
set -u -o pipefail
out=${1:-gpu-check}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
device=${DEVICE:-cuda}

# 0. the machine; stop here when timerl does not import or the GPU is not seen
DEVICE=$device $py - <<'EOF' 2>&1 | tee "$out/facts.txt" || exit 1
import os, platform
import jax, numpy, torch
import timerl
print(f"python {platform.python_version()}, numpy {numpy.__version__}, torch {torch.__version__}, "
      f"jax {jax.__version__}, timerl {timerl.__version__}")
print("jax devices:", jax.devices())
if os.environ["DEVICE"] == "cuda":
    assert torch.cuda.is_available(), "torch sees no CUDA device"
    print("torch device:", torch.cuda.get_device_name(0))
EOF

# 1. values on the GPU against the numpy reference
TIMERL_FUZZ_DEVICE=$device TIMERL_FUZZ_EXAMPLES=${FUZZ:-500} TIMERL_FUZZ_JAX_EXAMPLES=${JAX_FUZZ:-20} \
  timeout 200 $py -m pytest -q -n "${WORKERS:-8}" -p no:cacheprovider \
  tests/fuzz/test_differential.py tests/runtime/test_memory.py 2>&1 | tee "$out/tests.txt"
tests=$?

# 2. speed and device memory on the GPU
timeout 300 $py -m bench.rl --configs "${CONFIGS:-synthetic-e256,memory-e8}" \
  --systems timerl_torch,torch_ppo,timerl_jax,jax_ppo --device "$device" \
  --repeats "${REPEATS:-2}" --iterations "${ITERATIONS:-3}" 2>&1 | tee "$out/bench.txt"
bench=$?

# 3. a jax iteration on the GPU, inside and around its call
timeout 120 $py -m bench.jax_iteration --config synthetic-e256 --device "$device" --kernels \
  2>&1 | tee "$out/jax_iteration.txt"
split=$?
echo "tests exit $tests, bench exit $bench, jax_iteration exit $split" | tee -a "$out/facts.txt"
exit $((tests || bench || split))
