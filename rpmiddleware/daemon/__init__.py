"""
What C{twistd rpmiddleware} runs: the listener and everything behind it,
assembled as services (C{service}).
"""
