# The Criteo walkthrough, end to end: docs/tutorials/criteo.md includes this
# file verbatim and tests/test_docs.py runs it. Run it from an empty folder;
# CRITEO is the folder holding the sample (from a clone: ../shared/data/criteo).
set -euo pipefail
CRITEO=${CRITEO:-../shared/data/criteo}

# 1. the raw log -> Parquet: name the columns, type the integer ones
COLS=label,$(seq -s, -f 'I%g' 1 13),$(seq -s, -f 'C%g' 1 26)
TYPES=label=int64,$(seq -s, -f 'I%g=int64' 1 13)
psrec ingest csv "$CRITEO/criteo_combined_10390.txt" --out raw --no-progress \
    --delimiter tab --no-header --columns "$COLS" --types "$TYPES"

# 2. a commented spec from one pass of statistics (review it, edit it)
psrec spec infer raw --label label --out spec.yaml --no-progress

# 3. Parquet -> sharded TFRecords; the last 20% of rows are the eval split
psrec convert raw --spec spec.yaml --out data --shards 2 --eval-fraction 0.2

# 4. train on a local cluster of 1 worker + 1 PS, a short run; drop --workers,
#    --steps, --batch-size, --warmup-steps and --eval-every for the defaults
#    (2 workers, 1,024 rows a step, the length sized from the data)
psrec train --data data --workdir runs/dcn --workers 1 --steps 40 \
    --batch-size 256 --warmup-steps 10 --eval-every 20

# 5. evaluate the best checkpoint, export it, score raw rows with the export
psrec eval runs/dcn/checkpoints --data data
psrec export runs/dcn/checkpoints --out model
psrec predict --model model --data raw --out scores.parquet
