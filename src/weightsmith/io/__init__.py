"""A checkpoint folder as weightsmith reads and writes it: its files, tensor names, the output folder
and the manifest.
"""
