"""Raw logs -> Parquet: Criteo, MovieLens, delimited text, JSON lines,
libFM/libSVM, and seeded synthetic data for any spec.
"""
