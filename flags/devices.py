"""Flags: how each process uses the host's cores (CPU only)."""
from absl import flags

flags.DEFINE_integer("intra_op_threads", 0,
                     "Threads per process for one op's kernels. 0: the "
                     "process's share of the cores (cores / processes on the "
                     "host).", lower_bound=0)
flags.DEFINE_integer("inter_op_threads", 0,
                     "Threads per process running independent ops side by "
                     "side. 0: 1.", lower_bound=0)
flags.DEFINE_bool("bind_cpus", True,
                  "Bind each process to its own slice of the host's cores "
                  "(as mpirun --bind-to core). Turn off when the launcher "
                  "already binds processes to distinct cores.")
flags.DEFINE_bool("idle_horovod_threads", True,
                  "Run Horovod's own threads (its background loop, Gloo's "
                  "transport) at Linux's idle priority on CPU, so that they "
                  "take a core while the step waits for the allreduce, not "
                  "from its kernels (2 processes on 2 cores: steps "
                  "0.80-0.98x as long, BUILD.md). Off: normal priority, "
                  "Horovod's default.")
flags.DEFINE_bool("deterministic", False,
                  "Deterministic ops (tf.config.experimental."
                  "enable_op_determinism): reruns and resumed runs give the "
                  "same weights as uninterrupted ones, to float tolerance. "
                  "Slower on GPUs; no step report (--profile_steps), and "
                  "the input's wait is counted in step_seconds: op "
                  "determinism refuses tf.timestamp.")
