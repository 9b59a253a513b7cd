"""Dynamic, collisionless embedding tables: ids admitted to rows, their shards
and the per-shard maintenance ops.
"""
