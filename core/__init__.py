"""rtrain.core: pure logic (launch spec, store protocol, failure records) and, as the
issues land, the worker-side API that training scripts call.

Importing this package must stay cheap: `rtrain --help` goes through it, so nothing
here imports torch at module level.
"""
