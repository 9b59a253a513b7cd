"""The two-tower retrieval model, its configuration, the sampled-softmax loss
over the catalogue and streaming exact top-k.
"""
