"""
Test doubles for rpmiddleware: an RPEngine simulator for tests, benchmarks,
demos and third-party plugin authors (see L{rpmiddleware.testing.simulator}).
"""
