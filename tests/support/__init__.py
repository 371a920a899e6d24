"""
What tests share: helpers, fakes and rigs, one module for each thing they
hold.  Test modules (C{tests/test_*.py}) import helpers only from here, never
from one another (C{tests/test_support_imports.py} checks it).

The child-process programs C{tests/idle_daemon.py} and
C{tests/console_browser.py} stay beside the tests that run them: they are
programs (C{python -m tests.idle_daemon}), not helpers.
"""
