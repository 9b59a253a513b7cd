"""``psrec spec infer``: a feature spec written from the data (column
statistics in one bounded-memory pass, time columns).
"""
