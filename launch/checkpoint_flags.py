"""``psrec train``'s checkpoint options: how often, how many are kept, the
best one, early stopping, and who writes the files."""

from __future__ import annotations

from psrec.launch.argtypes import non_negative
from psrec.launch.argtypes import positive

# psrec.ps_cluster.checkpoint_writers.WRITERS (not imported: it loads
# TensorFlow, and the CLI's parser must not).
WRITERS = ("auto", "tasks", "coordinator")


def add_checkpoint_flags(group) -> None:
    """Registers the checkpoint options on ``group``."""
    group.add_argument("--checkpoint-every", type=non_negative, default=200,
                       help="steps between checkpoints; 0: only at the end")
    group.add_argument("--keep-checkpoints", type=positive, default=3,
                       help="recent checkpoints kept (the best one is kept "
                       "besides them)")
    group.add_argument("--keep-best", choices=("auc", "logloss", "none"),
                       default="auc",
                       help="keep the checkpoint with the best eval metric "
                       "in checkpoints/best/ (recorded in "
                       "checkpoints/best.json); the final export is that "
                       "checkpoint")
    group.add_argument("--early-stop-patience", type=non_negative,
                       default=0,
                       help="stop after N evaluations in a row without "
                       "improvement of --keep-best's metric; 0: never")
    group.add_argument("--checkpoint-writers", choices=WRITERS,
                       default="auto",
                       help="--strategy ps: who writes checkpoint files "
                       "(and on restore reads and checks them). tasks: "
                       "every PS writes and reads its own shards, no table "
                       "passes through the coordinator; the checkpoint "
                       "folder must be on storage every task sees (NFS, GCS "
                       "fuse, a gs:// bucket every task can write): each PS "
                       "is proven to read and write it before training, "
                       "exit 2 naming the PS otherwise. coordinator: the "
                       "coordinator writes and reads every tensor (a folder "
                       "only it sees; about the whole training state in its "
                       "memory during a save). auto: tasks for a "
                       "local path when every task is on this host (the "
                       "local cluster), else coordinator")
