# A raw click log to scores (the Criteo sample: tab-separated, no header).
# Run from the clone's root; everything is written under runs/criteo/.
# README.md and docs/tutorials/criteo.md show this file as it is, and
# tests/test_docs.py runs it.

# 1. the raw log -> Parquet: name the columns, type the integer ones
COLS=label,$(seq -s, -f 'I%g' 1 13),$(seq -s, -f 'C%g' 1 26)
TYPES=label=int64,$(seq -s, -f 'I%g=int64' 1 13)
psrec ingest csv ../shared/data/criteo/criteo_combined_10390.txt --out runs/criteo/raw \
    --delimiter tab --no-header --columns "$COLS" --types "$TYPES"

# 2. a commented spec from one pass of statistics (review it, edit it)
psrec spec infer runs/criteo/raw --label label --out runs/criteo/spec.yaml

# 3. Parquet -> sharded TFRecords; the last 20% of rows are the eval split
psrec convert runs/criteo/raw --spec runs/criteo/spec.yaml --out runs/criteo/data \
    --shards 2 --eval-fraction 0.2

# 4. train on a local cluster of 1 worker + 1 PS, a short run; drop --workers,
#    --steps, --batch-size, --warmup-steps and --eval-every for the defaults
#    (2 workers, 1,024 rows a step, the length sized from the data)
psrec train --data runs/criteo/data --workdir runs/criteo/run --workers 1 --steps 40 \
    --batch-size 256 --warmup-steps 10 --eval-every 20

# 5. evaluate the best checkpoint, export it, score raw rows with the export
psrec eval runs/criteo/run/checkpoints --data runs/criteo/data
psrec export runs/criteo/run/checkpoints --out runs/criteo/model
psrec predict --model runs/criteo/model --data runs/criteo/raw --out runs/criteo/scores.parquet
