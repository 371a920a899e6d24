"""
The core: the wiring and the Python API (C{middleware}), the plugin chain
(C{chain}), the game end (C{router}, C{replystream}), ordering
(C{inorder}), loading plugins (C{discovery}), and the narrow view of it all
that the outer layers are given (C{view}).
"""
