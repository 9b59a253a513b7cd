# MovieLens ratings -> a ranking model of "rating >= 4" (the ml-100k sample).
# Run from the clone's root; everything is written under runs/ml/.
# docs/tutorials/movielens.md shows this file as it is (tests/test_docs.py
# checks the copy and every command's flags).

# 1. the ratings joined with the movies and users -> Parquet
psrec ingest movielens ../shared/data/movielens-100k --out runs/ml/raw

# 2. a commented spec (label: rating >= 4; the timestamp becomes hour and weekday)
psrec spec infer runs/ml/raw --label rating --label-threshold 4 --out runs/ml/spec.yaml

# 3. the latest 20% of the ratings are the eval split
psrec convert runs/ml/raw --spec runs/ml/spec.yaml --out runs/ml/data --eval-fraction 0.2 --order-by timestamp

# 4. train with the defaults (2 workers + 1 PS, the length sized from the data)
psrec train --data runs/ml/data --workdir runs/ml/ranking

# 5. evaluate the best checkpoint, export it, score the ratings with the export
psrec eval runs/ml/ranking/checkpoints --data runs/ml/data
psrec export runs/ml/ranking/checkpoints --out runs/ml/model
psrec predict --model runs/ml/model --data runs/ml/raw --keep user_id,item_id,timestamp --out runs/ml/scores.parquet
