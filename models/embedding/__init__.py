"""``SparseArch``: the embedding tables of a feature spec (hashed or dynamic)
and their de-duplicated lookups, the bounded-memory table
initialisation, and the float16 / per-row int8 storage of tables in a
serving export, dequantized on lookup (``quantize``).
"""
