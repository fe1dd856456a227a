"""Process plumbing every command shares: errors and how they print, the terminal, signals, files
opened as a stranger's.
"""
