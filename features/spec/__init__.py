"""The feature spec and its parts: label, dense and categorical features,
tables and their layout, dynamic-table settings, two-tower towers and the
named presets. Plain Python.
"""
