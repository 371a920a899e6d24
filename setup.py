# The metadata lives in setup.cfg; this shim only keeps older tools working.
from setuptools import setup

setup()
