"""
How the daemon runs inside CPython and the reactor: the garbage collector
kept off the reactor's back (C{collector}), and work spread over later
reactor turns (C{reactorturn}).  Imports nothing else of rpmiddleware.
"""
