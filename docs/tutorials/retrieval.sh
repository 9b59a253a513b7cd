# MovieLens ratings -> a two-tower retrieval model (the ml-100k sample).
# Run from the clone's root; everything is written under runs/ml/.
# docs/tutorials/retrieval.md shows this file as it is, and
# tests/test_docs.py runs it.

# 1. the ratings -> Parquet; every rating is a (user, movie) pair, 20% held out
psrec ingest movielens ../shared/data/movielens-100k --out runs/ml/raw
psrec convert runs/ml/raw --spec movielens-retrieval --split hash --eval-fraction 0.2 --out runs/ml/retrieval

# 2. train on a local cluster (2 workers + 1 PS), the best checkpoint by MRR exported
psrec train --task retrieval --data runs/ml/retrieval --workdir runs/ml/run --batch-size 512

# 3. the export with plain TensorFlow: no psrec, no cluster
python - <<'PY'
import tensorflow as tf

top_k = tf.saved_model.load("runs/ml/run/export/1").signatures["serving_default"]
out = top_k(user_id=tf.constant([1, 2], tf.int64),
            age=tf.constant([24.0, 53.0]),
            gender=tf.constant(["M", "F"]),
            occupation=tf.constant(["technician", "other"]),
            zip=tf.constant(["85711", "94043"]))
print(out["candidate_ids"][:, :10].numpy())  # raw movie ids, best first
PY

# 4. the same exact metrics on one CPU (no cluster); another export version
psrec eval runs/ml/run/checkpoints --data runs/ml/retrieval
psrec export runs/ml/run/checkpoints --out runs/ml/export
