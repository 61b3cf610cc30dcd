"""Flags: elastic training, which follows workers as they leave and join."""
from absl import flags

flags.DEFINE_bool("elastic", False,
                  "Run the train loop under Horovod Elastic: when a worker is "
                  "lost or added, the others go back to the last commit and "
                  "train on with the new number of processes (learning "
                  "rate, data shards and steps per epoch follow). Needs an "
                  "elastic launch: horovodrun --min-np --max-np "
                  "--host-discovery-script.")
flags.DEFINE_integer("commit_every_steps", 50,
                     "With --elastic: commit the training state to host "
                     "memory every this many steps, and at each epoch end. "
                     "A lost worker costs the steps since the last commit, "
                     "and an added worker joins at the next one; each "
                     "commit copies the weights and optimizer state.",
                     lower_bound=1)
