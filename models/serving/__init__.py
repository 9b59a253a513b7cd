"""Serving: SavedModel exports of ranking and retrieval models, versioned
export folders, TF Serving warm-up requests, batch scoring of files with
an export, and split exports (a dense SavedModel beside the tables as
Parquet for a key-value store) with their deltas. The only part of
``models`` that reads or writes files.
"""
