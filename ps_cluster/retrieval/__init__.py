"""The retrieval task on the one trainer: the two-tower trainer, exact
evaluation against the catalogue and its metrics.
"""
