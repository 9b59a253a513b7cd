"""Serving: SavedModel exports of ranking and retrieval models, versioned
export folders, TF Serving warm-up requests, and batch scoring of files with
an export. The only part of ``models`` that reads or writes files.
"""
