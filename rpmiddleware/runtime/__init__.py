"""
How the package runs inside CPython and the reactor: the finder that makes
C{rpmiddleware.builtin} importable in a checkout (C{sourcelayout}), the
garbage collector kept off the reactor's back (C{collector}), and work
spread over later reactor turns (C{reactorturn}).  Imports nothing else of
rpmiddleware: the package's face imports it first.
"""
