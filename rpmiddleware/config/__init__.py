"""
The daemon's settings: defaults, the TOML file, and the checks that refuse
a bad one early (C{settings}).
"""
