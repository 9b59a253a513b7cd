"""The one composable ranking model and its configuration (``ModelConfig``,
the four presets).
"""
