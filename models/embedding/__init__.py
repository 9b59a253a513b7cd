"""``SparseArch``: the embedding tables of a feature spec (hashed or dynamic)
and their de-duplicated lookups, and the bounded-memory table
initialisation.
"""
