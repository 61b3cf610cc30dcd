#!/usr/bin/env bash
# Our CPU kernels (models/kernels/winograd3d.cc: CosmoFlow's 3x3x3
# convolutions by Winograd's algorithm) compiled against the venv's
# TensorFlow, once for every x86-64 node a cluster may have:
#   winograd3d_avx2.so    AVX2 and FMA: every x86-64 server since 2013
#   winograd3d_avx512.so  AVX-512 (F): 16 floats a vector
# models/winograd3d.py loads the widest the CPU running the process has,
# never what the CPU that built them had: one venv on a shared file
# system serves every node (BUILD.md, "Our CPU kernels").
#
#   scripts/build_kernels.sh PYTHON DIR    (scripts/setup.sh runs it)
#
# It never fails: the kernels serve CosmoFlow alone, so without a
# compiler, on another architecture or when a compiler cannot build them,
# it says in one line what is lost and exits 0, and the model takes
# TensorFlow's convolution. CXX names the compiler (default g++). Rebuilt
# when the source, the compiler, its flags or the TensorFlow change.
set -uo pipefail
cd "$(dirname "$0")/.."
py=$1
out=$2
cxx=${CXX:-g++}
source=models/kernels/winograd3d.cc
lost="CosmoFlow's 3x3x3 blocks will train at TensorFlow's speed"
say() { echo "[setup] $*" >&2; }

# The variants, narrowest first, and the flags each is compiled with.
variants=(avx2 avx512)
declare -A variant_flags=(
  [avx2]="-mavx2 -mfma"
  [avx512]="-mavx512f -mavx2 -mfma"
)
# -Wno-interference-size: GCC 12 warns about TensorFlow's headers (GCC 11
# ignores the unknown -Wno- flag).
flags="-std=c++17 -shared -fPIC -O3 -Wno-deprecated-declarations -Wno-interference-size"

mkdir -p "$out"
rm -f "$out/winograd3d.so" "$out/winograd3d.sha256"  # one build for the set-up's CPU alone, before these
stamp=$out/winograd3d.key
outcome=$out/winograd3d.outcome  # what the last build said, said again while its key holds

if [ "$(uname -m)" != x86_64 ]; then
  say "no CPU kernels on $(uname -m): they are written for x86-64's vectors; $lost"
  rm -f "$out"/winograd3d_*.so "$stamp" "$outcome"
  exit 0
fi
if ! compiler=$("$cxx" --version 2>/dev/null | head -n 1) || [ -z "$compiler" ]; then
  say "no C++ compiler ($cxx; set CXX= to name one): no CPU kernels, $lost"
  rm -f "$out"/winograd3d_*.so "$stamp" "$outcome"
  exit 0
fi
if ! tf=$("$py" -c 'import tensorflow as tf; print(tf.__version__); print(" ".join(tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags()))' 2>/dev/null); then
  say "the venv's TensorFlow does not import: no CPU kernels, $lost"
  exit 0
fi
tf_version=$(head -n 1 <<< "$tf")
read -r -a tf_flags <<< "$(tail -n 1 <<< "$tf")"

key=$( (echo "$cxx $compiler $flags $tf_version ${tf_flags[*]}"
        for variant in "${variants[@]}"; do echo "$variant ${variant_flags[$variant]}"; done
        cat "$source") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$key" ]; then
  [ -s "$outcome" ] && say "$(cat "$outcome")"
  exit 0
fi

say "compiling $source for AVX2 and AVX-512 with $compiler against TensorFlow $tf_version (30 seconds)"
rm -f "$out"/winograd3d_*.so "$outcome"
built=()
for variant in "${variants[@]}"; do
  # shellcheck disable=SC2086  # the flags are words
  if "$cxx" $flags ${variant_flags[$variant]} "$source" \
      -o "$out/winograd3d_$variant.so.partial" "${tf_flags[@]}" \
      2> "$out/winograd3d_$variant.log"; then
    mv "$out/winograd3d_$variant.so.partial" "$out/winograd3d_$variant.so"
    rm -f "$out/winograd3d_$variant.log"
    built+=("$variant")
  else
    rm -f "$out/winograd3d_$variant.so.partial"
    error=$(grep -m1 -E 'error|Error' "$out/winograd3d_$variant.log")
    echo "$compiler could not compile the $variant kernels (${error:-see $out/winograd3d_$variant.log})" >> "$outcome"
  fi
done
case "${built[*]}" in
  "avx2 avx512") ;;
  avx2) echo "AVX-512 nodes will run the AVX2 kernels" >> "$outcome" ;;
  *) echo "no CPU kernels: $lost" >> "$outcome" ;;
esac
if [ -s "$outcome" ]; then
  tr '\n' ';' < "$outcome" | sed 's/;$//; s/;/; /g' > "$outcome.line"
  mv "$outcome.line" "$outcome"
  say "$(cat "$outcome")"
fi
echo "$key" > "$stamp"
