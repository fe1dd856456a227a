"""The calibration flow: statistics files, the scales derived from them, the recorders and the
commands that measure them.
"""
