"""Feature transforms as TensorFlow ops, shared by conversion, training and
serving, and derived features computed from raw columns.
"""
