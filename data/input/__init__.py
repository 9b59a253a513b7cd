"""Input functions of training and evaluation, the sharding audit, and the
integrity checks run before training starts.
"""
