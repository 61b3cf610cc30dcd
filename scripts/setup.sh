#!/usr/bin/env bash
# Idempotent set-up: a venv (.venv at the repository root, or VENV=) on
# Python 3.11, 3.12 or 3.13 (PYTHON=, default python3) with the pinned
# requirements, Horovod 0.28.1 compiled from its sdist with our patch
# (patches/) against that TensorFlow with Gloo (and MPI where Open MPI is
# installed), Debian's Fashion-MNIST, and an sshd for the simulated
# multi-host tests. DEVICE=gpu sets up a venv of its own for GPU nodes
# (.venv-gpu by default): TensorFlow's CUDA build (requirements-gpu.txt)
# and Horovod with NCCL (BUILD.md, "GPUs"). Every step is skipped when its
# result is already in place, so README's commands can run this every
# time at the cost of a second.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

say() { echo "[setup] $*" >&2; }

device=${DEVICE:-cpu}
case $device in
  cpu) default_venv=.venv ;;
  gpu) default_venv=.venv-gpu ;;
  *) say "DEVICE=$device is unknown: DEVICE=cpu (the default) or DEVICE=gpu"
     exit 2 ;;
esac
venv=$(realpath -m "${VENV:-$default_venv}")
py=$venv/bin/python
data_dir=/usr/share/datasets/fashion-mnist
horovod=horovod-0.28.1
# The sdist our patch is written against: the patch applies to these bytes.
horovod_sha256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
horovod_patch=$root/patches/$horovod.patch
# The pins: requirements.txt, or another file of them (REQUIREMENTS=; `make
# smoke-next-tensorflow` pins the next TensorFlow so).
requirements=$(realpath "${REQUIREMENTS:-requirements.txt}")

python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }

# The interpreter: PYTHON if given, else the venv's own once it exists,
# else python3. TensorFlow 2.21 publishes wheels for 3.10-3.13 and NumPy
# 2.4 for 3.11 and later (BUILD.md).
python=${PYTHON:-python3}
[ -z "${PYTHON:-}" ] && [ -x "$py" ] && python=$py
if ! version=$(python_version "$python"); then
  say "PYTHON=$python does not run here; name an interpreter of Python 3.11, 3.12 or 3.13 (PYTHON=python3.12)"
  exit 2
fi
case $version in
  3.11|3.12|3.13) ;;
  *) say "Python $version ($python) is not supported: TensorFlow 2.21 and NumPy 2.4 need 3.11, 3.12 or 3.13; pass one as PYTHON=python3.12"
     exit 2 ;;
esac
if [ -x "$py" ] && [ "$(python_version "$py")" != "$version" ]; then
  say "$venv has Python $(python_version "$py"), not $version ($python): remove it (rm -rf $venv) to rebuild it, or pass VENV=another/dir"
  exit 2
fi
# The GPU pins' TensorFlow is the CPU pins' release.
cpu_tensorflow=$(sed -n 's/^tensorflow-cpu==//p' "$requirements")
if [ "$device" = gpu ]; then
  gpu_tensorflow=$(sed -n 's/^tensorflow\[and-cuda\]==//p' "$root/requirements-gpu.txt")
  if [ "$cpu_tensorflow" != "$gpu_tensorflow" ]; then
    say "requirements-gpu.txt pins TensorFlow ${gpu_tensorflow:-nowhere}, $(realpath --relative-to="$root" "$requirements") ${cpu_tensorflow:-none}: pin the same release in both"
    exit 2
  fi
fi

# A venv is of one kind, which its TensorFlow says: the CPU set-up never
# touches a GPU venv, nor the GPU set-up a CPU one.
kind=
compgen -G "$venv/lib/python*/site-packages/tensorflow_cpu-*.dist-info" >/dev/null && kind=cpu
compgen -G "$venv/lib/python*/site-packages/nvidia/cuda_runtime" >/dev/null && kind=gpu
if [ -n "$kind" ] && [ "$kind" != "$device" ]; then
  say "$venv is a $kind venv (its TensorFlow's); DEVICE=$device sets up a venv of its own: leave VENV unset for $default_venv, or pass another VENV="
  exit 2
fi
if [ ! -x "$py" ]; then
  say "creating $venv with Python $version"
  "$python" -m venv "$venv"
fi

# The GPU pins: requirements.txt's with its tensorflow-cpu line replaced
# by requirements-gpu.txt, a file of the venv's.
if [ "$device" = gpu ]; then
  { grep -v '^tensorflow-cpu==' "$requirements"; cat "$root/requirements-gpu.txt"; } > "$venv/requirements-gpu.txt"
  requirements=$venv/requirements-gpu.txt
fi

stamp=$venv/.requirements.sha256
want=$(sha256sum < "$requirements" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing $(realpath --relative-to="$root" "$requirements")"
  "$py" -m pip install --quiet --upgrade "pip==24.3.1"
  "$py" -m pip install --quiet -r "$requirements"
  echo "$want" > "$stamp"
  rm -f "$venv/.horovod-built"   # a new TensorFlow needs a new Horovod build
fi

# The repository on the venv's path: scripts outside it (examples/, a
# user's own) import engine, models and flags with .venv/bin/python.
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
[ "$(cat "$site/horovod_engine.pth" 2>/dev/null)" = "$root" ] || echo "$root" > "$site/horovod_engine.pth"

# Open MPI (Debian's), for a Horovod with MPI beside Gloo: mpirun and srun
# launch it (scripts/slurm/train.sbatch), and Adasum needs it. SLURM and
# munge are for the tests that submit to a real SLURM
# (tests/simulated_slurm.py); installing them starts no daemon.
if ! command -v mpicxx >/dev/null || ! command -v slurmctld >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    say "installing Debian's Open MPI, SLURM and munge"
    apt-get update -qq >/dev/null || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin \
      libopenmpi-dev >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
  else
    say "no Open MPI: Horovod is built with Gloo alone (horovodrun only); for mpirun, srun and Adasum run: sudo apt-get install openmpi-bin libopenmpi-dev, then this again"
  fi
fi

# PostgreSQL's server (Debian's), for the test of sweeps on several hosts
# sharing one study (tests/simulated_postgres.py), which runs a cluster of
# its own. Installed without the "main" cluster Debian's postinst would
# create and start on port 5432: a postgresql-common drop-in says so for
# this installation only, and goes after it.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    say "installing Debian's PostgreSQL server, with no cluster (for the test of sweeps sharing a study)"
    apt-get update -qq >/dev/null || true
    createcluster_d=/etc/postgresql-common/createcluster.d
    made_createcluster_d=
    [ -d "$createcluster_d" ] || made_createcluster_d=yes
    mkdir -p "$createcluster_d"
    echo "create_main_cluster = false" > "$createcluster_d/horovod-engine-setup.conf"
    status=0
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends postgresql >/dev/null || status=$?
    rm -f "$createcluster_d/horovod-engine-setup.conf"
    [ -z "$made_createcluster_d" ] || rmdir "$createcluster_d" 2>/dev/null || true
    [ "$status" = 0 ] || exit "$status"
  else
    say "no PostgreSQL server: the test of sweeps sharing a study across hosts, which needs root, will be skipped"
  fi
fi

# Horovod is compiled once per machine, Python and set of pins: the wheel
# is kept under ~/.cache, named by the requirements' hash, our patch, the
# build's settings, the Python and the architecture, so a fresh clone (CI's)
# installs it in seconds. pip's own wheel cache cannot be used for it: its
# key is Horovod's version alone, so it would hand over a wheel built
# against another TensorFlow.
# With MPI where Open MPI is installed; Gloo always (BUILD.md says why both).
mpi=WITHOUT
command -v mpicxx >/dev/null && mpi=WITH
horovod_env="HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_${mpi}_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1"
# A GPU venv's Horovod has NCCL for GPU collectives, built on the venv's
# nvidia-nccl-cu12, its CUDA kernels compiled by a CUDA toolkit's nvcc of
# TensorFlow's CUDA major version: the package index has none (its
# nvidia-cuda-nvcc-cu12 holds ptxas alone), so the venv's, CUDA_HOME's or
# PATH's. NCCL=no builds it without GPU collectives: TensorFlow copies GPU
# tensors to host memory for Gloo's (or MPI's) allreduce.
nccl=no
nvcc_cuda=
if [ "$device" = gpu ]; then
  nccl=${NCCL:-yes}
  case $nccl in
    yes|no) ;;
    *) say "NCCL=$nccl is unknown: NCCL=yes (DEVICE=gpu's default) or NCCL=no"
       exit 2 ;;
  esac
fi
if [ "$nccl" = yes ]; then
  nvcc=
  for candidate in "$site/nvidia/cuda_nvcc/bin/nvcc" ${CUDA_HOME:+"$CUDA_HOME/bin/nvcc"} "$(command -v nvcc || true)"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then
      nvcc=$candidate
      break
    fi
  done
  if [ -z "$nvcc" ]; then
    say "DEVICE=gpu: no nvcc to compile Horovod's CUDA kernels: the venv's nvidia-cuda-nvcc-cu12 holds ptxas alone (as every CUDA 12 release of it on the package index), and neither CUDA_HOME nor PATH has one; load a CUDA 12 toolkit (module load cuda/12, or CUDA_HOME=/usr/local/cuda-12), or pass NCCL=no for a Horovod without GPU collectives"
    exit 2
  fi
  # TensorFlow's CUDA version, and the GPUs its build runs on, for which
  # Horovod's kernels are compiled (sm_60 to sm_89 native, sm_90's PTX for
  # any newer), not every one nvcc knows.
  read -r tf_cuda capabilities < <("$py" -c 'import engine, tensorflow as tf; info = tf.sysconfig.get_build_info(); print(info["cuda_version"], ",".join(c.split("_")[1] for c in info["cuda_compute_capabilities"]))')
  nvcc_cuda=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
  if [ "${nvcc_cuda%%.*}" != "${tf_cuda%%.*}" ]; then
    say "$nvcc is CUDA ${nvcc_cuda:-of no version it names}, and TensorFlow $cpu_tensorflow is built with CUDA $tf_cuda: Horovod's CUDA kernels need a CUDA ${tf_cuda%%.*} nvcc (CUDA_HOME=a CUDA ${tf_cuda%%.*} toolkit)"
    exit 2
  fi
  # NCCL as Horovod's build looks for it: include/ and lib/libnccl.so.
  nccl_home=$venv/lib/horovod-engine/nccl
  mkdir -p "$nccl_home/lib"
  ln -sfn "$site/nvidia/nccl/include" "$nccl_home/include"
  ln -sfn "$site/nvidia/nccl/lib/libnccl.so.2" "$nccl_home/lib/libnccl.so"
  horovod_env="$horovod_env HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME=$nccl_home HOROVOD_NCCL_LINK=SHARED HOROVOD_CUDA_HOME=$(dirname "$(dirname "$nvcc")") HOROVOD_BUILD_CUDA_CC_LIST=$capabilities LDFLAGS=-Wl,-rpath,$site/nvidia/nccl/lib"
elif [ "$device" = gpu ]; then
  say "NCCL=no: Horovod without GPU collectives; TensorFlow copies each GPU tensor to host memory for the allreduce"
fi
# (A GPU build's key names its device, NCCL and nvcc too.)
gpu_build=
[ "$device" = gpu ] && gpu_build=" gpu nccl=$nccl $nvcc_cuda"
key=$( (echo "$want $horovod_env $(uname -m) $version$gpu_build"; cat "$horovod_patch") | sha256sum | cut -c1-16)
wheels=${XDG_CACHE_HOME:-$HOME/.cache}/horovod-engine/$key
# The stamp names the wheel installed: new settings (Open MPI installed
# since, a new patch) build anew.
if [ "$(cat "$venv/.horovod-built" 2>/dev/null)" != "$wheels" ] || ! "$py" -c "import horovod.tensorflow" 2>/dev/null; then
  if ! ls "$wheels"/$horovod-*.whl >/dev/null 2>&1; then
    say "building $horovod from its sdist with patches/$horovod.patch, against TensorFlow with Gloo$([ $mpi = WITH ] && echo ' and MPI')$([ $nccl = yes ] && echo ", NCCL and CUDA $nvcc_cuda's nvcc") (2-3 minutes)"
    src=$(mktemp -d)
    trap 'rm -rf "$src"' EXIT
    "$py" -m pip download --quiet --no-deps --no-binary :all: --dest "$src" "${horovod/-/==}"
    if [ "$(sha256sum "$src/$horovod.tar.gz" | cut -d' ' -f1)" != "$horovod_sha256" ]; then
      say "the package index served a $horovod.tar.gz other than the one patches/$horovod.patch is written for (sha256 $horovod_sha256)"
      exit 1
    fi
    tar -xzf "$src/$horovod.tar.gz" -C "$src"
    if ! patch -d "$src/$horovod" -p1 --forward --batch < "$horovod_patch" > "$src/patch.log" 2>&1; then
      say "patches/$horovod.patch no longer applies to Horovod's sdist: $(grep -m1 -iE 'fail|malformed|reject' "$src/patch.log")"
      exit 1
    fi
    # cmake<4, setuptools and wheel come from requirements.txt;
    # --no-build-isolation makes the build see the venv's TensorFlow, whose
    # headers and ABI it compiles to.
    rm -rf "$wheels.partial"
    env PATH="$venv/bin:$PATH" $horovod_env MAKEFLAGS="-j$(nproc)" \
      "$py" -m pip wheel --quiet --no-deps --no-cache-dir --no-build-isolation \
      --wheel-dir "$wheels.partial" "$src/$horovod"
    rm -rf "$wheels"
    mv "$wheels.partial" "$wheels"
  else
    say "installing $horovod as built before against these pins ($wheels)"
  fi
  # Its requirements are pinned in requirements.txt, installed above. The
  # check imports the engine first, whose import of TensorFlow is quiet.
  "$py" -m pip install --quiet --no-deps --force-reinstall "$wheels"/$horovod-*.whl
  if ! "$py" -c "import engine, tensorflow as tf, horovod.tensorflow as hvd; hvd.init(); assert hvd.gloo_built() and hvd.mpi_built() == ('$mpi' == 'WITH') and bool(hvd.nccl_built()) == ('$nccl' == 'yes') and tf.test.is_built_with_cuda() == ('$device' == 'gpu')"; then
    rm -rf "$wheels"
    say "the horovod build does not load (its wheel is removed; run again to rebuild)"
    exit 1
  fi
  echo "$wheels" > "$venv/.horovod-built"
fi

# Our CPU kernels for CosmoFlow's convolutions (models/winograd3d.py),
# compiled into the venv against its TensorFlow for every x86-64 node
# (AVX2, AVX-512). scripts/build_kernels.sh never fails: without them
# CosmoFlow trains at TensorFlow's speed, and set-up goes on.
bash scripts/build_kernels.sh "$py" "$venv/lib/horovod-engine"

if [ ! -e "$data_dir/train-images-idx3-ubyte.gz" ]; then
  if [ "$(id -u)" = 0 ]; then
    say "installing Debian's dataset-fashion-mnist"
    apt-get update -qq >/dev/null || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
  else
    say "Fashion-MNIST is missing from $data_dir; run: sudo apt-get install dataset-fashion-mnist"
    say "(or pass --data_dir to a directory holding the four idx .gz files)"
  fi
fi
# tests/simulated_hosts.py runs an sshd per simulated host. Debian's
# openssh-server is unpacked into the venv rather than installed: installing
# it would add a system user and start a system-wide sshd on port 22.
openssh=$venv/openssh
if [ ! -x "$openssh/usr/sbin/sshd" ]; then
  if [ "$(id -u)" = 0 ]; then
    say "unpacking Debian's openssh-server into $openssh (for the multi-host tests)"
    apt-get update -qq >/dev/null || true
    # The ssh client, ip, and the one library sshd needs that a base system lacks.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-client iproute2 libwrap0 >/dev/null
    download=$(mktemp -d)
    (cd "$download" && apt-get download -qq openssh-server 2>/dev/null)
    dpkg -x "$download"/openssh-server_*.deb "$openssh"
    rm -rf "$download"
  else
    say "no sshd for the multi-host tests, which need root: they will be skipped"
  fi
fi
say "ready: $venv"
